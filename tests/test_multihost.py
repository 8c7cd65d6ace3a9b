"""The evaluator's workers under torchrun: two "hosts" (two torchrun launchers, --nnodes 2
--nproc-per-node 2, gloo on loopback) measure 4-device plans end to end; a rank killed mid-run ends
the run with one line naming it and its host, and no process is left."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import pytest

from helpers import make_dataset, marked_processes
from shardcore.errors import ShardError
from shardcore.oracles.measured.launch import JsonConnection, _decode, _encode, rank_env
from shardcore.tables import TableConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port_pair() -> int:
    """A port P with P and P + 1 (the control port) free on loopback."""
    for _ in range(50):
        p = random.randint(20000, 40000)
        try:
            for q in (p, p + 1):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue
    raise RuntimeError("no free port pair")


def _torchrun(node: int, port: int, args: list[str], logs, out, err) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
           "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port),
           "--log-dir", str(logs), "--redirects", "3"] + args
    return subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True)


def _two_hosts(args: list[str], tmp_path) -> str:
    """Run ``args`` under two torchrun launchers (node 1 first), both ending cleanly; rank 0's stdout."""
    port = _free_port_pair()
    with open(tmp_path / "n0.out", "w") as o0, open(tmp_path / "n1.out", "w") as o1:
        p1 = _torchrun(1, port, args, tmp_path / "l1", o1, subprocess.STDOUT)
        p0 = _torchrun(0, port, args, tmp_path / "l0", o0, subprocess.STDOUT)
        assert p0.wait(timeout=240) == 0, _rank_file(tmp_path / "l0", 0, "stderr.log")
        assert p1.wait(timeout=60) == 0
    return _rank_file(tmp_path / "l0", 0, "stdout.log")


def _rank_file(logs, local: int, name: str) -> str:
    found = glob.glob(os.path.join(str(logs), "*", "attempt_0", str(local), name))
    return open(found[0]).read() if found else ""


def _ours(marker: str) -> list[int]:
    return marked_processes(marker)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("multihost")
    make_dataset(root / "ds", num_tables=20, batch_size=128, seed=5)
    tasks = root / "tasks.txt"
    tasks.write_text("0,1,2,3,4,5,6,7\n8,9,10,11,12,13,14,15\n")
    return root, tasks


def test_two_torchrun_hosts_measure_the_same_plans(data, tmp_path):
    root, tasks = data
    common = ["--alg", "random,lookup_greedy", "--task-path", str(tasks), "--data-dir", str(root / "ds"),
              "--max-memory", "5", "--bench-iters", "2", "--comm-iters", "3", "--warmup-iters", "1", "--comm-iters", "3", "--no-cache",
              "--cache-path", str(tmp_path / "c.sqlite")]
    args = [os.path.join(ROOT, "eval.py"), "--launcher", "torchrun", "--out", str(tmp_path / "two.jsonl")] + common
    out = _two_hosts(args, tmp_path)
    assert "2 hosts x 2 (torchrun)" in out and "gloo all-to-all across 2 hosts" in out
    for local in (0, 1):   # the serving ranks print nothing and end cleanly
        assert _rank_file(tmp_path / "l1", local, "stderr.log").strip() == ""
    one = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--gpu-devices", "0,1,2,3",
                          "--out", str(tmp_path / "one.jsonl")] + common, capture_output=True, text=True, timeout=240)
    assert one.returncode == 0, one.stderr
    two = [json.loads(x) for x in (tmp_path / "two.jsonl").read_text().splitlines()]
    ref = [json.loads(x) for x in (tmp_path / "one.jsonl").read_text().splitlines()]
    assert len(two) == len(ref) == 4
    for a, b in zip(two, ref):
        assert (a["task"], a["alg"], a["allocation"]) == (b["task"], b["alg"], b["allocation"])
        assert a["cost_ms"] > 0 and len(a["device_costs_ms"]) == 4
        assert all(d[1] > 0 and d[2] > 0 for d in a["device_costs_ms"])   # real exchanges between the hosts
        assert "across 2 hosts" in a["parts"]["comm"] and "on 2 hosts x 2" in a["hardware"]
        assert a["parts"]["hosts"] == [0, 0, 1, 1]      # which ranks (devices) share a host
        assert "across" not in b["parts"]["comm"] and "hosts" not in b["parts"]
    assert not _ours(str(tasks))


def test_table_row_wise_and_grid_plan_measured_on_two_torchrun_hosts(data, tmp_path):
    """A 4-device plan with a grid table (a column block per host, row-wise over its 2 ranks), a
    table-row-wise table (row-wise over host 1) and table-wise tables, measured end to end by
    tools/measure_plan.py under two torchrun launchers; its TorchRec form has grid_shard and
    table_row_wise and converts back to the same shardings."""
    root, _tasks = data
    ds = root / "ds"
    tables = json.loads((ds / "table_configs.json").read_text())["tables"]
    ids = [18, 7, 1, 3, 15, 19]
    assert tables[18]["dim"] == 32 and tables[7]["pooling_factor"] > 0
    shardings = [{"type": "grid", "devices": [0, 1, 2, 3], "dims": [16, 16]}, {"type": "row_wise", "devices": [2, 3]}]
    shardings += [{"type": "table_wise", "devices": [d]} for d in range(4)]
    plan_path = tmp_path / "grid_twrw_plan.json"   # also the marker of this run's processes
    plan_path.write_text(json.dumps({"tables": ids, "shardings": shardings}))
    args = [os.path.join(ROOT, "tools", "measure_plan.py"), "--launcher", "torchrun", "--data-dir", str(ds),
            "--plan", str(plan_path), "--bench-iters", "2", "--warmup-iters", "1", "--comm-iters", "3",
            "--out", str(tmp_path / "rec.json"), "--torchrec", str(tmp_path / "plan.torchrec.json")]
    out = _two_hosts(args, tmp_path)
    assert "on 2 hosts x 2 (torchrun)" in out and "device 3 (host 1)" in out
    rec = json.loads((tmp_path / "rec.json").read_text())
    assert 0 < rec["cost_ms"] < float("inf") and len(rec["device_costs_ms"]) == 4
    for fw_comp, fw_comm, bw_comm, bw_comp in rec["device_costs_ms"]:
        assert fw_comp > 0 and bw_comp > 0 and fw_comm > 0 and bw_comm > 0   # every device holds grid rows
    assert rec["parts"]["hosts"] == [0, 0, 1, 1] and "across 2 hosts" in rec["parts"]["comm"]
    assert not _ours(str(plan_path))
    # the TorchRec form: grid_shard (block c on host c's ranks) and table_row_wise over host 1
    trec = json.loads((tmp_path / "plan.torchrec.json").read_text())
    assert trec["local_world_size"] == 2
    assert [t["sharding_type"] for t in trec["tables"]] == ["grid_shard", "table_row_wise"] + ["table_wise"] * 4
    rows = tables[18]["row"]
    half = -(-rows // 2)
    assert [(s["offsets"], s["sizes"], s["rank"]) for s in trec["tables"][0]["shards"]] == [
        ([0, 0], [half, 16], 0), ([half, 0], [rows - half, 16], 1),
        ([0, 16], [half, 16], 2), ([half, 16], [rows - half, 16], 3)]
    if importlib.util.find_spec("torchrec") is not None:
        from shardcore.interop import plan_export as pe
        from shardkit_torchrec.torchrec_planner import sharding_from_torchrec
        from shardcore.plan import Sharding
        from shardcore.tables import TableConfig as TC

        sp = pe.sharding_plan_from_json(trec, device_type="cpu")
        task = [TC.from_json(tables[i]) for i in ids]
        back = [sharding_from_torchrec(sp.plan[""][t["name"]], tc, 4, t["name"]) for t, tc in zip(trec["tables"], task)]
        assert back == [Sharding.from_json(s) for s in shardings]


def test_a_killed_rank_ends_the_run_in_one_line(data, tmp_path):
    root, tasks = data
    many = tmp_path / "many_tasks.txt"   # a marker for this run's processes, and enough work to kill into
    many.write_text("".join(f"{i},{i + 1},{i + 2},{i + 3},{(i + 7) % 20},{(i + 11) % 20}\n" for i in range(12)))
    port = _free_port_pair()
    args = [os.path.join(ROOT, "eval.py"), "--launcher", "torchrun", "--alg", "random,lookup_greedy",
            "--task-path", str(many), "--data-dir", str(root / "ds"), "--max-memory", "5", "--bench-iters", "3", "--comm-iters", "3",
            "--no-cache", "--cache-path", str(tmp_path / "c.sqlite"), "--timeout", "30"]
    with open(tmp_path / "n0.out", "w") as o0, open(tmp_path / "n1.out", "w") as o1:
        p1 = _torchrun(1, port, args, tmp_path / "l1", o1, subprocess.STDOUT)
        p0 = _torchrun(0, port, args, tmp_path / "l0", o0, subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 180
            while "task   0" not in _rank_file(tmp_path / "l0", 0, "stdout.log"):   # measuring has begun
                assert time.monotonic() < deadline and p0.poll() is None, _rank_file(tmp_path / "l0", 0, "stderr.log")
                time.sleep(0.5)
            victim = None
            for pid in _ours(str(many)):
                try:
                    env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
                except OSError:
                    continue
                if b"RANK=2" in env and b"LOCAL_RANK=0" in env:
                    victim = pid
            assert victim is not None
            t0 = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            assert p0.wait(timeout=90) != 0
            assert p1.wait(timeout=90) != 0
            assert time.monotonic() - t0 < 60
        finally:
            for p in (p0, p1):
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
    err = _rank_file(tmp_path / "l0", 0, "stderr.log").strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("error: rank 2 on host ") and "stopped answering" in err[0]
    deadline = time.monotonic() + 30
    while _ours(str(many)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _ours(str(many))


def test_control_messages_are_json_with_tables():
    t = TableConfig(3, 1000, 16, 2.5, tuple(float(i) / 17 for i in range(17)))
    msg = ("compute", 7, [t, t.with_dim(8)], 128, "exact_sgd", "fp16", 1, 0, 2, None, True)
    back = _decode(json.loads(json.dumps(_encode(msg))))
    assert back[2] == [t, t.with_dim(8)] and back[0] == "compute" and back[-1] is True
    a, b = socket.socketpair()
    from multiprocessing.connection import Connection

    ca, cb = JsonConnection(Connection(a.detach())), JsonConnection(Connection(b.detach()))
    ca.send(["ok", 1, {"fw": [1.5, 2.0]}])
    assert cb.recv() == ["ok", 1, {"fw": [1.5, 2.0]}]
    cb._conn.send_bytes(b"\x80\x04not json")   # a pickle is never unpickled: it is a broken message
    with pytest.raises(EOFError, match="malformed control message"):
        ca.recv()
    ca.close()
    cb.close()


def test_torchrun_launcher_outside_torchrun_is_one_line(data, monkeypatch):
    root, tasks = data
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ShardError, match="start the command with torchrun"):
        rank_env()
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--launcher", "torchrun",
                           "--task-path", str(tasks), "--data-dir", str(root / "ds")],
                          capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k not in ("RANK", "MASTER_ADDR")})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --launcher torchrun:")


def test_more_plan_devices_than_ranks_on_two_hosts_fit_both_levels(data, tmp_path):
    """8 plan devices on 2 torchrun hosts x 2 ranks: the exchange is modelled, each level fitted apart from
    exchanges measured within and between the hosts, and the plan's devices form hosts of 2."""
    root, tasks = data
    args = [os.path.join(ROOT, "eval.py"), "--launcher", "torchrun", "--ndevices", "8", "--alg", "lookup_greedy",
            "--task-path", str(tasks), "--data-dir", str(root / "ds"), "--max-memory", "5", "--bench-iters", "2", "--comm-iters", "3",
            "--warmup-iters", "1", "--no-cache", "--cache-path", str(tmp_path / "c.sqlite"), "--max-tasks", "1",
            "--out", str(tmp_path / "over.jsonl")]
    _two_hosts(args, tmp_path)
    rec = json.loads((tmp_path / "over.jsonl").read_text().splitlines()[0])
    assert len(rec["device_costs_ms"]) == 8 and rec["cost_ms"] > 0
    comm = rec["parts"]["comm"]
    assert "fitted to gloo exchanges within and between 2 torchrun hosts of 2" in comm
    assert "between hosts of 2 devices" in comm and "fitted)" in comm
    assert not _ours(str(tasks))
