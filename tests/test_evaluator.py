"""The multi-device plan evaluator on the CPU (gloo), on tiny data built here.

One evaluator (3 logical devices) serves most tests in a row; the failure tests restart it.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import torch

from shardcore.oracles.cache import CachedOracle, CostCache
from shardcore.dataset import save_dataset
from shardcore.errors import ShardError
from shardcore.oracles.commmodel import batch_slices, comm_splits
from shardcore.oracles.measured.driver import PlanEvaluator
from shardcore.tables import TableConfig
from shardcore.types import CommLayout

from helpers import marked_processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B = 1000  # not a multiple of 3: the batch split has a remainder


def make_data(path, seed=0):
    rng = np.random.default_rng(seed)
    # (rows, dim, lookups per sample); tables 0 and 1 are alike but 1 has 10x the lookups
    specs = [(4000, 32, 4), (4000, 32, 40), (200, 16, 0), (30000, 8, 3), (64, 64, 1), (5000, 16, 6),
             (1000, 4, 2), (8000, 32, 5)]
    tables, indices, offsets = [], [], []
    for i, (row, dim, pf) in enumerate(specs):
        off = np.arange(B + 1, dtype=np.int64) * pf
        tables.append(TableConfig(i, row, dim, float(pf)))
        indices.append(torch.from_numpy(rng.integers(0, row, size=int(off[-1]))))
        offsets.append(torch.from_numpy(off))
    save_dataset(path, tables, indices, offsets, B)
    return tables


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("eval_ds")
    return path, make_data(path)


@pytest.fixture(scope="module")
def ev(data, tmp_path_factory):
    path, _ = data
    cache = CostCache(tmp_path_factory.mktemp("cache") / "cache.sqlite")
    with CachedOracle(PlanEvaluator(path, ndevices=3, bench_iters=3, warmup_iters=1, timeout_s=30,
                                    host_lock=False), cache) as e:  # timings are not asserted; never wait on other measurers
        yield e
    assert all(not alive(p) for p in e.oracle.worker_pids)


def check_result(res, shards):
    assert len(res.device_costs_ms) == len(shards)
    for dev, shard in zip(res.device_costs_ms, shards):
        assert len(dev) == 4
        assert all(math.isfinite(v) and v >= 0 for v in dev)
        if shard:
            assert dev[0] > 0 and dev[3] > 0      # forward and backward compute
        else:
            assert dev[0] == 0 and dev[3] == 0    # an empty device computes nothing
    assert res.cost_ms == pytest.approx(max(sum(d) for d in res.device_costs_ms))


def test_several_plans_in_a_row_with_an_empty_device(ev, data):
    _, t = data
    plans = [
        [[t[0], t[3]], [t[1], t[4]], [t[2], t[5], t[6], t[7]]],
        [[t[0], t[1], t[2], t[3]], [], [t[4], t[5], t[6], t[7]]],   # device 1 holds nothing
        [[t[7]], [t[6].with_dim(8)], [t[5], t[0]]],
    ]
    pids = ev.oracle.worker_pids
    for shards in plans:
        res = ev.evaluate(shards, no_cache=True)
        assert not res.from_cache
        check_result(res, shards)
        assert all(dev[1] > 0 and dev[2] > 0 for dev in res.device_costs_ms)  # all exchange data
    assert ev.oracle.worker_pids == pids  # the same workers served every plan


def test_all_to_all_moves_the_right_bytes(ev, data):
    _, t = data
    shards = [[t[0], t[3]], [], [t[5], t[6], t[7]]]
    res = ev.evaluate(shards, no_cache=True)
    dims = [sum(x.dim for x in s) for s in shards]
    bs = batch_slices(B, 3)
    assert bs == [334, 333, 333] and sum(bs) == B
    total_sent = total_recv = 0
    for d, sp in enumerate(res.comm):   # split sizes reported by the workers themselves
        assert list(sp.fw_send) == [bs[j] * dims[d] for j in range(3)]
        assert list(sp.fw_recv) == [bs[d] * dims[k] for k in range(3)]
        assert list(sp.bw_send) == list(sp.fw_recv) and list(sp.bw_recv) == list(sp.fw_send)
        assert sp.bytes_sent("fw") == 4 * sum(bs[j] * dims[d] for j in range(3) if j != d)
        assert sp.bytes_received("fw") == 4 * bs[d] * sum(dims[k] for k in range(3) if k != d)
        assert sp.bytes_received("fw", remote_only=False) == 4 * bs[d] * sum(dims)   # [B_d, sum dims]
        assert sp == comm_splits(dims, B, d)
        total_sent += sp.bytes_sent("fw")
        total_recv += sp.bytes_received("fw")
    assert total_sent == total_recv
    assert res.comm[1].bytes_sent("fw") == 0 and res.comm[1].bytes_received("fw") > 0


def test_every_table_ids_travel_in_the_measured_forward(ev, data, monkeypatch):
    """A table-wise plan's forward exchange runs the input-id all-to-all: every device sends each
    table's holder its batch slice's ids of the table (this dataset: a fixed count per sample) plus
    one length per sample, counted from data.pt; the workers report the split sizes they ran."""
    _, t = data
    shards = [[t[0], t[3]], [], [t[5], t[6], t[7]]]
    replies = []
    inner = ev.oracle
    request = inner._request

    def spy(ranks, make_msg, phase):
        rep = request(ranks, make_msg, phase)
        if phase == "comm":
            replies.append(rep)
        return rep

    monkeypatch.setattr(inner, "_request", spy)
    res = ev.evaluate(shards, no_cache=True)
    assert len(replies) == 1
    bs = batch_slices(B, 3)
    width = [sum(int(x.pooling_factor) + 1 for x in s) for s in shards]     # ids + one length, per sample
    assert width == [(4 + 1) + (3 + 1), 0, (6 + 1) + (2 + 1) + (5 + 1)]
    for d in range(3):
        rep = replies[0][d]
        assert rep["ids_send"] == [bs[d] * width[k] for k in range(3)]       # my slice's ids, to each holder
        assert rep["ids_recv"] == [bs[j] * width[d] for j in range(3)]       # every slice's ids of my tables
        fw_comm, bw_comm = res.device_costs_ms[d][1:3]
        assert fw_comm > 0 and bw_comm > 0
    # device 0 received 8 bytes per id from the two other slices: (333 + 333) x 9 elements
    assert 8 * sum(replies[0][0]["ids_recv"][1:]) == 8 * 666 * 9
    # the pooled outputs are unchanged by the id exchange
    dims = [sum(x.dim for x in s) for s in shards]
    assert all(sp == comm_splits(dims, B, d) for d, sp in enumerate(res.comm))


def test_more_lookups_cost_more(ev, data):
    _, t = data
    res = ev.evaluate([[t[0]], [t[1]], []], no_cache=True)   # t[1]: 10x the lookups of t[0]
    light, heavy = res.device_costs_ms[0], res.device_costs_ms[1]
    assert heavy[0] + heavy[3] > light[0] + light[3]
    assert heavy[3] > light[3]


def test_cache_hit_returns_the_stored_numbers(ev, data):
    _, t = data
    shards = [[t[4], t[6]], [t[2]], [t[3], t[7]]]
    first = ev.evaluate(shards)
    assert not first.from_cache
    hits = []
    for _ in range(5):
        t0 = time.perf_counter()
        again = ev.evaluate([[t[6], t[4]], [t[2]], [t[7], t[3]]])  # same shards, other table order
        hits.append(time.perf_counter() - t0)
        assert again.from_cache and again.comm is None
        assert again.device_costs_ms == first.device_costs_ms
        assert again.cost_ms == first.cost_ms
    assert sorted(hits)[2] < 0.010
    # the shards were stored one by one: a plan that reuses them measures only communication
    swapped = ev.evaluate([[t[3], t[7]], [t[2]], [t[4], t[6]]])
    assert not swapped.from_cache and swapped.compute_from_cache == [True, True, True]
    assert swapped.device_costs_ms[0][0] == first.device_costs_ms[2][0]
    assert swapped.device_costs_ms[2][3] == first.device_costs_ms[0][3]
    entries = ev.cache.shard_entries(ev.context)
    assert any(e.tables == ((2, t[2].row, t[2].dim),) for e in entries)
    assert len(ev.cache.plan_entries(ev.context, ndevices=3)) >= 2
    # measure_devices uses (and fills) the same per-shard entries
    assert ev.measure_devices([[t[2]]])[0].fw_ms == first.device_costs_ms[1][0]


def test_comm_with_start_delays(ev):
    costs, splits = ev.measure_comm(CommLayout([32, 16, 0]), delays_ms=[60.0, 0.0, 0.0])
    fw = [c[0] for c in costs]
    assert fw[1] > 45 and fw[2] > 45       # they wait for the late device 0
    assert fw[0] < fw[1] and fw[0] < fw[2]
    assert splits[2].bytes_sent("fw") == 0
    plain, _ = ev.measure_comm(CommLayout([32, 16, 0]))
    assert max(c[0] for c in plain) < 45


def test_waits_for_the_machine_measurement_lock(ev, data):
    from shardcore.oracles.measured.benchmark import host_measurement_lock

    _, t = data
    pids = ev.oracle.worker_pids
    old = ev.oracle.lock_timeout_s
    ev.oracle.lock_timeout_s = 0.3
    ev.oracle.host_lock = True   # the fixture measures without the lock
    try:
        with host_measurement_lock():  # another process measuring on this machine
            with pytest.raises(ShardError, match="measurement lock"):
                ev.evaluate([[t[0]], [t[3]], [t[5]]], no_cache=True)
    finally:
        ev.oracle.lock_timeout_s = old
        ev.oracle.host_lock = False
    assert ev.oracle.worker_pids == pids
    check_result(ev.evaluate([[t[0]], [t[3]], [t[5]]], no_cache=True), [[1], [1], [1]])


def test_oversize_shard_refused_without_restart(ev, data):
    _, t = data
    pids = ev.oracle.worker_pids
    huge = TableConfig(0, 10 ** 12, 64, 4.0)
    with pytest.raises(ShardError, match="refused before allocation"):
        ev.evaluate([[t[1]], [huge], [t[2]]], no_cache=True)
    assert ev.oracle.worker_pids == pids
    check_result(ev.evaluate([[t[1]], [t[0]], [t[2]]], no_cache=True), [[1], [1], [1]])


def test_bad_plans_are_clear_errors(ev, data):
    _, t = data
    with pytest.raises(ShardError, match="3 devices"):
        ev.evaluate([[t[0]], [t[1]]])
    with pytest.raises(ShardError, match="out of range"):
        ev.evaluate([[TableConfig(42, 10, 4, 1.0)], [], []])


def test_killed_worker_is_a_clear_error(ev, data):
    _, t = data
    victim = ev.oracle.worker_pids[1]
    old_iters = ev.oracle.bench_iters
    ev.oracle.bench_iters = 3000  # a long measurement, so the kill lands mid-way
    killer = threading.Timer(1.0, lambda: os.kill(victim, signal.SIGKILL))
    killer.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(ShardError, match=r"device 1 worker was killed by SIGKILL"):
            ev.evaluate([[t[1], t[3]], [t[1], t[5]], [t[1], t[7]]], no_cache=True)
    finally:
        killer.cancel()
        ev.oracle.bench_iters = old_iters
    assert time.perf_counter() - t0 < ev.oracle.timeout_s
    assert not ev.running
    # the next plan starts fresh workers
    res = ev.evaluate([[t[0]], [t[3]], [t[5]]], no_cache=True)
    check_result(res, [[1], [1], [1]])
    assert victim not in ev.oracle.worker_pids


def test_hung_worker_times_out(ev, data):
    _, t = data
    pids = ev.oracle.worker_pids
    old_timeout = ev.oracle.timeout_s
    ev.oracle.timeout_s = 3.0
    os.kill(pids[2], signal.SIGSTOP)  # a worker that never answers
    t0 = time.perf_counter()
    try:
        with pytest.raises(ShardError, match=r"did not finish .* within 3 s"):
            ev.evaluate([[t[0]], [t[3]], [t[6]]], no_cache=True)
    finally:
        ev.oracle.timeout_s = old_timeout
    assert time.perf_counter() - t0 < 3.0 + 10.0
    time.sleep(0.2)
    assert not any(alive(p) for p in pids)  # every worker was stopped, the frozen one included


_SCRIPT = textwrap.dedent("""
    import faulthandler, signal, sys
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test dumps the stacks if it hangs
    # a suite started in the background (`make test &`) passes an ignored SIGINT down to its children
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from shardcore.oracles.measured.driver import PlanEvaluator
    from shardcore.dataset import load_dataset

    if __name__ == "__main__":
        t = load_dataset({data!r}).tables
        try:
            with PlanEvaluator({data!r}, ndevices=2, bench_iters=50, warmup_iters=1) as ev:
                print("PIDS", *ev.worker_pids, flush=True)
                while True:
                    ev.evaluate([[t[1], t[3]], [t[7]]], no_cache=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(130)
""")


def _driver_script(tmp_path, source: str, data_dir) -> tuple[subprocess.Popen, list[int]]:
    """Run ``source`` (a driver script, ``{data!r}`` its dataset) until it prints ``PIDS ...``: the
    process and the pids it printed, all alive."""
    script = tmp_path / "driver.py"
    script.write_text(source.format(data=str(data_dir)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    line = proc.stdout.readline()
    if not line.startswith("PIDS"):
        proc.kill()
        raise AssertionError(line + proc.stderr.read())
    pids = [int(x) for x in line.split()[1:]]
    assert all(alive(p) for p in pids)
    return proc, pids


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    """The pids still alive after waiting up to ``seconds`` for all of them to end."""
    deadline = time.time() + seconds
    while any(alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_no_orphans_after_ctrl_c_or_parent_death(data, tmp_path, sig):
    path, _ = data
    proc, pids = _driver_script(tmp_path, _SCRIPT, path)
    try:
        time.sleep(1.0)   # mid-way through a plan
        proc.send_signal(sig)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)
            time.sleep(2.0)
            proc.kill()
            raise AssertionError("no exit 30 s after the signal; stacks:\n" + proc.stderr.read()[-6000:]) from None
    finally:
        if proc.poll() is None:
            proc.kill()
    if sig == signal.SIGINT:
        assert code == 130
    assert _gone_within(pids, 10) == []


def test_cpu_workers_are_forked_by_a_preloaded_server_cuda_workers_spawned(data):
    """CPU workers come from a forkserver that imported torch and FBGEMM once (not 3 s of imports per
    worker); CUDA workers are spawned, so nothing that touched CUDA is forked. A forked worker's parent
    is the server, not the driver: it checks that the driver lives instead."""
    from shardcore.processes import release_forkserver
    from shardcore.oracles.measured.worker import PRELOAD, WorkerConfig, _driver_gone, worker_context

    assert worker_context("cuda").get_start_method() == "spawn"
    assert worker_context("cpu").get_start_method() == "forkserver"
    assert {"torch", "fbgemm_gpu"} <= set(PRELOAD)
    path, _ = data
    with PlanEvaluator(path, ndevices=2, bench_iters=2, warmup_iters=1) as ev:
        for pid in ev.worker_pids:
            with open(f"/proc/{pid}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            assert ppid != os.getpid() and alive(ppid)   # the forkserver
            # the worker let go of the server's "alive" descriptor: only the driver holds its write end
            assert _alive_pipe_holders(ppid) == [os.getpid()]
    assert release_forkserver() is False   # in the driver: its own end stays open
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert not _driver_gone(WorkerConfig(str(path), "cpu", (0,), 0, 30.0, os.getpid(), 0, forked=True))
    assert _driver_gone(WorkerConfig(str(path), "cpu", (0,), 0, 30.0, dead.pid, 0, forked=True))
    assert _driver_gone(WorkerConfig(str(path), "cpu", (0,), 0, 30.0, os.getpid(), 0))   # spawned: not our child
    assert not _driver_gone(WorkerConfig(str(path), "cpu", (0,), 0, 30.0, None, 0))       # a torchrun rank


def _alive_pipe_holders(server: int) -> list[int]:
    """The processes other than the forkserver ``server`` that hold the pipe it watches to know that its
    clients live (this process's ``_forkserver_alive_fd``), found by the pipe's inode in /proc."""
    from multiprocessing import forkserver

    pipe = os.readlink(f"/proc/self/fd/{forkserver._forkserver._forkserver_alive_fd}")
    holders = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != server):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == pipe:
                    holders.append(pid)
                    break
            except OSError:
                continue
    return holders


_STARTUP_SCRIPT = textwrap.dedent("""
    import multiprocessing, sys, threading, time
    from multiprocessing import forkserver
    from shardcore.oracles.measured.driver import PlanEvaluator

    if __name__ == "__main__":
        def report():
            while len(multiprocessing.active_children()) < 2:
                time.sleep(0.005)
            print("PIDS", forkserver._forkserver._forkserver_pid,
                  *[p.pid for p in multiprocessing.active_children()], flush=True)
        threading.Thread(target=report, daemon=True).start()
        with PlanEvaluator({data!r}, ndevices=2, bench_iters=2, warmup_iters=1):
            time.sleep(120)
""")


def test_a_driver_killed_while_its_workers_start_leaves_no_process(data, tmp_path):
    """SIGKILL the driver while its forked workers are still starting (importing, joining the store):
    the forkserver sees its last client gone and exits, and the workers, whose parent it is, end with it
    within seconds -- not after the store's timeout, and never adopted by init for good."""
    path, _ = data
    proc, pids = _driver_script(tmp_path, _STARTUP_SCRIPT, path)
    assert len(pids) == 3   # the server and two workers
    proc.kill()
    proc.wait(timeout=30)
    assert _gone_within(pids, 10) == []


def test_prestart_only_for_workers_on_this_machine():
    import argparse

    from shardcore.cli.common import prestart_oracle

    for ns in (argparse.Namespace(oracle="emulated:h200"), argparse.Namespace(oracle="measured", launcher="torchrun"),
               argparse.Namespace(oracle="measured", launcher="spawn", plan_only=True)):
        assert prestart_oracle(ns) is False, ns


def test_a_script_stopped_after_the_prestart_ends_at_once_with_its_server(data, tmp_path):
    """eval.py boots the measuring workers' forkserver before it resolves its planners; a planner that
    fails there (a checkpoint not found) ends the script in one line, and the server, still importing
    torch and holding the script's stdout and stderr, ends with it: the pipes close with the script,
    no process of the run is left."""
    path, tables = data
    tasks = tmp_path / "t.txt"
    tasks.write_text("0,1,2,3\n")
    mark = f"shardkit-prestart-{os.getpid()}-{time.time_ns()}"
    env = dict(os.environ, SHARDKIT_TEST_MARK=mark)
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "eval.py"), "--alg", f"lookup_greedy,{tmp_path / 'no.pt'}",
                             "--data-dir", str(path), "--task-path", str(tasks), "--ndevices", "2", "--max-memory", "5",
                             "--cache-path", str(tmp_path / "c.sqlite")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    proc.wait(timeout=120)   # the script itself; its few lines of output fit the pipes

    marked = [p for p in marked_processes(mark, "environ") if alive(p)]
    left = _gone_within(marked, 1.0)   # a server left importing would live on for seconds
    out, err = proc.communicate(timeout=60)
    assert left == [], f"processes of the run left: {left}"
    assert proc.returncode == 2 and len(err.strip().splitlines()) == 1 and "not found" in err, err[-2000:]
