"""The communication model on two levels (issue: past one host): hosts of G devices, the bytes a device
exchanges within its host priced at the intra-host link, those with other hosts at the network's,
the slower level ending the phase; a hierarchical data-parallel all-reduce."""

from __future__ import annotations

import numpy as np
import pytest

from shardcore.errors import ShardError
from shardcore.oracles.commmodel import (ID_ELEMENT_SIZE, OUTPUT_ELEMENT_SIZE, CommModel, host_bytes, id_bytes,
                                         remote_bytes)
from helpers import build_planner, planning_ctx
from shardcore.topology import Topology


def test_host_bytes_split_the_flat_all_to_all_by_level():
    # 4 devices, hosts of 2, batch 8 (slices of 2), device widths 1, 2, 3, 4
    (isent, irecv), (xsent, xrecv) = host_bytes([1.0, 2.0, 3.0, 4.0], 8, 2, OUTPUT_ELEMENT_SIZE)
    assert isent.tolist() == [8, 16, 24, 32] and xsent.tolist() == [16, 32, 48, 64]   # 4 B x width x slices
    assert irecv.tolist() == [16, 8, 32, 24] and xrecv.tolist() == [56, 56, 24, 24]   # 4 B x 2 x others' widths
    flat = remote_bytes([1, 2, 3, 4], 8)
    assert [(a + b, c + d) for a, b, c, d in zip(isent, xsent, irecv, xrecv)] == [(s, r) for s, r in flat]
    # one host holding every device: nothing crosses hosts
    intra, inter = host_bytes([1.0, 2.0, 3.0, 4.0], 8, 4, OUTPUT_ELEMENT_SIZE)
    assert not inter[0].any() and not inter[1].any()


def test_one_host_prices_as_before_and_two_hosts_by_the_slower_level():
    dims = np.array([[64.0, 32.0, 128.0, 16.0]])
    ids = np.array([[20.0, 5.0, 40.0, 3.0]])
    ar = np.array([[1e6, 1e6, 1e6, 1e6]])
    flat = CommModel()
    for g in (0, 4, 8):   # devices_per_host 0, or at least the device count: one host
        one = CommModel(devices_per_host=g)
        assert one.hosts(4) == 1
        for a, b in zip(one.exchange_ms(dims, 4096, ids, ar), flat.exchange_ms(dims, 4096, ids, ar)):
            assert np.allclose(a, b)
        assert one.predict([64, 32, 128, 16], 4096) == flat.predict([64, 32, 128, 16], 4096)
    two = CommModel(devices_per_host=2, inter_bandwidth_gbps=50.0, inter_latency_us=50.0)
    assert two.hosts(4) == 2 and two.hosts(5) == 3
    fw, bw = two.exchange_ms(dims, 4096)
    (isent, irecv), (xsent, xrecv) = host_bytes(dims, 4096, 2, OUTPUT_ELEMENT_SIZE)
    expect = np.maximum(0.025 + np.maximum(isent, irecv) / 200e9 * 1e3, 0.050 + np.maximum(xsent, xrecv) / 50e9 * 1e3)
    assert np.allclose(fw, expect) and np.allclose(bw, expect)
    assert np.all(fw > flat.exchange_ms(dims, 4096)[0])          # a slower network only adds
    assert [t for t, _ in two.predict([64, 32, 128, 16], 4096)] == pytest.approx(expect[0].tolist())
    # equal links on both levels and no latency: the flat model's bytes split in two, never slower
    same = CommModel(latency_us=0.0, devices_per_host=2, inter_bandwidth_gbps=200.0, inter_latency_us=0.0)
    assert np.all(same.exchange_ms(dims, 4096)[0] <= CommModel(latency_us=0.0).exchange_ms(dims, 4096)[0] + 1e-12)


def test_ids_and_the_hierarchical_all_reduce_on_two_levels():
    two = CommModel(devices_per_host=2, inter_bandwidth_gbps=50.0, inter_latency_us=50.0)
    dims = np.array([16.0, 16.0, 16.0, 16.0])
    ids = np.array([10.0, 0.0, 30.0, 2.0])
    base_fw, base_bw = two.exchange_ms(dims, 1024)
    fw, _ = two.exchange_ms(dims, 1024, ids)
    # the ids go the other way: d receives the others' slices of its own ids (id_bytes, split by level)
    (isent, irecv), (xsent, xrecv) = host_bytes(ids, 1024, 2, ID_ELEMENT_SIZE)
    assert np.allclose(irecv + xrecv, id_bytes(ids, 1024)[0]) and np.allclose(isent + xsent, id_bytes(ids, 1024)[1])
    ids_ms = np.maximum(0.025 + np.maximum(isent, irecv) / 200e9 * 1e3, 0.050 + np.maximum(xsent, xrecv) / 50e9 * 1e3)
    assert np.allclose(fw - base_fw, ids_ms)
    # all-reduce of S bytes: flat ring bytes 2 (n-1)/n S = 1.5 S; hierarchical S within hosts, S/2 across
    S = 8e6
    _, bw = two.exchange_ms(dims, 1024, None, np.full(4, 1.5 * S))
    assert np.allclose(bw - base_bw, (0.025 + S / 200e9 * 1e3) + (0.050 + S / 2 / 50e9 * 1e3))


def test_two_level_model_says_what_it_assumes_and_refuses_bad_values():
    m = CommModel(devices_per_host=8)
    assert "hosts of 8 devices" in m.describe() and "50.0 GB/s" in m.describe() and "NICs" in m.describe()
    assert m.to_json()["devices_per_host"] == 8 and "devices_per_host" not in CommModel().to_json()
    for bad in (dict(devices_per_host=-1), dict(devices_per_host=2.5), dict(devices_per_host=True),
                dict(inter_bandwidth_gbps=0.0), dict(inter_bandwidth_gbps=float("nan")), dict(inter_latency_us=-1.0)):
        with pytest.raises(ShardError):
            CommModel(**bad)


def test_eval_plans_and_judges_for_hosts(tmp_path):
    """--devices-per-host: the emulated judge prices two levels, TorchRec plans with local_world_size and the
    link between hosts, shardkit with the same model; the records say so."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("torchrec")
    root = Path(__file__).resolve().parent.parent
    data = root / "data" / "gpu_measurements" / "dlrm_b65536"
    tasks = tmp_path / "t.txt"
    tasks.write_text(",".join(str(i) for i in range(0, 400, 20)) + "\n")
    out = {}
    for name, extra in (("flat", []), ("hosts", ["--devices-per-host", "2", "--inter-host-bandwidth", "25"])):
        path = tmp_path / f"{name}.jsonl"
        proc = subprocess.run([sys.executable, str(root / "eval.py"), "--alg", "lookup_greedy,torchrec",
                               "--oracle", "emulated:h200", "--data-dir", str(data),
                               "--task-path", str(tasks), "--ndevices", "4", "--max-memory", "5", "--quiet",
                               "--out", str(path)] + extra, capture_output=True, text=True, cwd=root, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        out[name] = {r["alg"]: r for r in map(json.loads, path.read_text().splitlines())}
    hosts, flat = out["hosts"], out["flat"]
    assert "between hosts of 2 devices" in hosts["lookup_greedy"]["parts"]["comm"]
    assert "between hosts" not in flat["lookup_greedy"]["parts"]["comm"]
    # the same greedy plan costs more when half its traffic crosses a slower network
    assert hosts["lookup_greedy"]["allocation"] == flat["lookup_greedy"]["allocation"]
    assert hosts["lookup_greedy"]["cost_ms"] > flat["lookup_greedy"]["cost_ms"]
    cfg = hosts["torchrec"]["torchrec_config"]
    assert cfg["local_world_size"] == 2 and cfg["inter_host_bw_gbps"] == 25.0 and cfg["intra_host_bw_gbps"] == 200.0
    assert flat["torchrec"]["torchrec_config"]["local_world_size"] == 4
    assert all(r["feasible"] for r in hosts.values())


def test_shardkit_and_its_torchrec_start_plan_for_the_hosts():
    from shardcore.cli import algorithms

    ctx = planning_ctx(batch_size=65536, devices_per_host=2, inter_host_bandwidth=25.0, inter_host_latency=10.0)
    sk = algorithms.build("shardkit", ctx)
    comm = sk.cost_model().comm
    assert (comm.devices_per_host, comm.inter_bandwidth_gbps, comm.inter_latency_us) == (2, 25.0, 10.0)
    assert algorithms.build("shardkit", planning_ctx(batch_size=65536)).cost_model().comm.devices_per_host == 0
    pytest.importorskip("torchrec")   # a start that is TorchRec's planner plans for the same hosts
    tr = build_planner("shardkit", ctx, starts=("torchrec",)).proposers[0].sharder()
    assert tr.local_world_size == 2 and tr.hardware.inter_host_bw_gbps == 25.0


def test_shardkit_moves_row_wise_within_a_host_when_there_are_hosts():
    import dataclasses

    from shardcore.plan import table_wise
    from shardkit_planner.costmodel import emulated_model
    from shardkit_planner.search import State, candidate_moves
    from tests.test_evaluator import make_data

    import tempfile

    with tempfile.TemporaryDirectory() as d:
        tables = make_data(d)
    base = emulated_model(d, 4096)
    task = tables[:8]
    shardings = [table_wise(i % 8) for i in range(len(task))]
    moves = {}
    for g in (0, 4):
        model = dataclasses.replace(base, comm=CommModel(devices_per_host=g))
        st = State(model, task, shardings, Topology(8, 100.0, "fp16"))
        moves[g] = [tuple(ch[p].devices) for kind, ch in candidate_moves(st, 5, 6, 8, 1.0) if kind == "row-wise"
                    for p in ch]
    # with hosts of 4, every heavy table of device 5 may also go row-wise over its host (devices 4-7)
    assert len(moves[4]) - len(moves[0]) == moves[4].count((4, 5, 6, 7)) - moves[0].count((4, 5, 6, 7)) > 0


def test_step_bytes_split_a_training_step_by_level():
    pooled, ids, ring = [64.0, 32.0, 128.0, 16.0], [20.0, 5.0, 40.0, 3.0], [3e5, 3e5, 3e5, 3e5]
    intra1, inter1 = CommModel().step_bytes(pooled, 4096, ids, ring)
    assert not inter1.any()
    flat = remote_bytes([64, 32, 128, 16], 4096)
    id_sent, id_recv = id_bytes(np.array(ids), 4096)
    expect = [2 * (s + r) + a + b + 2 * 3e5 for (s, r), a, b in zip(flat, id_sent, id_recv)]
    assert np.allclose(intra1, expect)
    # two hosts of 2: the all-to-alls' bytes are only split between the levels (their sum is the flat one's)
    intra2, inter2 = CommModel(devices_per_host=2).step_bytes(pooled, 4096, ids, [0.0] * 4)
    assert (inter2 > 0).all()
    assert np.allclose(intra2 + inter2, np.array(expect) - 2 * 3e5)


def test_judge_pool_leaves_a_held_out_judge_for_large_tasks():
    """--judge-pool: tasks of hundreds of tables drawn outside the pool still have a held-out judge."""
    from shardcore.data.taskgen import TaskSpec, generate_tasks
    from shardcore.oracles.emulated.emulator import heldout_model, judge_pool, measured_landscapes
    from shardcore.tables import TableConfig

    pool = judge_pool(260)
    assert len(pool) <= 260
    held = sum(1 for s in measured_landscapes()[0].tables if set(int(t) for t in s) <= set(pool))
    assert held >= 200   # every one of these stays in a refit without any of the other tables
    tables = [TableConfig(i, 1000, 16, 1.0) for i in range(856)]
    train, test = generate_tasks(tables, TaskSpec(t_min=400, t_max=400, num_train=0, num_test=2,
                                                  train_pool=tuple(pool)))
    assert not train and len(test) == 2 and all(not set(t.table_ids) & set(pool) for t in test)
    train, _ = generate_tasks(tables, TaskSpec(t_min=50, t_max=50, num_train=2, num_test=1, train_pool=tuple(pool)))
    assert all(set(t.table_ids) <= set(pool) for t in train)
    model = heldout_model(frozenset(test[0].table_ids))
    assert int(model.params["sets"]["65536"]["shards"]) >= held
    with pytest.raises(ShardError, match="outside"):
        generate_tasks(tables[:100], TaskSpec(t_min=5, t_max=5, train_pool=tuple(pool)))


def test_torchrec_time_reaches_torchrec_and_its_record():
    pytest.importorskip("torchrec")
    sharder = build_planner("torchrec", planning_ctx(oracle=None, batch_size=4096), time=1.5)
    assert sharder.timeout_seconds == 2
    assert sharder.config(4, 1024, 4, ["table_wise"])["timeout_seconds"] == 2
    default = build_planner("torchrec", planning_ctx(oracle=None, batch_size=4096))
    assert default.config(4, 1024, 4, ["table_wise"])["timeout_seconds"] is None


def test_cluster_scale_is_for_the_emulated_card():
    from experiments.config import SCALES, ExperimentConfig

    sc = SCALES["cluster"]
    assert sc.judge_pool and sc.task_sets[0].num_tables >= 300 and sc.task_sets[0].ndevices == 32
    with pytest.raises(ShardError, match="emulated"):
        ExperimentConfig(scale="cluster", oracle="measured", algs=("lookup_greedy",)).resolved()
    cfg = ExperimentConfig(scale="cluster", oracle="emulated:h200", algs=("lookup_greedy",), devices_per_host=8,
                           planner_args={"torchrec": {"time": 60.0}, "shardkit": {"time": 30.0}}).resolved()
    assert cfg.num_train == 0 and cfg.planner_args == {"torchrec": {"time": 60.0}, "shardkit": {"time": 30.0}}
