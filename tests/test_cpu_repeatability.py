"""The measured CPU oracle's repeatability protocol: small pages, the lower quartile, the reference
shard and its nominal speed kept in the measurement cache (shardcore.oracles.measured.driver, 'Repeatability on the
CPU'); and tools/cpu_repeatability.py's figures."""

from __future__ import annotations

import json
import mmap
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from shardcore.oracles.measured import benchmark
from shardcore.oracles.measured.benchmark import ReferenceRunner, _lazy_zeros
from shardcore.oracles.setting import CPU_PROTOCOL, hardware_fingerprint
from shardcore.oracles.cache import CachedOracle, CostCache
from shardcore.oracles.measured.driver import PlanEvaluator
from shardcore.errors import ShardError
from shardcore.oracles.measured.worker import low_quantile
from tests.test_evaluator import make_data

ROOT = Path(__file__).resolve().parent.parent


def test_low_quantile_is_the_lower_quartile_between_order_statistics():
    assert low_quantile([4.0, 1.0, 3.0, 2.0, 5.0]) == pytest.approx(2.0)
    assert low_quantile([1.0, 2.0]) == pytest.approx(1.25)
    assert low_quantile([7.0]) == 7.0
    assert low_quantile([1.0, 2.0, 3.0], 0.0) == 1.0 and low_quantile([1.0, 2.0, 3.0], 1.0) == 3.0
    # one slow, disturbed sample of seven moves the median's neighbour, not the lower quartile
    calm = [10.0, 10.1, 10.2, 10.3, 10.4, 10.5, 10.6]
    assert low_quantile(calm[:-1] + [30.0]) == low_quantile(calm)


def test_weights_are_lazily_committed_zeros_in_small_pages():
    t = _lazy_zeros(1 << 20, torch.float16)
    assert t.shape == (1 << 20,) and t.dtype == torch.float16 and float(t.abs().sum()) == 0.0
    t[123] = 2.0   # writable
    assert float(t.sum()) == 2.0
    assert hasattr(mmap, "MADV_NOHUGEPAGE")   # Linux: the advice is really given
    assert _lazy_zeros(0, torch.float32).numel() == 0


def test_reference_runner_is_fixed_and_costs_time():
    torch.set_num_threads(1)
    a = ReferenceRunner(256)
    b = ReferenceRunner(256)
    assert torch.equal(a.indices, b.indices) and torch.equal(a.offsets, b.offsets)
    assert a.num_lookups == 256 * benchmark.REFERENCE_POOLING
    assert a.tables[0].row == benchmark.REFERENCE_ROWS and a.tables[0].dim == benchmark.REFERENCE_DIM
    fw, bw = a.sample(1, 3)
    assert len(fw) == len(bw) == 3 and min(fw) > 0 and min(bw) > 0


def test_a_shards_samples_sit_between_reference_blocks_each_warm_on_its_own(tmp_path):
    """The reference is timed in a block of its own before and after the shard's back-to-back samples, each
    block after one untimed iteration: neither is timed right after the other has filled the caches."""
    torch.set_num_threads(1)
    tables = make_data(tmp_path / "ds")
    ref = ReferenceRunner(64)
    calls = []
    real = ref.sample

    def counted(warmup, iters, *a):
        calls.append((warmup, iters))
        return real(warmup, iters, *a)

    ref.sample = counted
    runner = benchmark.ShardRunner(tmp_path / "ds", [tables[0], tables[1]], batch_size=64)
    own = []
    shard_sample = runner.sample
    runner.sample = lambda warmup, iters, *a: own.append((warmup, iters)) or shard_sample(warmup, iters, *a)
    fw, bw, refs = runner.sample_blocked(ref, 0, 4)
    assert len(fw) == len(bw) == 4 and min(fw) > 0 and min(bw) > 0
    assert len(refs) == 2 * benchmark.REFERENCE_BLOCK_ITERS and min(refs) > 0
    assert calls == [(1, benchmark.REFERENCE_BLOCK_ITERS)] * 2   # a warm block before and after
    assert own == [(1, 4)]                                       # the shard warmed once, then timed back to back
    empty = benchmark.ShardRunner(tmp_path / "ds", [], batch_size=64)
    assert empty.sample_blocked(ref, 1, 3) == ([0.0] * 3, [0.0] * 3, [1.0]) and len(calls) == 2


def test_a_sample_taken_while_the_machine_ran_slow_counts_at_the_nominal_speed():
    """Each sample is divided by the reference's time at its own moment: a shard timed at 10 ms while the
    reference took 5 (nominal) and at 20 ms while it took 10 (the machine at half speed) costs 10 ms."""
    from shardcore.oracles.measured.driver import at_nominal_speed

    fw, bw, refs = [4.0, 8.0, 4.0, 8.0], [6.0, 12.0, 6.0, 12.0], [5.0, 10.0, 5.0, 10.0]
    c = at_nominal_speed(fw, bw, refs, nominal=5.0)
    assert (c.fw_ms, c.bw_ms) == pytest.approx((4.0, 6.0))
    # a slow spell hitting the shard but not the reference is a disturbed sample: the lower quartile drops it
    c = at_nominal_speed([4.0, 4.0, 4.0, 9.0], [6.0, 6.0, 6.0, 9.0], [5.0] * 4, nominal=2.5)
    assert (c.fw_ms, c.bw_ms) == pytest.approx((2.0, 3.0))
    with pytest.raises(ShardError, match="one reference time per sample"):
        at_nominal_speed([1.0, 2.0], [1.0, 2.0], [1.0], nominal=1.0)


def test_steady_heap_stops_page_faults_of_repeated_large_buffers():
    # a fresh process: 64 MB allocated and freed 20 times commits its pages once with the steady heap,
    # every time without it (glibc maps blocks that large afresh)
    code = """
import resource, sys, torch
from shardcore.oracles.measured.worker import steady_heap
if sys.argv[1] == "steady":
    assert steady_heap()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):   # warm-up, as a worker's: the heap settles within the first few (3 were sometimes too few)
    torch.ones(16 << 20)
f0 = faults()
for _ in range(20):
    torch.ones(16 << 20)
print(faults() - f0)
"""
    got = {}
    for mode in ("steady", "default"):
        proc = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        got[mode] = int(proc.stdout.strip().splitlines()[-1])
    pages = (64 << 20) // mmap.PAGESIZE
    assert got["steady"] < pages // 10 and got["default"] > 10 * pages, got


def test_cpu_fingerprint_names_the_protocol():
    assert json.loads(hardware_fingerprint())["protocol"] == CPU_PROTOCOL
    assert "protocol" not in json.loads(hardware_fingerprint("NVIDIA H200"))


def test_the_first_nominal_reference_wins(tmp_path):
    store = CostCache(tmp_path / "c.sqlite")
    assert store.reference_ms("k") is None
    assert store.store_reference_ms("k", 20.5) == pytest.approx(20.5)
    assert store.store_reference_ms("k", 99.0) == pytest.approx(20.5)
    assert store.reference_ms("k") == pytest.approx(20.5) and store.reference_ms("other") is None


def test_costs_are_the_warm_samples_and_the_speed_rules_share_their_samples(tmp_path):
    """By default a CPU cost is the lower quartile of the shard's own samples, no reference timed; with
    speed_rules the same samples are also worked out by every rule, the reported one first, and the
    reference's nominal is calibrated once and kept in the cache for a later session."""
    from shardcore.oracles.measured.driver import SPEED_RULES

    tables = make_data(tmp_path / "ds")
    store = CostCache(tmp_path / "c.sqlite")
    shards = [[tables[0], tables[3]], [tables[1]]]
    with CachedOracle(PlanEvaluator(tmp_path / "ds", 2, bench_iters=3, warmup_iters=1), store) as ev:
        res = ev.evaluate(shards, no_cache=True)
        assert "lower quartile" in res.parts["compute"] and ev.oracle.reference_nominal_ms is None
        assert ev.oracle.speed_rule_costs == {} and res.cost_ms > 0
    with CachedOracle(PlanEvaluator(tmp_path / "ds", 2, bench_iters=3, warmup_iters=1, speed_rules=True), store) as ev:
        res = ev.evaluate(shards, no_cache=True)
        nominal = ev.oracle.reference_nominal_ms
        assert nominal and nominal > 0 and store.reference_ms(ev.oracle.reference_key) == pytest.approx(nominal)
        rules = ev.oracle.speed_rule_costs
        assert set(rules) == {0, 1} and all(set(r) == set(SPEED_RULES) for r in rules.values())
        for d, c in enumerate(res.devices):   # the reported cost is the first rule's
            first = rules[d][SPEED_RULES[0]]
            assert (c.fw_comp, c.bw_comp) == pytest.approx((first.fw_ms, first.bw_ms))
        assert ev.oracle.speed_drift_pct is None or ev.oracle.speed_drift_pct >= 0
    # a later session takes the stored nominal instead of calibrating its own
    with CachedOracle(PlanEvaluator(tmp_path / "ds", 2, bench_iters=3, warmup_iters=1, speed_rules=True), store) as ev2:
        ev2.evaluate(shards, no_cache=True)
        assert ev2.oracle.reference_nominal_ms == pytest.approx(nominal)


def test_repeatability_tool_prints_its_three_figures(tmp_path):
    make_data(tmp_path / "ds")
    out = tmp_path / "rep.jsonl"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "cpu_repeatability.py"), "--data-dir", str(tmp_path / "ds"),
         "--num-tasks", "2", "--num-tables", "4", "--rounds", "2", "--ndevices", "2", "--bench-iters", "2",
         "--warmup-iters", "1", "--cache-path", str(tmp_path / "c.sqlite"), "--out", str(out), "--runs", "2"],
        capture_output=True, text=True, cwd=ROOT, timeout=280)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # each run's report, then the figures over the runs
    for label, times in (("mean deviation from the median", 3), ("p90 max/min", 3),
                         ("round-pair Spearman per task", 3), ("where it comes from", 2)):
        assert proc.stdout.count(label) == times, label
    assert "over 2 runs" in proc.stdout and "pass 2 of 2" in proc.stdout
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [sum(1 for r in lines if r.get("run") == k) for k in (0, 1)] == [2 * 4 * 2] * 2   # each run's rounds
    assert lines[-1]["summary"]["rounds"] == 2 and lines[-1]["summary"]["mean_dev_pct"] >= 0
    assert set(lines[-1]["summary"]["sources"]) == {"compute_pct", "exchange_pct"}
    runs, spread = lines[-1]["runs"], lines[-1]["across_runs"]
    assert len(runs) == 2 and runs[-1] == lines[-1]["summary"]
    vals = [r["mean_dev_pct"] for r in runs]
    assert spread["mean_dev_pct"]["min"] == min(vals) and spread["mean_dev_pct"]["max"] == max(vals)


def test_across_runs_gives_the_spread_and_the_runs_that_met_each_goal():
    from tools.cpu_repeatability import across_runs

    runs = [{"mean_dev_pct": 1.4, "p90_maxmin": 1.10, "spearman": 0.9},
            {"mean_dev_pct": 2.0, "p90_maxmin": 1.04, "spearman": 0.7},
            {"mean_dev_pct": 3.0, "p90_maxmin": 1.20, "spearman": 0.85}]
    got = across_runs(runs)
    assert got["mean_dev_pct"] == {"min": 1.4, "median": 2.0, "max": 3.0, "met": 1, "runs": 3}
    assert got["p90_maxmin"]["met"] == 1 and got["spearman"]["met"] == 2 and got["spearman"]["median"] == 0.85


def test_deviation_sources_hold_one_part_at_its_median():
    from tools.cpu_repeatability import deviation_sources

    # two devices, three rounds: the compute of device 0 moves (9, 10, 11 ms), every exchange is 1 ms but
    # device 1's, which moves (0.5, 1, 1.5 ms) on a compute of 2 ms: only the compute moves the plan cost
    rounds = [[[c / 2, 1.0, 0.0, c / 2], [1.0, x, 0.0, 1.0]] for c, x in ((9, 0.5), (10, 1.0), (11, 1.5))]
    got = deviation_sources({(0, "a"): rounds})
    assert got["compute_pct"] == pytest.approx(100 * (1 / 11 + 0 + 1 / 11) / 3)
    assert got["exchange_pct"] == pytest.approx(0.0)


def test_repeatability_tool_refuses_an_emulated_oracle():
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "cpu_repeatability.py"), "--oracle", "emulated:h200"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode != 0 and "measured oracle" in proc.stderr and "Traceback" not in proc.stderr
