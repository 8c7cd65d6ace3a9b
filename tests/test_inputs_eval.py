"""eval.py's and eval_simulator.py's inputs and the checks that must come before any measuring worker starts
(shardkit's model, cost data, start checkpoints, cache, calibration pool)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardcore.errors import ShardError

from helpers import ROOT, attack_base, check_one_line_case, make_dataset, one_line_error, run_script


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return attack_base(tmp_path_factory, "test_inputs_eval")


def ep(base, ds=None, tasks=None, *extra):
    """The attack tables' base command: eval.py --plan-only on 4 devices, cap 5 GB."""
    return ["--task-path", tasks or base / "tasks.txt", "--data-dir", ds or base / "ds",
            "--gpu-devices", "0,1,2,3", "--max-memory", 5, "--plan-only", "--quiet", *extra]


CASES = [
    ("2-max-memory-inf", "eval.py", lambda b, t: ep(b, None, None, "--alg", "torchrec", "--max-memory", "inf"),
     r"--max-memory.*finite"),
    ("8-max-tasks-negative", "eval.py", lambda b, t: ep(b, None, None, "--max-tasks", -1), r"--max-tasks.*positive"),
    ("8-max-tasks-zero", "eval.py", lambda b, t: ep(b, None, None, "--max-tasks", 0), r"--max-tasks.*positive"),
    ("minor-unknown-flag", "eval.py", lambda b, t: ["--no-such-flag"], r"^error: \S+: unrecognized arguments: --no-such-flag \(see --help\)$"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line(case, base, tmp_path, capsys):
    check_one_line_case(case, base, tmp_path, capsys)


def test_max_tasks_counts_exactly(base, capsys):
    code, out, err = run_script("eval.py", ep(base, None, None, "--max-tasks", 3), capsys)
    assert code == 0, err
    assert out.startswith("3 tasks from")


def measured(base, *extra):
    return ["--task-path", base / "tasks.txt", "--data-dir", base / "ds", "--gpu-devices", "0,1",
            "--max-memory", 5, "--quiet", *extra]


@pytest.fixture
def no_workers(monkeypatch):
    """Any measuring worker started fails the test."""
    from shardcore.oracles.measured import driver as evaluator
    from shardkit_planner import sharder

    def start(self):
        raise AssertionError("a measuring worker was started")

    monkeypatch.setattr(evaluator.PlanEvaluator, "start", start)
    monkeypatch.setattr(sharder, "DEFAULT_CPU_MODEL", Path("/nonexistent/cpu_cost_model.json"))


@pytest.mark.parametrize("rel, what", [(rel, what) for rel in ("eval.py", "plan.py")
                                        for what in ("model", "cost_data", "starts", "cache")
                                        if (rel, what) != ("plan.py", "cost_data")])   # plan.py always calibrates
def test_shardkit_needs_checked_before_workers(rel, what, base, tmp_path, capsys, no_workers):
    cache = tmp_path / "cache.sqlite"
    flags = {"model": ["--shardkit-model", tmp_path / "missing.json"],
             "cost_data": ["--shardkit-calibrate", 0, "--cache-path", cache],
             "starts": ["--shardkit-starts", f"model_greedy,{tmp_path / 'missing.pt'}", "--cache-path", cache],
             "cache": ["--cache-path", tmp_path]}[what]
    pattern = {"model": r"missing\.json", "cost_data": r"--alg shardkit on the measured oracle: .*(cost model|shard measurements)",
               "starts": r"checkpoint not found: .*missing\.pt", "cache": r"is a directory"}[what]
    if rel == "eval.py":
        argv = measured(base, "--alg", "shardkit", *flags)
    else:
        argv = ["--tables", base / "ds" / "table_configs.json", "--ndevices", 2, "--max-memory", 5,
                "--alg", "shardkit", "--oracle", "measured", "--out", tmp_path / "plan.json", *flags]
    code, out, err = run_script(rel, argv, capsys)
    one_line_error(code, err, pattern)
    assert "oracle ready" not in out
    assert not (tmp_path / "plan.json").exists()


def test_missing_start_checkpoint_stops_before_real_workers(base, tmp_path):
    """The real measured oracle (spawned CPU workers): the error comes at once, no worker started."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = [sys.executable, str(ROOT / "eval.py"), *map(str, measured(
        base, "--alg", "size_greedy,shardkit", "--shardkit-starts", tmp_path / "missing.pt",
        "--cache-path", tmp_path / "c.sqlite"))]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "Traceback" not in proc.stderr
    assert "checkpoint not found" in proc.stderr and "oracle ready" not in proc.stdout
    assert "measuring" not in proc.stdout
    assert time.perf_counter() - t0 < 60     # imports included; no worker was spawned


def test_calibration_pool_checked_before_workers(tmp_path, capsys, monkeypatch):
    """Tasks over every table leave shardkit nothing to calibrate on: said before any worker starts
    (it was found after the workers started)."""
    from shardcore.oracles.measured import driver
    from shardkit_planner import sharder

    def start(self):
        raise AssertionError("a measuring worker was started")

    monkeypatch.setattr(driver.PlanEvaluator, "start", start)
    monkeypatch.setattr(sharder, "DEFAULT_CPU_MODEL", Path("/nonexistent/cpu_cost_model.json"))
    make_dataset(tmp_path / "ds", num_tables=12, batch_size=8)
    (tmp_path / "tasks.txt").write_text("0,1,2,3,4,5\n6,7,8,9,10,11\n")
    code, out, err = run_script("eval.py", ["--task-path", tmp_path / "tasks.txt", "--data-dir", tmp_path / "ds",
                                            "--gpu-devices", "0,1", "--max-memory", 5, "--quiet", "--alg", "shardkit",
                                            "--cache-path", tmp_path / "c.sqlite"], capsys)
    one_line_error(code, err, r"shardkit cannot calibrate: only 0 tables of .* lie outside the tasks")
    assert "oracle ready" not in out


def test_simulator_setting_warned_before_workers(tmp_path, capsys, monkeypatch):
    """eval_simulator.py --measure: NeuroShard models trained at another batch are said so before any
    measuring worker starts."""
    from shardcore.oracles.measured import driver

    def start(self):
        raise ShardError("no worker may start in this test")

    monkeypatch.setattr(driver.PlanEvaluator, "start", start)
    make_dataset(tmp_path / "ds", num_tables=12, batch_size=8)
    (tmp_path / "tasks.txt").write_text("0,1,2,3,4,5\n6,7,8,9,10,11\n")
    ns = ROOT / "models" / "anchors" / "h200" / "neuroshard"   # trained at batch 65536
    code, out, err = run_script("eval_simulator.py", [
        "--task-path", tmp_path / "tasks.txt", "--data-dir", tmp_path / "ds", "--gpu-devices", "0,1",
        "--max-memory", 5, "--quiet", "--alg", "size_lookup_greedy", "--measure", "--cache-path", tmp_path / "c.sqlite",
        "--compute-model", ns / "compute.pt", "--fw-comm-model", ns / "fw_comm.pt", "--bw-comm-model", ns / "bw_comm.pt"],
        capsys)
    assert code != 0 and "no worker may start" in err
    warned = err.index("plans will run at 8")
    assert warned < err.index("no worker may start") and "workers up" not in out


def test_repeats_refused_where_nothing_noisy_is_measured(base, capsys):
    """--repeats takes medians of a measured oracle's noise: on --plan-only, or on an emulated oracle (the
    same answer every time), it would only repeat the work."""
    code, _, err = run_script("eval.py", ep(base, None, None, "--repeats", 3), capsys)
    one_line_error(code, err, r"--repeats 3: --plan-only measures nothing")
    argv = [a for a in ep(base) if a != "--plan-only"]
    code, _, err = run_script("eval.py", [*argv, "--oracle", "emulated:h200", "--repeats", 2], capsys)
    one_line_error(code, err, r"--repeats 2: the emulated:h200 oracle is a model that answers a plan the same")
