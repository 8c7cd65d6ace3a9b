"""More plan devices than GPUs, the all-to-all model, the noise verdict, the emulated oracle and
tools/gpu_check.py --device cpu (the GPU issue's CPU-testable parts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import make_dataset
from shardcore.evaluation import report
from shardcore.oracles.commmodel import CommModel, fit_comm_model, remote_bytes
from shardcore.errors import ShardError
from shardcore.tables import TableConfig
from shardcore.evaluation.compare import TaskResult
from shardcore.oracles.commmodel import comm_splits
from shardcore.oracles.measured.driver import PlanEvaluator
from shardcore.types import Topology

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpu_truth_ds")
    tables = make_dataset(path, num_tables=24, batch_size=96, seed=3)
    return path, tables


# -- the all-to-all model --------------------------------------------------------------------
def test_remote_bytes_match_the_real_split_sizes():
    dims, batch = [16, 0, 48, 8], 1001
    for d, (sent, recv) in enumerate(remote_bytes(dims, batch)):
        s = comm_splits(dims, batch, d)
        assert sent == s.bytes_sent("fw") and recv == s.bytes_received("fw")
        assert sent == s.bytes_received("bw") and recv == s.bytes_sent("bw")


def test_analytic_model_is_latency_plus_bytes_over_bandwidth():
    m = CommModel(bandwidth_gbps=100.0, latency_us=20.0)
    dims, batch = [64, 32], 1000
    (fw0, bw0), (fw1, bw1) = m.predict(dims, batch)
    # device 0 sends 64 x 500 x 4 bytes and receives 32 x 500 x 4: the larger direction counts
    assert fw0 == pytest.approx(0.020 + 64 * 500 * 4 / 100e9 * 1e3)
    assert fw1 == pytest.approx(fw0) and bw0 == fw0 and bw1 == fw1
    assert m.predict([0, 0, 0], 100) == [(0.0, 0.0)] * 3      # nothing to move costs nothing
    assert m.predict([128], 100) == [(0.0, 0.0)]             # one device exchanges nothing
    assert "modelled (analytic" in m.describe() and "NVLink" in m.describe()


def test_fit_recovers_the_constants():
    truth = CommModel(bandwidth_gbps=37.5, latency_us=80.0)
    pts = [(b, truth.phase_ms(b)) for b in (10_000, 200_000, 3_000_000, 40_000_000)]
    fitted = fit_comm_model(pts, link="test link")
    assert fitted.bandwidth_gbps == pytest.approx(37.5, rel=1e-6)
    assert fitted.latency_us == pytest.approx(80.0, rel=1e-6)
    assert fitted.source == "fitted" and "fitted" in fitted.describe()
    with pytest.raises(ShardError, match="two or more sizes"):
        fit_comm_model([(1000, 1.0), (1000, 1.1)], link="x")


@pytest.mark.parametrize("kw, msg", [({"bandwidth_gbps": 0.0}, "bandwidth"), ({"latency_us": -1.0}, "latency"),
                                     ({"bandwidth_gbps": float("inf")}, "bandwidth")])
def test_bad_model_constants_are_refused(kw, msg):
    with pytest.raises(ShardError, match=msg):
        CommModel(**kw)


# -- N plan devices on fewer devices -------------------------------------------------------------
def test_four_plan_devices_on_one_worker(tiny):
    path, tables = tiny
    shards = [tables[0:4], tables[4:7], [], tables[7:12]]
    model = CommModel(bandwidth_gbps=50.0, latency_us=10.0)
    with PlanEvaluator(path, 4, device_ids=[0], bench_iters=2, warmup_iters=1, comm_iters=3, host_lock=False,
                       comm_model=model) as ev:
        assert ev.nworkers == 1 and ev.ndevices == 4 and ev.oversubscribed
        assert "4 plan devices measured in turns" in ev.hardware
        r = ev.evaluate(shards)
        alone = ev.measure_devices([shards[3]], no_cache=True)[0]
        assert ev.info.noise_pct is not None and ev.info.noise_pct >= 0
    assert len(r.device_costs_ms) == 4
    assert r.parts["compute"].startswith("measured") and r.parts["comm"].startswith("modelled (analytic")
    expected = model.predict([sum(t.dim for t in s) for s in shards], 96)
    # the forward also carries every table's input ids (counted from data.pt: slice j's ids of each
    # table on device k, plus a length per sample, 8 bytes each; slices of 24 samples)
    import torch

    from shardcore.dataset import load_dataset

    ds = load_dataset(path)
    ids = [[0] * 4 for _ in range(4)]
    for k, s in enumerate(shards):
        for t in s:
            off = ds.offsets[t.index][:97].to(torch.int64)
            for j in range(4):
                ids[j][k] += int(off[24 * (j + 1)] - off[24 * j]) + 24
    for d, (dev, (fw, bw), shard) in enumerate(zip(r.device_costs_ms, expected, shards)):
        sent = 8 * sum(ids[d][k] for k in range(4) if k != d)
        recv = 8 * sum(ids[j][d] for j in range(4) if j != d)
        assert dev[1] == pytest.approx(fw + model.phase_ms(max(sent, recv))) and dev[2] == pytest.approx(bw)
        assert (dev[0] > 0 and dev[3] > 0) if shard else (dev[0] == 0 and dev[3] == 0)
    # the device measured in turn costs what its shard costs alone (same worker, noisy CPU: within 3x)
    assert 1 / 3 < (r.device_costs_ms[3][0] + r.device_costs_ms[3][3]) / alone.total_ms < 3


def test_fewer_fake_gpus_than_plan_devices_fits_the_model_to_the_real_exchange(tiny):
    path, tables = tiny
    shards = [tables[0:3], tables[3:6], tables[6:9], tables[9:12]]
    # a machine with 2 devices and a plan for 4: both devices serve, the all-to-all is fitted on them
    with PlanEvaluator(path, 4, bench_iters=2, warmup_iters=1, comm_iters=3, host_lock=False,
                       available_devices=2) as ev:
        assert ev.device_ids == (0, 1) and ev.nworkers == 2
        r = ev.evaluate(shards)
        assert ev.comm_model.source == "fitted"
        assert "gloo all-to-alls between 2" in r.parts["comm"]
    assert len(r.device_costs_ms) == 4 and all(d[1] > 0 for d in r.device_costs_ms)


def test_device_count_errors(tiny):
    path, _ = tiny
    with pytest.raises(ShardError, match="at most as many devices"):
        PlanEvaluator(path, 2, device_ids=[0, 1, 2])
    with pytest.raises(ShardError, match=r"GPU 3 requested but this machine has 2 .*--ndevices N --gpu-devices 0,1"):
        PlanEvaluator(path, 4, device_ids=[0, 3], available_devices=2)


def test_eval_cli_ndevices_on_one_device(tiny, tmp_path):
    path, _ = tiny
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("0,1,2,3,4,5,6,7\n8,9,10,11,12,13,14,15\n")
    out = tmp_path / "r.jsonl"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--alg", "random,lookup_greedy",
                           "--task-path", str(tasks), "--data-dir", str(path), "--ndevices", "4",
                           "--gpu-devices", "0", "--max-memory", "5", "--bench-iters", "2", "--warmup-iters", "1", "--comm-iters", "3",
                           "--no-cache", "--cache-path", str(tmp_path / "c.sqlite"), "--out", str(out),
                           "--comm-bandwidth", "80", "--comm-latency", "5"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "4 plan devices measured in turns" in proc.stdout
    assert "5.0 us + bytes / 80.0 GB/s" in proc.stdout
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 4
    for rec in recs:
        assert rec["ndevices"] == 4 and len(rec["device_costs_ms"]) == 4
        assert rec["parts"]["comm"].startswith("modelled") and rec["parts"]["compute"].startswith("measured")
        assert "CPU" in rec["hardware"] and rec["batch_size"] == 96


def test_eval_cli_refuses_fewer_plan_devices_than_listed(tiny, tmp_path):
    path, _ = tiny
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("0,1,2\n")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--task-path", str(tasks),
                           "--data-dir", str(path), "--ndevices", "2", "--gpu-devices", "0,1,2", "--plan-only"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: --ndevices 2 is fewer than the 3 devices --gpu-devices lists"]


# -- the noise verdict -----------------------------------------------------------------------
def _results(costs: dict[str, list[float]]) -> list[TaskResult]:
    out = []
    for alg, cs in costs.items():
        for t, c in enumerate(cs):
            out.append(TaskResult(t, alg, 5, 2, 1.0, True, [0] * 5, [0.1, 0.1], 0.0, cost_ms=c,
                                  device_costs_ms=[[c, 0, 0, 0], [c / 2, 0, 0, 0]]))
    return out


def test_noise_verdict_says_when_plans_cannot_be_told_apart():
    # three algorithms within 1% of each other, noise 3%: no ranking
    same = _results({"random": [1.00, 1.01, 0.99], "lookup_greedy": [1.005, 1.0, 1.0], "torchrec": [0.995, 1.01, 1.0]})
    line = report.noise_verdict(same, noise_pct=3.0)
    assert line is not None and line.startswith("no ranking") and "\n" not in line and "3.0%" in line
    assert "**" not in report.paper_table(same, "x", bold=False)
    # a consistent 30% gap is a ranking
    apart = _results({"random": [1.3, 1.4, 1.35], "lookup_greedy": [1.0, 1.05, 1.02]})
    assert report.noise_verdict(apart, noise_pct=3.0) is None
    assert "**" in report.paper_table(apart, "x")
    # a gap below the noise is not, however consistent
    small = _results({"a": [1.00, 1.00, 1.00], "b": [1.02, 1.02, 1.02]})
    assert report.noise_verdict(small, noise_pct=3.0) is not None
    assert report.noise_verdict(small, noise_pct=1.0) is None


# -- tools/gpu_check.py --device cpu ---------------------------------------------------------------
def test_gpu_check_cpu(tmp_path):
    work = tmp_path / "gc"
    cmp_file = tmp_path / "elsewhere.jsonl"
    # an eval.py --out file "measured elsewhere": the random plans of the first set cost more there
    cmp_file.write_text("".join(json.dumps({"task": t, "alg": a, "cost_ms": c}) + "\n"
                                for t in range(3) for a, c in (("random", 9.0 + t), ("lookup_greedy", 5.0 + t))))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gpu_check.py"), "--device", "cpu",
                           "--work-dir", str(work), "--alg", "random,lookup_greedy,torchrec",
                           "--compare", str(cmp_file), "--noise-repeats", "3", "--bench-iters", "2", "--comm-iters", "3",
                           "--random-shards", "4", "--special-shards", "4",
                           "--time-budget", "400"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "micro-benchmark noise" in out and "emulated:h200 vs measured" in out and "vs " + str(cmp_file) in out
    summary = json.loads((work / "gpu_check.json").read_text())
    assert summary["device"] == "cpu" and summary["noise"]["repeats"] == 3
    assert [s["ndevices"] for s in summary["sets"]] == [4, 8]
    for s in summary["sets"]:
        algs = {p["alg"] for p in s["plans"]}
        assert algs == {"random", "lookup_greedy", "torchrec"}
        assert all(p["cost_ms"] > 0 for p in s["plans"])
        assert "emulated_h200" in s and s["emulated_h200"]["plans"] == len(s["plans"])
    assert summary["sets"][0]["compare"][0]["plans"] == 6
    lines = [json.loads(x) for x in (work / "measured_shards.jsonl").read_text().splitlines()]
    assert lines and all(set(x) >= {"tables", "fw_ms", "bw_ms", "batch_size", "hardware", "date"} for x in lines)
    assert all(x["fw_ms"] > 0 and x["bw_ms"] > 0 for x in lines)
    assert sum(x.get("kind") == "random" for x in lines) == 4
    # row-wise blocks and data-parallel replicas go to a file of their own, each piece described
    pieces = [json.loads(x) for x in (work / "measured_shards_pieces.jsonl").read_text().splitlines()]
    assert sum(x.get("kind") == "random_pieces" for x in pieces) == 4
    assert all(len(x["pieces"]) == len(x["tables"]) and x["fw_ms"] > 0 for x in pieces)
    assert {p["kind"] for x in pieces for p in x["pieces"]} >= {"row_wise", "data_parallel"}
    assert summary["special_shards"]["shards"] == 4
    # each plan's slowest device measured again (the default): every plan of both sets confirmed
    assert [s["confirmed"]["plans"] for s in summary["sets"]] == [len(s["plans"]) for s in summary["sets"]]
    assert "confirmed: each plan's slowest device measured again afresh" in out


def test_special_shards_are_shaped_like_a_plan_device():
    from shardcore.plan import DATA_PARALLEL, ROW_WISE
    from tools.gpu_check_lib import shard_class, shard_line, special_shards

    tables = [TableConfig(i, 1000 + 10 * i, 16, 2.0 + i % 5) for i in range(40)]
    shards = special_shards(tables, 12)
    assert [shard_class(s) for s in shards[:2]] == ["rw", "dp"]
    for k, s in enumerate(shards):
        kinds = {getattr(t, "kind", "table_wise") for t in s}
        assert kinds <= ({"table_wise", ROW_WISE} if k % 2 == 0 else {"table_wise", DATA_PARALLEL})
        assert len({t.batch_part for t in s if getattr(t, "kind", None) == DATA_PARALLEL}) <= 1   # one slice
    line = shard_line(shards[1], 1.0, 2.0, batch_size=64)
    assert line["tables"] == [[t.index, t.dim] for t in shards[1]] and line["batch_size"] == 64
    assert [p["kind"] for p in line["pieces"]] == [getattr(t, "kind", "table_wise") for t in shards[1]]
    assert "pieces" not in shard_line(tables[:3], 1.0, 2.0)


def test_special_shards_at_other_slices_pair_with_the_default_ones():
    from shardcore.plan import DATA_PARALLEL
    from tools.gpu_check_lib import special_shards

    tables = [TableConfig(i, 1000 + 10 * i, 16, 2.0 + i % 5) for i in range(40)]
    default, other = special_shards(tables, 12), special_shards(tables, 12, slices=(2, 16))
    for a, b in zip(default, other):
        assert [t.index for t in a] == [t.index for t in b]        # the same tables, shard by shard
    parts = {t.batch_part for s in other for t in s if getattr(t, "kind", None) == DATA_PARALLEL}
    assert parts and {n for _, n in parts} <= {2, 16} and all(0 <= j < n for j, n in parts)


def test_a_plans_slowest_device_is_confirmed_by_a_second_and_a_third_measurement():
    """Seen on an H200: one device of a TorchRec plan measured 0.4-0.7 ms slow once; a second
    measurement that disagrees by more than 2% calls a third, and the median counts."""
    from types import SimpleNamespace

    from tools.gpu_check_lib import confirm_slowest

    class FakeEvaluator:
        def __init__(self, answers):
            self.answers, self.asked = list(answers), []

        def measure_devices(self, shards, no_cache=False):
            assert no_cache and len(shards) == 1
            self.asked.append(shards[0])
            fw, bw = self.answers.pop(0)
            return [SimpleNamespace(fw_ms=fw, bw_ms=bw)]

    shards = [["a"], ["b"], []]
    # device 1 slowest (1.0 + 0.2 + 0.2 + 2.0 = 3.4): measured at 0.7 + 1.5, then 0.71 + 1.5 -> the median
    # 2.21 counts; device 0 (2.8) is now the slowest, confirmed at once by a second measurement within 2%
    result = SimpleNamespace(device_costs_ms=[[1.0, 0.2, 0.2, 1.4], [1.0, 0.2, 0.2, 2.0], [0, 0, 0, 0]], cost_ms=3.4)
    ev = FakeEvaluator([(0.7, 1.5), (0.71, 1.5), (1.0, 1.41)])
    made, notes = confirm_slowest(ev, result, shards)
    assert made == 3 and ev.asked == [["b"], ["b"], ["a"]] and len(notes) == 1 and notes[0].startswith("device 1:")
    assert list(result.device_costs_ms[1]) == [0.71, 0.2, 0.2, 1.5] and list(result.device_costs_ms[0]) == [1.0, 0.2, 0.2, 1.4]
    assert result.cost_ms == pytest.approx(2.8)
    # a second measurement within 2% changes nothing
    result = SimpleNamespace(device_costs_ms=[[1.0, 0.0, 0.0, 1.0]], cost_ms=2.0)
    assert confirm_slowest(FakeEvaluator([(1.01, 1.0)]), result, [["a"]]) == (1, [])
    assert [list(c) for c in result.device_costs_ms] == [[1.0, 0.0, 0.0, 1.0]] and result.cost_ms == 2.0


def test_gpu_check_measures_the_ns_set(tmp_path):
    """--sets NS: the NeuroShard-style set (dims 4-128, its own 0.5 GB cap), here at the tiny size."""
    work = tmp_path / "gc"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gpu_check.py"), "--device", "cpu",
                           "--sets", "NS", "--alg", "lookup_greedy", "--max-tasks", "1", "--noise-repeats", "1",
                           "--work-dir", str(work), "--time-budget", "200"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((work / "gpu_check.json").read_text())
    (s,) = summary["sets"]
    assert s["name"].startswith("NS-tiny") and s["ndevices"] == 4 and len(s["plans"]) == 1
    task_line = (work / "tasks_ns_10_test.txt").read_text().splitlines()[0].split()
    assert len(task_line) == 2 and set(map(int, task_line[1].split(","))) <= {4, 8, 16, 32, 64, 128}
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gpu_check.py"), "--device", "cpu", "--sets", "XY"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip() == ("error: --sets: unknown task set 'XY' "
                                                         "(DLRM-50, DLRM-100, NS, DLRM-50-train, DLRM-100-train)")


def test_the_training_pool_holds_no_test_table_and_the_train_sets_only_its_tables():
    """The training pool (gen_tasks.py's default split) is disjoint from every shipped test set, and the
    shipped -train sets draw from it alone: their plans' devices never hold a test task's table."""
    from shardcore.oracles.emulated.emulator import GPUCHECK_SETS, TASK_FILES
    from tools.gpu_check_lib import SHIPPED_SETS, training_pool

    pool = set(training_pool(856))
    assert len(pool) == 428
    for name, (fname, ndev, _cap) in SHIPPED_SETS.items():
        with open(os.path.join(SHIPPED, "tasks", fname)) as fh:
            ids = {int(v) for line in fh if line.strip() for v in line.split()[0].split(",")}
        assert (ids <= pool) if name.endswith("-train") else not (ids & pool), name
        assert TASK_FILES[GPUCHECK_SETS[name]] == "tasks/" + fname   # the emulator's loader knows every set


def test_random_and_special_shards_from_a_pool():
    from tools.gpu_check_lib import random_shards, special_shards

    tables = [TableConfig(i, 1000 + 10 * i, 16, 2.0 + i % 5) for i in range(80)]
    every = list(range(80))
    # the whole dataset as the pool draws exactly the shards of before (the runs' random streams are kept)
    assert ([[(t.index, t.dim) for t in s] for s in random_shards(tables, 6)]
            == [[(t.index, t.dim) for t in s] for s in random_shards(tables, 6, pool=every)])
    assert ([[t.index for t in s] for s in special_shards(tables, 6)]
            == [[t.index for t in s] for s in special_shards(tables, 6, pool=every)])
    pool = list(range(0, 80, 7))
    for shards in (random_shards(tables, 20, pool=pool), special_shards(tables, 20, pool=pool)):
        assert all(s and {t.index for t in s} <= set(pool) for s in shards)


def test_gpu_check_measures_a_training_set_and_shards_of_the_training_pool(tmp_path):
    """--sets DLRM-50-train --shard-pool train (tiny, on the CPU): plan devices and random shards of the
    training pool only; every plan device's line names its set."""
    from tools.gpu_check_lib import training_pool

    work = tmp_path / "gc"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gpu_check.py"), "--device", "cpu",
                           "--sets", "DLRM-50-train", "--alg", "lookup_greedy", "--max-tasks", "1", "--noise-repeats", "1",
                           "--bench-iters", "2", "--random-shards", "3", "--special-shards", "2", "--shard-pool", "train",
                           "--no-confirm", "--work-dir", str(work), "--time-budget", "200"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((work / "gpu_check.json").read_text())
    (s,) = summary["sets"]
    assert s["name"].startswith("DLRM-50-train-tiny") and summary["shard_pool"] == "train"
    pool = set(training_pool(60))
    with open(work / "tasks_dlrm50_10_train.txt") as fh:
        assert {int(v) for v in fh.readline().split()[0].split(",")} <= pool
    lines = [json.loads(x) for x in (work / "measured_shards.jsonl").read_text().splitlines()]
    lines += [json.loads(x) for x in (work / "measured_shards_pieces.jsonl").read_text().splitlines()]
    randoms = [x for x in lines if x.get("kind") in ("random", "random_pieces")]
    assert len(randoms) == 5 and all(x["pool"] == "train" for x in randoms)
    assert all({i for i, _ in x["tables"]} <= pool for x in lines)
    assert all(x["set"] == "DLRM-50-train-tiny" for x in lines if "task" in x)
    assert "of the 30 tables of the training pool" in proc.stdout


def test_gpu_check_bad_input(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gpu_check.py"), "--device", "cpu",
                           "--compare", str(tmp_path / "nope.jsonl")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: --compare: file not found: {tmp_path / 'nope.jsonl'}"]


# -- the emulated-H200 oracle ------------------------------------------------------------------
SHIPPED = os.path.join(ROOT, "data", "gpu_measurements")


def test_eval_on_the_emulated_h200_needs_no_data_pt(tmp_path):
    out = tmp_path / "emu.jsonl"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--alg", "random,lookup_greedy",
                           "--task-path", os.path.join(SHIPPED, "tasks", "dlrm_tasks_50_test.txt"),
                           "--data-dir", os.path.join(SHIPPED, "dlrm_b65536"), "--max-tasks", "3",
                           "--oracle", "emulated:h200", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "emulated NVIDIA H200" in proc.stdout and "batch 65536" in proc.stdout
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 6
    for rec in recs:
        assert rec["parts"]["compute"].startswith("modelled (emulated:h200")
        assert rec["parts"]["comm"].startswith("modelled (analytic")
        assert "emulated NVIDIA H200" in rec["hardware"] and rec["batch_size"] == 65536
        assert 0.5 < rec["cost_ms"] < 20        # the H200 measured 2.7-5.4 ms for these plans' compute
    mean = {a: sum(r["cost_ms"] for r in recs if r["alg"] == a) / 3 for a in ("random", "lookup_greedy")}
    assert mean["lookup_greedy"] < mean["random"]   # the GPU landscape: 4.2 vs 2.8 ms measured


def test_eval_judged_by_devices_and_shardkit_still_plans_without_the_tables(tmp_path):
    """--emulator-fit devices judges every plan with the fit that never saw a device of the task (its
    tables seen among others); shardkit still plans with a model that never saw the tables at all."""
    out = tmp_path / "emu.jsonl"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--alg", "lookup_greedy,shardkit",
                           "--task-path", os.path.join(SHIPPED, "tasks", "dlrm_tasks_50_test.txt"),
                           "--data-dir", os.path.join(SHIPPED, "dlrm_b65536"), "--max-tasks", "1",
                           "--oracle", "emulated:h200", "--emulator-fit", "devices", "--shardkit-time", "0.5",
                           "--out", str(out)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 2 and all("held out by devices" in r["hardware"] for r in recs)
    sk = next(r for r in recs if r["alg"] == "shardkit")
    assert "refitted without the task's 50 measured tables" in sk["shardkit_model"]


def test_emulated_oracle_with_lookups_uses_the_measured_bag_lengths(tiny):
    from shardcore.oracles.emulated.oracle import EmulatedOracle

    path, tables = tiny
    with EmulatedOracle(path, 3) as emu:
        assert emu.batch_size == 96 and emu.length_cv is not None and len(emu.length_cv) == len(tables)
        r = emu.evaluate([tables[:5], tables[5:9], []])
    assert list(r.device_costs_ms[2]) == [0.0, r.device_costs_ms[2][1], r.device_costs_ms[2][2], 0.0]
    assert all(d[0] > 0 and d[3] > 0 for d in r.device_costs_ms[:2])
    assert r.parts["compute"].startswith("modelled")


@pytest.mark.parametrize("extra, msg", [
    (["--oracle", "emulated:a100"], "unknown oracle 'emulated:a100': choose one of measured, emulated:h200"),
    (["--oracle", "emulated:h200", "--optimizer", "exact_adagrad"], "was measured with exact_sgd only"),
    (["--oracle", "emulated:h200", "--comm-bandwidth", "inf"], "--comm-bandwidth: expected a finite number"),
])
def test_emulated_oracle_bad_input(extra, msg, tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--task-path",
                           os.path.join(SHIPPED, "tasks", "dlrm_tasks_50_test.txt"), "--max-tasks", "1",
                           "--data-dir", os.path.join(SHIPPED, "dlrm_b65536")] + extra,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and msg in lines[0], proc.stderr


def test_emulated_oracle_without_a_batch_says_how(tmp_path):
    cfgs = json.loads(open(os.path.join(SHIPPED, "dlrm_b65536", "table_configs.json")).read())
    cfgs.pop("batch_size")
    (tmp_path / "table_configs.json").write_text(json.dumps(cfgs))
    from shardcore.oracles.emulated.oracle import EmulatedOracle

    with pytest.raises(ShardError, match="--batch-size"):
        EmulatedOracle(tmp_path, 4)
    assert EmulatedOracle(tmp_path, 4, batch_size=65536).batch_size == 65536


def test_plans_made_elsewhere_are_measured_as_given(tmp_path):
    from shardcore.errors import InfeasibleError
    from tools.gpu_check_lib import _load_plans
    from shardcore.tables import TableConfig
    from shardcore.tasks import Task

    tasks = {"A (2)": [Task((3, 5, 7)), Task((1, 2))]}
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"task": 0, "alg": "torchrec", "feasible": True, "allocation": [1, 0, 1], "ndevices": 2},
        {"task": 1, "alg": "torchrec", "feasible": True, "allocation": [0, 1, 1], "ndevices": 2, "splits": [1, 2]},
        {"task": 1, "alg": "other", "feasible": False, "allocation": None, "ndevices": 2}]) + "\n")
    name, got = _load_plans(str(f), ["A (2)"], tasks)
    assert name == "A (2)" and list(got) == ["torchrec"]
    tables = [TableConfig(i, 100, 16, 2.0) for i in (3, 5, 7)]
    assert got["torchrec"].shard(tables, Topology(2, 5.0)).allocation == (1, 0, 1)
    assert got["torchrec"].shard([TableConfig(1, 10, 8, 1.0), TableConfig(2, 10, 8, 1.0)], Topology(2, 5.0)).splits == (1, 2)
    with pytest.raises(InfeasibleError, match="no plan for this task"):
        got["torchrec"].shard([TableConfig(9, 10, 8, 1.0)], Topology(2, 5.0))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"task": 0, "alg": "x", "feasible": True, "allocation": [0, 1], "ndevices": 2}) + "\n")
    with pytest.raises(ShardError, match="does not fit task 0"):
        _load_plans(str(bad), ["A (2)"], tasks)
    with pytest.raises(ShardError, match="no task set named 'B'"):
        _load_plans(f"B={f}", ["A (2)"], tasks)
    # --plans-algs: only those algorithms' plans are measured
    assert list(_load_plans(str(f), ["A (2)"], tasks, ("torchrec", "shardkit"))[1]) == ["torchrec"]
    with pytest.raises(ShardError, match="no feasible plan of --plans-algs shardkit in it"):
        _load_plans(str(f), ["A (2)"], tasks, ("shardkit",))


def test_the_noise_shard_is_dlrm50s_first_task_whichever_set_comes_first():
    """Runs compare their machines by one shard (every shipped run's: the first 25 tables of DLRM-50's task 0)."""
    from tools.gpu_check_lib import noise_task

    with open(os.path.join(SHIPPED, "tasks", "dlrm_tasks_50_test.txt")) as fh:
        first = tuple(int(v) for v in fh.readline().split()[0].split(","))
    assert tuple(noise_task(856, ["not this"]).table_ids) == first
    assert noise_task(60, ["the first set's"]) == "the first set's"
