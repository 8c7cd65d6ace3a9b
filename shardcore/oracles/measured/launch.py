"""Running the evaluator's workers under ``torchrun``: one rank per device on every host.

    torchrun --nnodes 2 --nproc-per-node 8 --node-rank K --master-addr HOST0 --master-port 29500 \\
        eval.py --launcher torchrun --alg random,lookup_greedy --task-path ... --data-dir ...

Every rank runs the same command. **Rank 0 is the driver**: it plans, sends shards and collects the
costs, and starts one local worker process for its own device as the default ``spawn`` launcher
does. **Every other rank serves**: it measures what the driver asks on its own device (the GPU of
its ``LOCAL_RANK``, or a logical CPU device) and takes part in the all-to-alls, which therefore run
across hosts as they really would. The ranks find each other through torchrun's rendezvous store
(``MASTER_ADDR:MASTER_PORT``, which the ranks of torchrun share); the measurement process group
(NCCL on GPUs, gloo on CPUs) is formed on that store too.

**Control channel.** The driver listens on one TCP port (``SHARDKIT_CONTROL_PORT``, default
``MASTER_PORT + 1``) on every interface. A serving rank connects, both sides prove they know a random
key that rank 0 put in the rendezvous store (HMAC challenge, as ``multiprocessing.connection``), and
the messages are **JSON**, never pickles, so nothing that reaches the port can run code. The key is
only as private as the rendezvous store: the same trust boundary as ``torch.distributed`` itself.

**Failures.** A rank that dies closes its connection; a host that stops answering runs into the
driver's per-phase deadline. Either ends the run with one line naming the rank and its host, and the
driver closes every connection, upon which the other serving ranks exit (a rank stuck in a
collective with the dead one gives up at the process group's timeout). torchrun's agents then end.
The dataset directory must be readable at the same path on every host.
"""

from __future__ import annotations

import datetime
import json
import os
import secrets
import socket
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

from shardcore.errors import ShardError
from shardcore.processes import preloaded_context, run_then_exit
from shardcore.tables import TableConfig

CONTROL_KEY = "shardkit/control"
PG_PREFIX = "shardkit/pg"


@dataclass(frozen=True)
class RankEnv:
    """What torchrun tells a process about itself."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    group_rank: int          # the host (node) index
    master_addr: str
    master_port: int

    @property
    def control_port(self) -> int:
        return int(os.environ.get("SHARDKIT_CONTROL_PORT", self.master_port + 1))


def rank_env() -> RankEnv:
    """The torchrun environment of this process; one line when it is not run by torchrun."""
    need = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    missing = [k for k in need if k not in os.environ]
    if missing:
        raise ShardError(f"--launcher torchrun: {', '.join(missing)} not set; start the command with torchrun "
                         "(e.g. torchrun --nnodes 2 --nproc-per-node 8 ... eval.py --launcher torchrun ...)")
    try:
        return RankEnv(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"]),
                       int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"])),
                       int(os.environ.get("GROUP_RANK", "0")), os.environ["MASTER_ADDR"],
                       int(os.environ["MASTER_PORT"]))
    except ValueError as exc:
        raise ShardError(f"--launcher torchrun: malformed torchrun environment ({exc})") from None


def rendezvous_store(env: RankEnv, timeout_s: float):
    """A client of torchrun's rendezvous store (the agent's TCPStore at MASTER_ADDR:MASTER_PORT)."""
    import datetime

    import torch.distributed as dist

    return dist.TCPStore(env.master_addr, env.master_port, None, False, datetime.timedelta(seconds=timeout_s))


# ---------------------------------------------------------------------------------------------
# JSON messages
# ---------------------------------------------------------------------------------------------
def _encode(obj):
    if isinstance(obj, TableConfig):
        return {"__table__": [obj.index, obj.row, obj.dim, obj.pooling_factor, list(obj.bins)]}
    if isinstance(obj, (list, tuple)):
        return [_encode(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): _encode(v) for k, v in obj.items()}
    return obj


def _decode(obj):
    if isinstance(obj, list):
        return [_decode(x) for x in obj]
    if isinstance(obj, dict):
        if set(obj) == {"__table__"}:
            i, r, d, pf, bins = obj["__table__"]
            return TableConfig(int(i), int(r), int(d), float(pf), tuple(float(b) for b in bins))
        return {k: _decode(v) for k, v in obj.items()}
    return obj


class JsonConnection:
    """``send``/``recv``/``poll``/``fileno`` like a pipe end, over a socket, in JSON (no pickles)."""

    def __init__(self, conn: Connection):
        self._conn = conn

    def send(self, obj) -> None:
        self._conn.send_bytes(json.dumps(_encode(obj)).encode("utf-8"))

    def recv(self):
        data = self._conn.recv_bytes()
        try:
            return _decode(json.loads(data.decode("utf-8")))
        except (UnicodeDecodeError, json.JSONDecodeError, ValueError, TypeError) as exc:
            raise EOFError(f"malformed control message ({type(exc).__name__})") from None

    def poll(self, timeout: float = 0.0) -> bool:
        return self._conn.poll(timeout)

    def fileno(self) -> int:
        return self._conn.fileno()

    def close(self) -> None:
        try:
            self._conn.close()
        except OSError:
            pass


def _recv_timeout(sock: socket.socket, seconds: float) -> None:
    """A kernel receive timeout on a blocking socket (0: none), so that reads through a
    ``Connection`` on its descriptor give up instead of hanging."""
    import struct

    sec = int(seconds)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", sec, int((seconds - sec) * 1e6)))


def _handshake(conn: Connection, key: bytes, server: bool) -> None:
    if server:
        deliver_challenge(conn, key)
        answer_challenge(conn, key)
    else:
        answer_challenge(conn, key)
        deliver_challenge(conn, key)


# ---------------------------------------------------------------------------------------------
# Driver side (rank 0)
# ---------------------------------------------------------------------------------------------
class RemoteRank:
    """Stands in for a worker process that another torchrun rank runs (maybe on another host)."""

    sentinel = None
    pid = None
    exitcode = None

    def __init__(self, rank: int, host: str, local_rank: int, conn: JsonConnection, group_rank: int = 0):
        self.rank, self.host, self.local_rank, self.conn = rank, host, local_rank, conn
        self.group_rank = group_rank   # its torchrun node (GROUP_RANK): which ranks share a host
        self.closed = False

    def is_alive(self) -> bool:
        return not self.closed

    def kill(self) -> None:
        self.closed = True
        self.conn.close()

    def join(self, timeout: float | None = None) -> None:
        pass

    def label(self) -> str:
        return f"rank {self.rank} on host {self.host}"


def accept_ranks(env: RankEnv, timeout_s: float) -> tuple[list[RemoteRank], str]:
    """Rank 0: publish the control address and key, accept ranks 1..world-1 (each proves the key and
    says who it is). Returns them ordered by rank, and rank 0's own host name."""
    key = secrets.token_bytes(32)
    try:
        server = socket.create_server(("", env.control_port))
    except OSError as exc:
        raise ShardError(f"--launcher torchrun: cannot listen on control port {env.control_port} ({exc.strerror}); "
                         "choose a free one with SHARDKIT_CONTROL_PORT on every host") from None
    server.settimeout(1.0)
    host = socket.gethostname()
    store = rendezvous_store(env, timeout_s)
    store.set(CONTROL_KEY, json.dumps({"host": env.master_addr, "port": env.control_port, "key": key.hex()}))
    ranks: dict[int, RemoteRank] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(ranks) < env.world_size - 1:
            if time.monotonic() > deadline:
                missing = sorted(set(range(1, env.world_size)) - set(ranks))
                raise ShardError(f"--launcher torchrun: rank(s) {', '.join(map(str, missing))} did not connect "
                                 f"within {timeout_s:g} s (is every host running the same command?)")
            try:
                sock, addr = server.accept()
            except socket.timeout:
                continue
            sock.setblocking(True)
            _recv_timeout(sock, 10.0)   # a peer that connects and says nothing cannot hold us up
            fd = sock.detach()
            conn = Connection(fd)
            try:
                _handshake(conn, key, server=True)
                hello = JsonConnection(conn).recv()
            except Exception:   # a stranger, a wrong key or a broken hello: not one of ours
                conn.close()
                continue
            with socket.socket(fileno=os.dup(fd)) as again:
                _recv_timeout(again, 0.0)   # from now on the evaluator's deadlines bound every wait
            if not (isinstance(hello, list) and len(hello) == 5 and hello[0] == "hello"):
                conn.close()
                continue
            r, peer_host, local_rank, group_rank = int(hello[1]), str(hello[2]), int(hello[3]), int(hello[4])
            if not 0 < r < env.world_size or r in ranks:
                conn.close()
                continue
            ranks[r] = RemoteRank(r, peer_host, local_rank, JsonConnection(conn), group_rank)
    except BaseException:
        for rr in ranks.values():
            rr.kill()
        raise
    finally:
        server.close()
    return [ranks[r] for r in sorted(ranks)], host


# ---------------------------------------------------------------------------------------------
# Serving side (ranks 1..world-1)
# ---------------------------------------------------------------------------------------------
def serve(timeout_s: float = 300.0) -> int:
    """Ranks other than 0: connect to the driver, then measure what it asks until it says exit or
    goes away. Returns the process exit status (0 after an orderly exit)."""
    from shardcore.oracles.measured.worker import serve_remote

    env = rank_env()
    try:
        store = rendezvous_store(env, timeout_s)
        store.wait([CONTROL_KEY], datetime.timedelta(seconds=timeout_s))
        info = json.loads(store.get(CONTROL_KEY).decode("utf-8"))
        key = bytes.fromhex(info["key"])
    except Exception as exc:   # the store went away with rank 0's host, or never said where to connect
        raise ShardError(f"rank {env.rank} on host {socket.gethostname()}: no driver to serve "
                         f"({type(exc).__name__}: {str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ''})"
                         ) from None
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            sock = socket.create_connection((info["host"], int(info["port"])), timeout=10.0)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise ShardError(f"rank {env.rank}: cannot reach the driver at {info['host']}:{info['port']}") from None
            time.sleep(0.2)
    sock.settimeout(None)
    conn = Connection(sock.detach())
    _handshake(conn, key, server=False)
    jc = JsonConnection(conn)
    jc.send(["hello", env.rank, socket.gethostname(), env.local_rank, env.group_rank])
    return serve_remote(env, jc)



def free_port() -> int:
    """A TCP port free on the loopback interface now (for a local rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RANK_PRELOAD = ("torch", "torch.distributed", "fbgemm_gpu", "torchrec", "shardcore.oracles.measured.launch")


def rank_context():
    """The multiprocessing context of :func:`spawn_ranks`' CPU ranks: forked by a forkserver that imported
    torch, FBGEMM and TorchRec once (:data:`RANK_PRELOAD`; 3-5 s of CPU per rank otherwise), spawned
    where there is no forkserver. Their target goes through :func:`run_then_exit`."""
    return preloaded_context(RANK_PRELOAD)


def spawn_ranks(target, world: int, *args, timeout_s: float = 300.0) -> dict:
    """Run ``target(rank, world, port, *args, queue)`` in ``world`` processes on this machine (a gloo
    rendezvous on ``port``; :func:`rank_context`); each puts one ``(rank, result)`` on ``queue``. Returns
    ``{rank: result}``; processes still alive a minute after their results came are killed."""
    ctx = rank_context()
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=run_then_exit, args=(target, r, world, port, *args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        return dict(queue.get(timeout=timeout_s) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
