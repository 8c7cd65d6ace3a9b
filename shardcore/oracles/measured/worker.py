"""The measured oracle's worker process: one per device, started by the driver
(:mod:`shardcore.oracles.measured.driver`, whose module notes describe the protocol and the
isolation on the CPU), or on another host by :mod:`shardcore.oracles.measured.launch` (``serve_remote``).
A worker loads the dataset once, builds its shards' operators (:mod:`shardcore.oracles.measured.benchmark`),
answers compute requests over its pipe and joins the timed all-to-alls of a plan's exchange."""

from __future__ import annotations

import datetime
import os
import signal
import statistics
import time
from dataclasses import dataclass
from typing import Sequence

from shardcore.errors import ShardError
from shardcore.processes import end_forkserver, preloaded_context, set_parent_death_signal
from shardcore.oracles.commmodel import CommModel, batch_slices, comm_splits
from shardcore.tables import TableConfig

CPU_QUANTILE = 0.25        # CPU: the quantile of a measurement's samples kept (GPU: the median)


# --------------------------------------------------------------------------------------------
# Worker side
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkerConfig:
    dataset_dir: str
    device_type: str
    device_ids: tuple[int, ...]
    store_port: int
    pg_timeout_s: float
    parent_pid: int | None     # None: a torchrun rank (its parent is torchrun's agent)
    pool_cap_bytes: int
    store_host: str = "127.0.0.1"
    store_prefix: str | None = None
    forked: bool = False       # forked by the forkserver of worker_context: its parent is the server, not the driver


# what a CPU worker imports, done once in the forkserver that forks the workers (worker_context)
PRELOAD = ("torch", "torch.distributed", "fbgemm_gpu", "shardcore.oracles.measured.benchmark",
           "shardcore.dataset", "shardcore.plan", "shardcore.oracles.measured.worker",
           "shardcore.oracles.measured.launch")


def worker_context(device_type: str):
    """The multiprocessing context the workers of ``device_type`` start in. CPU workers are forked by
    a forkserver that has imported torch and FBGEMM once (:data:`PRELOAD`), instead of each spending
    ~3 s of CPU on those imports; CUDA workers are spawned, so that nothing touching CUDA is forked.
    A forked worker lets go of the server's "alive" descriptor first
    (:func:`~shardcore.processes.run_then_exit`), so the server exits with the driver and
    the worker, whose parent it is, with the server."""
    import multiprocessing as mp

    return preloaded_context(PRELOAD) if device_type == "cpu" else mp.get_context("spawn")


def prestart_forkserver() -> bool:
    """Boot the CPU workers' forkserver now, without waiting for it: its imports (:data:`PRELOAD`, ~3 s of
    CPU) then run beside the caller's own set-up, and the evaluator's workers are forked from it later.
    At exit the server is ended at once (:func:`~shardcore.processes.end_forkserver`): a script that
    stops on a bad input before it measures does not leave it importing, holding the script's stdout
    and stderr. False, and nothing started, where a GPU is present (CUDA workers are spawned) or there
    is no forkserver."""
    if os.path.exists("/dev/nvidiactl"):
        return False
    ctx = worker_context("cpu")
    if ctx.get_start_method() != "forkserver":
        return False
    import atexit
    from multiprocessing import forkserver

    forkserver.ensure_running()
    atexit.unregister(end_forkserver)
    atexit.register(end_forkserver)
    return True


def _driver_gone(cfg: WorkerConfig) -> bool:
    """Whether the driver died before this worker asked to die with its parent: a spawned worker's
    parent is the driver; a forked one's is the forkserver, so it asks after the driver itself."""
    if cfg.parent_pid is None:
        return False
    if not cfg.forked:
        return os.getppid() != cfg.parent_pid
    try:
        os.kill(cfg.parent_pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return os.getppid() == 1


def _error_reply(req, exc: BaseException, phase: str):
    from shardcore.errors import ShardError as _SE

    if isinstance(exc, _SE):
        return ("error", req, "user", str(exc))
    name = type(exc).__name__
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if "out of memory" in str(exc).lower() or isinstance(exc, MemoryError):
        return ("error", req, "oom", f"{phase} ran out of memory ({name}: {msg})")
    return ("error", req, "crash", f"{phase} failed ({name}: {msg})")


def worker_main(rank: int, world: int, conn, cfg: WorkerConfig) -> None:
    set_parent_death_signal()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    if _driver_gone(cfg):
        return
    try:
        import torch
        import torch.distributed as dist

        from shardcore.oracles.measured.benchmark import BufferPool, ReferenceRunner, ShardRunner, build_operator
        from shardcore.dataset import load_dataset
        from shardcore.plan import piece_key

        if cfg.device_type == "cuda":
            device = torch.device("cuda", cfg.device_ids[rank])
            torch.cuda.set_device(device)
            device_name = torch.cuda.get_device_name(device)
            backend = "nccl"
        else:
            device = torch.device("cpu")
            torch.set_num_threads(1)
            steady_heap()
            device_name = None
            backend = "gloo"
        pool = BufferPool(cfg.pool_cap_bytes) if cfg.device_type == "cpu" else None
        dataset = load_dataset(cfg.dataset_dir)
        timeout = datetime.timedelta(seconds=cfg.pg_timeout_s)
        store = dist.TCPStore(cfg.store_host, cfg.store_port, None, False, timeout)
        if cfg.store_prefix:
            store = dist.PrefixStore(cfg.store_prefix, store)
        if backend == "nccl":
            try:
                dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout,
                                        device_id=device)
            except TypeError:  # a torch without the device_id argument
                dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        else:
            dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        # Warm up fbgemm (first-call initialisation) and the collectives.
        tiny = build_operator([TableConfig(0, 8, 8, 1.0)], device=device)
        out = tiny(torch.zeros(4, dtype=torch.int64, device=device),
                   torch.arange(5, dtype=torch.int64, device=device))
        out.backward(torch.ones_like(out))
        del tiny, out
        _comm(rank, world, [4] * world, 8 * world, 1, 1, None, device)
        conn.send(("ready", os.getpid(), device_name))
    except BaseException as exc:  # report and quit: the parent raises a clear error
        try:
            conn.send(("error", None, "start", _start_error(exc)))
        except Exception:
            pass
        return

    current = None  # (shard key, ShardRunner) kept between passes over the same shard
    ref = None      # (key, ReferenceRunner): the reference shard, kept for the worker's life

    def reference(batch_size, optimizer, precision, warmup):
        """This worker's reference shard for the setting (built and warmed up the first time)."""
        nonlocal ref
        rkey = (batch_size, optimizer, precision)
        if ref is None or ref[0] != rkey:
            ref = (rkey, ReferenceRunner(batch_size, optimizer=optimizer, precision=precision, device=device))
            ref[1].sample(max(2, warmup), 1)
        return ref[1]

    def release():
        nonlocal current
        if current is not None:
            current[1].close()
            current = None
            if device.type == "cuda":
                torch.cuda.empty_cache()

    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            break
        kind, req = msg[0], msg[1]
        if kind == "exit":
            break
        try:
            if kind == "compute":
                tables, batch_size, optimizer, precision, warmup, rewarm, iters, usable, keep = msg[2:11]
                paired = bool(msg[11]) if len(msg) > 11 else False   # CPU: reference blocks around the shard's
                key = (tuple(piece_key(t) for t in tables), batch_size, optimizer, precision)
                t0 = time.perf_counter()
                if current is None or current[0] != key:  # a new operator: full warm-up
                    release()
                    current = (key, ShardRunner(dataset, tables, batch_size=batch_size, optimizer=optimizer,
                                                precision=precision, device=device, usable_bytes=usable,
                                                pool=pool))
                else:  # the operator kept from the previous pass
                    warmup = rewarm
                runner = current[1]
                t1 = time.perf_counter()
                refs = None
                try:
                    if paired:
                        fw, bw, refs = runner.sample_blocked(reference(batch_size, optimizer, precision, warmup),
                                                             warmup, iters)
                    else:
                        fw, bw = runner.sample(warmup, iters)
                    lookups = getattr(runner, "num_lookups", 0)
                finally:
                    t2 = time.perf_counter()
                    if not keep:
                        release()
                conn.send(("ok", req, {"fw": fw, "bw": bw, "ref": refs, "num_lookups": lookups, "build_s": t1 - t0,
                                       "measure_s": t2 - t1, "free_s": time.perf_counter() - t2}))
            elif kind == "comm":
                release()
                dim_sums, batch_size, warmup, iters, delays_ms = msg[2:7]
                extra = msg[7] if len(msg) > 7 else None
                conn.send(("ok", req, _comm(rank, world, dim_sums, batch_size, warmup, iters, delays_ms,
                                            device, extra)))
            elif kind == "ref":
                batch_size, optimizer, precision, warmup, iters = msg[2:7]
                fw, bw = reference(batch_size, optimizer, precision, warmup).sample(1, iters)
                # (one untimed iteration first: caches warm as in calibration)
                conn.send(("ok", req, {"fw": fw, "bw": bw}))
            elif kind == "release":
                release()
                conn.send(("ok", req, None))
            elif kind == "ping":
                conn.send(("ok", req, os.getpid()))
            else:
                conn.send(("error", req, "crash", f"unknown request {kind!r}"))
        except BaseException as exc:
            try:
                release()
            except Exception:
                pass
            try:
                conn.send(_error_reply(req, exc, kind))
            except Exception:
                break
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass


def steady_heap() -> bool:
    """Make this process's C heap keep what it frees (glibc: no ``mmap`` for large blocks, no trimming),
    so that the operators' per-iteration work buffers land on pages committed already.

    Why: FBGEMM's CPU backward allocates and frees tens of MB of work buffers every iteration.
    Whether glibc serves them from pages it still holds or maps fresh ones (and the kernel commits,
    zeroes and counts them as minor faults, ~4,000 a backward for an 8-table shard) depended on the
    heap's state when the shard was built: the same shard measured 10-15% apart between builds (2-core
    EPYC VM). With the heap kept, the faults are 0 in steady state. Returns whether the
    setting was applied (False where the C library has no ``mallopt``)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # pragma: no cover  (not glibc)
        return False
    m_trim_threshold, m_mmap_max = -1, -4
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2**31 - 1))


def low_quantile(values: Sequence[float], q: float | None = None) -> float:
    """The ``q`` quantile (default :data:`CPU_QUANTILE`, the lower quartile) of ``values``, linear
    between order statistics. On a shared CPU the slow samples are the disturbed ones (another
    tenant's memory traffic, a migration), the fast ones the shard's own cost: a low quantile repeats
    itself where the median follows the disturbance, and unlike the minimum it is not one lucky sample."""
    xs = sorted(float(v) for v in values)
    if not xs:
        raise ShardError("no samples")
    pos = (len(xs) - 1) * (CPU_QUANTILE if q is None else q)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def relative_iqr(values: Sequence[float]) -> float:
    """(q75 - q25) / median of ``values`` (0 for fewer than two values or a zero median)."""
    if len(values) < 2:
        return 0.0
    qs = statistics.quantiles(values, n=4, method="inclusive")
    med = statistics.median(values)
    return float((qs[2] - qs[0]) / med) if med > 0 else 0.0


def serve_remote(env, conn) -> int:
    """A torchrun rank other than 0 (see :mod:`shardcore.oracles.measured.launch`): take the driver's configuration,
    then serve as worker ``env.rank`` until the driver says exit or goes away."""
    try:
        msg = conn.recv()
    except (EOFError, OSError):
        return 1
    if not (isinstance(msg, list) and len(msg) == 2 and msg[0] == "config" and isinstance(msg[1], dict)):
        return 1
    c = msg[1]
    cfg = WorkerConfig(str(c["dataset_dir"]), str(c["device_type"]), tuple(int(d) for d in c["device_ids"]),
                        int(c["store_port"]), float(c["pg_timeout_s"]), None, int(c["pool_cap_bytes"]),
                        str(c["store_host"]), str(c["store_prefix"]))
    worker_main(env.rank, env.world_size, conn, cfg)
    return 0


def _start_error(exc: BaseException) -> str:
    from shardcore.errors import ShardError as _SE

    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return text if isinstance(exc, _SE) else f"{type(exc).__name__}: {text}"


def _comm(rank, world, dim_sums, batch_size, warmup, iters, delays_ms, device, extra=None) -> dict:
    """Time the forward and backward exchanges of this rank (medians in ms).

    Forward: the input distribution (``extra["ids_send"]``, an int64 all-to-all of every
    model-parallel table's ids; absent when not given), then the all-to-all of pooled outputs, then the local sum of row-wise
    partials (``extra["rw_sums"]``). Backward: the reverse all-to-all, then the all-reduce of the
    data-parallel tables' gradients (``extra["allreduce"]`` elements per rank, in
    ``extra["allreduce_dtype"]``). See :mod:`shardcore.oracles.measured.shardings`."""
    import torch
    import torch.distributed as dist

    splits = comm_splits(dim_sums, batch_size, rank)
    info = {"fw_send": list(splits.fw_send), "fw_recv": list(splits.fw_recv),
            "bw_send": list(splits.bw_send), "bw_recv": list(splits.bw_recv)}
    extra = extra or {}
    ids_send = extra.get("ids_send") or []
    ids_out = [int(ids_send[rank][s]) for s in range(world)] if ids_send else []
    ids_in = [int(ids_send[j][rank]) for j in range(world)] if ids_send else []
    info.update(ids_send=ids_out, ids_recv=ids_in)     # the input-id all-to-all's split sizes (int64)
    ar_numel = int((extra.get("allreduce") or [0] * world)[rank])
    any_ids = bool(ids_send) and any(any(int(x) for x in row) for row in ids_send)
    any_ar = any(int(x) for x in (extra.get("allreduce") or []))
    if sum(dim_sums) == 0 and not any_ids and not any_ar:  # nothing to exchange anywhere (every rank)
        info.update(fw_ms=0.0, bw_ms=0.0)
        return info
    send_fw = torch.zeros(sum(splits.fw_send), dtype=torch.float32, device=device)
    recv_fw = torch.empty(sum(splits.fw_recv), dtype=torch.float32, device=device)
    send_bw = torch.zeros(sum(splits.bw_send), dtype=torch.float32, device=device)
    recv_bw = torch.empty(sum(splits.bw_recv), dtype=torch.float32, device=device)
    ids_tx = torch.zeros(sum(ids_out), dtype=torch.int64, device=device) if any_ids else None
    ids_rx = torch.empty(sum(ids_in), dtype=torch.int64, device=device) if any_ids else None
    ar_dtype = getattr(torch, str(extra.get("allreduce_dtype", "float32")))
    grad_ar = torch.zeros(ar_numel, dtype=ar_dtype, device=device) if any_ar else None
    # row-wise partial sums: per table, (source, column offset, dim) of its partials in recv_fw
    b_self = batch_slices(batch_size, world)[rank]
    starts = [0]
    for s in splits.fw_recv:
        starts.append(starts[-1] + int(s))
    rw_views = []
    for grp in extra.get("rw_sums") or []:
        parts = []
        for src, col, dim in grp:
            width = int(dim_sums[src])
            parts.append((starts[src], width, int(col), int(dim)))
        rw_views.append(parts)
    cuda = device.type == "cuda"
    delay_s = (float(delays_ms[rank]) / 1e3) if delays_ms else 0.0
    fw, bw = [], []

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def local_sums():
        for parts in rw_views:
            acc = None
            for start, width, col, dim in parts:
                part = recv_fw[start:start + b_self * width].view(b_self, width)[:, col:col + dim]
                acc = part.clone() if acc is None else acc.add_(part)

    def one(recv, send, out_splits, in_splits, delay, before=None, after=None):
        sync()
        dist.barrier()
        if delay > 0:
            time.sleep(delay)
        t0 = time.perf_counter()
        if before is not None:
            before()
        if any_out:
            dist.all_to_all_single(recv, send, list(out_splits), list(in_splits))
        if after is not None:
            after()
        sync()
        return (time.perf_counter() - t0) * 1e3

    any_out = sum(int(x) for x in dim_sums) > 0
    ids_a2a = ((lambda: dist.all_to_all_single(ids_rx, ids_tx, ids_in, ids_out)) if any_ids else None)
    ar = (lambda: dist.all_reduce(grad_ar)) if any_ar else None
    for it in range(max(0, warmup) + max(1, iters)):
        f = one(recv_fw, send_fw, splits.fw_recv, splits.fw_send, delay_s, ids_a2a,
                local_sums if rw_views else None)
        b = one(recv_bw, send_bw, splits.bw_recv, splits.bw_send, 0.0, None, ar)
        if it >= warmup:
            fw.append(f)
            bw.append(b)
    stat = low_quantile if device.type == "cpu" else statistics.median
    info.update(fw_ms=float(stat(fw)), bw_ms=float(stat(bw)))
    return info


def model_extra(model: CommModel, times, layout, precision: str):
    """Modelled times plus a plan's input-id all-to-all (forward) and data-parallel all-reduce
    (backward, a ring: 2 (n - 1) / n of the gradient's bytes each way)."""
    n = len(times)
    elem = 2 if precision == "fp16" else 4
    g = model.devices_per_host if model.hosts(n) > 1 else n   # on hosts: each level apart, as exchange_ms
    out = []
    for d, (fw, bw) in enumerate(times):
        if layout.ids_send:
            levels = []
            for same in (True, False):
                sent = sum(layout.ids_send[d][s] for s in range(n) if s != d and (s // g == d // g) == same) * 8
                recv = sum(layout.ids_send[j][d] for j in range(n) if j != d and (j // g == d // g) == same) * 8
                levels.append(max(sent, recv))
            fw += max(model.phase_ms(levels[0]), float(model._inter_phase(levels[1])))
        if layout.allreduce and layout.allreduce[d] and n > 1:
            ring = [2 * (n - 1) / n * layout.allreduce[d] * elem] * n
            bw += float(model.exchange_ms([0.0] * n, n, None, ring)[1][d])
        out.append((fw, bw))
    return out
