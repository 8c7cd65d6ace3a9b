"""Issue #28, hardening round three, grouped by class: checks that came too late (shardkit's cost data,
its start checkpoints and the cache found before any measuring worker starts), shardkit's time budget,
trained models kept only when finite and better than untrained, --resume for DreamShard, and
provenance (a prediction never read as a measurement). Scripts run through ``run_main`` in this
process (a traceback fails the test), except where a real measured oracle is the point."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from shardcore.errors import ShardError

from helpers import make_dataset
from test_hardening import run_script
from test_hardening2 import one_line_error

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("hardening3")
    make_dataset(d / "ds", num_tables=12, batch_size=8)
    (d / "tasks.txt").write_text("0,1,2,3\n4,5,6\n")
    return d


def measured(base, *extra):
    return ["--task-path", base / "tasks.txt", "--data-dir", base / "ds", "--gpu-devices", "0,1",
            "--max-memory", 5, "--quiet", *extra]


@pytest.fixture
def no_workers(monkeypatch):
    """Any measuring worker started fails the test."""
    from shardcore import evaluator
    from shardkit_planner import sharder

    def start(self):
        raise AssertionError("a measuring worker was started")

    monkeypatch.setattr(evaluator.PlanEvaluator, "start", start)
    monkeypatch.setattr(sharder, "DEFAULT_CPU_MODEL", Path("/nonexistent/cpu_cost_model.json"))


# -- class 1: checks that came too late ---------------------------------------------------------------------
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


# -- class 2: shardkit's time budget at 100k tables (what it covers; the O(tables) parts stay exact) -------
def _tables(n, seed=0):
    import random

    from shardcore.tables import TableConfig

    rng = random.Random(seed)
    return [TableConfig(i, rng.choice([10, 1000, 10 ** 5, 10 ** 6]), rng.choice([4, 8, 16, 64]),
                        rng.choice([1.0, 2.5, 10.0])) for i in range(n)]


@pytest.mark.parametrize("cap", [0.05, 0.2, 10.0])   # tight caps: devices fill, the heap skips them
def test_greedy_in_log_devices_chooses_as_before(cap):
    from shardcore.baselines import GREEDY_KEYS, _has_room, greedy_plan
    from shardcore.errors import InfeasibleError

    tables, n = _tables(300), 7
    for key in GREEDY_KEYS.values():
        keys = [float(key(t)) for t in tables]
        order = sorted(range(len(tables)), key=lambda i: (keys[i], tables[i].size, tables[i].index, i), reverse=True)
        acc_key, acc_mem, want = [0.0] * n, [0.0] * n, [-1] * len(tables)
        try:
            for i in order:    # the definition: the smallest (key, memory, device) among devices with room
                need = tables[i].memory_gb("fp16")
                legal = [d for d in range(n) if _has_room(acc_mem[d], need, cap)]
                if not legal:
                    raise InfeasibleError("no room")
                d = min(legal, key=lambda d: (acc_key[d], acc_mem[d], d))
                want[i] = d
                acc_key[d] += keys[i]
                acc_mem[d] += need
        except InfeasibleError:
            with pytest.raises(InfeasibleError):
                greedy_plan(tables, n, cap, key)
            continue
        assert list(greedy_plan(tables, n, cap, key).allocation) == want


def test_past_the_deadline_one_start_is_made():
    from shardcore import algorithms

    tables = _tables(40)
    sk = algorithms.resolve("shardkit", oracle="emulated:h200", shardkit_time=0.01)
    model = sk.task_model(tables)
    assert [n for n, _ in sk.start_plans(tables, 4, 10.0, "fp16", model, deadline=0.0)] == ["model_greedy"]
    assert len(sk.start_plans(tables, 4, 10.0, "fp16", model)) == 5
    sk.shard(tables, 4, 10.0)
    assert sk.last_info["shardkit_stopped"] == "time budget" and sk.last_info["shardkit_searched"]
