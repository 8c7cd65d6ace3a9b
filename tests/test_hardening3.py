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
from shardcore.types import Topology

from helpers import make_dataset, small_base
from test_hardening import run_script
from test_hardening2 import one_line_error

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return small_base(tmp_path_factory, "hardening3")


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


# -- class 2: shardkit's budget at 100k tables (what it covers; the O(tables) parts stay exact) -------
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


def test_a_time_cap_shorter_than_the_starts_still_searches_from_one_start():
    from shardcore.cli import algorithms
    from shardkit_planner.starts import PlanningTask

    tables = _tables(40)
    sk = algorithms.resolve("shardkit", oracle="emulated:h200", shardkit_time=1e-6)
    model = sk.task_model(tables)
    starts = sk.start_plans(PlanningTask(tables, Topology(4, 10.0), model, sk.types))
    # every start is made (their work is bounded, not timed): model_, hybrid_, replicate_greedy, four greedy
    # (split_greedy has nothing to split here)
    assert len(starts) == 7
    sk.shard(tables, Topology(4, 10.0))
    assert sk.last_info["shardkit_stopped"] == "time cap" and sk.last_info["shardkit_searched"]


# -- class 4: --resume refuses a checkpoint of another setting (DreamShard; AutoShard in round two) --------
DS_TINY = ["--max-memory", 5, "--bench-steps", 2, "--bench-training-steps", 2, "--rl-num-batches", 1,
           "--rl-batch-size", 2]


def test_dreamshard_resume_refuses_other_settings(base, tmp_path, capsys, no_workers):
    out = tmp_path / "ds_out"
    common = ["--task-path", base / "tasks.txt", "--out-dir", out, *DS_TINY]
    first = [*common, "--data-dir", base / "ds", "--gpu-devices", "0,1", "--oracle", "emulated:h200",
             "--num-iterations", 1]
    code, _, err = run_script("train_dreamshard.py", first, capsys)
    assert code == 0, err[-2000:]
    saved = (out / "0.pt").read_bytes()
    other = tmp_path / "other"
    make_dataset(other, num_tables=12, batch_size=8, seed=7)
    again = [*common, "--resume", "--num-iterations", 2]
    for change, pattern in [
            (["--data-dir", base / "ds", "--gpu-devices", "0,1,2", "--oracle", "emulated:h200"], r"device count 2"),
            (["--data-dir", base / "ds", "--gpu-devices", "0,1", "--oracle", "emulated:h200",
              "--bench-batch-size", 4], r"batch size 8, this run has 4"),
            (["--data-dir", other, "--gpu-devices", "0,1", "--oracle", "emulated:h200"], r"dataset"),
            (["--data-dir", base / "ds", "--gpu-devices", "0,1", "--oracle", "measured",     # no worker starts
              "--cache-path", tmp_path / "c.sqlite"], r"oracle \(hardware\) 'emulated"),
            # a hyper-parameter given with another value than the checkpoint's (it was kept silently before)
            (["--data-dir", base / "ds", "--gpu-devices", "0,1", "--oracle", "emulated:h200", "--rl-lr", "0.01"],
             r"--rl-lr 0\.0005, this run gives 0\.01: a resumed training keeps its hyper-parameters")]:
        code, out_text, err = run_script("train_dreamshard.py", [*again, *change], capsys)
        one_line_error(code, err, r"^error: --resume: the checkpoint was trained with " + pattern)
        assert (out / "0.pt").read_bytes() == saved and not (out / "1.pt").exists()
    code, _, err = run_script("train_dreamshard.py", [*again, "--data-dir", base / "ds", "--gpu-devices", "0,1",
                                                       "--oracle", "emulated:h200", "--rl-lr", "0.0005"], capsys)
    assert code == 0, err[-2000:]          # the same setting resumes
    assert (out / "1.pt").is_file()


# -- class 3: a trained cost model is kept only if it beats its untrained self -----------------------------
def test_cost_model_kept_only_if_it_beats_untrained():
    from neuroshard.config import compute_model_config
    from neuroshard.fitting import _train_loop

    net = torch.nn.Linear(2, 1)
    scores = iter([10.0] + [20.0] * 5)     # untrained 10% validation MAPE, every epoch worse
    x = torch.ones(4, 2)
    with pytest.raises(ShardError, match=r"did not beat the untrained model .*20.00% vs 10.00% untrained.*"
                                         r"nothing saved"):
        _train_loop(net, compute_model_config(epochs=3), (x, torch.ones(4, 1)), predict=lambda b: net(b[0]).abs(),
                    target=lambda b: b[1], weight=lambda b: torch.ones_like(b[1]), val_score=lambda: next(scores),
                    epochs=3)


def test_a_handful_of_validation_samples_is_not_judged():
    """On fewer validation samples than MIN_JUDGED_VALIDATION the untrained and the trained scores are
    within each other's noise: the best epoch is kept, not refused."""
    from neuroshard.config import compute_model_config
    from neuroshard.fitting import MIN_JUDGED_VALIDATION, _train_loop

    net = torch.nn.Linear(2, 1)
    x = torch.ones(4, 2)
    scores = iter([10.0] + [10.5] * 3)
    best_epoch, best_val, _ = _train_loop(
        net, compute_model_config(epochs=3), (x, torch.ones(4, 1)), predict=lambda b: net(b[0]).abs(),
        target=lambda b: b[1], weight=lambda b: torch.ones_like(b[1]), val_score=lambda: next(scores), epochs=3,
        val_count=MIN_JUDGED_VALIDATION - 1)
    assert best_epoch == 0 and best_val == 10.5
    scores = iter([10.0] + [10.5] * 3)
    with pytest.raises(ShardError, match="did not beat the untrained model"):
        _train_loop(net, compute_model_config(epochs=3), (x, torch.ones(4, 1)), predict=lambda b: net(b[0]).abs(),
                    target=lambda b: b[1], weight=lambda b: torch.ones_like(b[1]), val_score=lambda: next(scores),
                    epochs=3, val_count=MIN_JUDGED_VALIDATION)


@pytest.mark.parametrize("rel", ["train_compute_cost_model.py", "train_comm_cost_model.py"])
def test_untrained_as_good_leaves_the_files(rel, tmp_path, capsys, monkeypatch):
    """Training that changes nothing (the optimiser's steps are no-ops) never replaces a model file."""
    from test_hardening2 import compute_csv, good_rows

    import neuroshard.fitting

    monkeypatch.setattr(torch.optim.Adam, "step", lambda self, closure=None: None)
    monkeypatch.setattr(neuroshard.fitting, "MIN_JUDGED_VALIDATION", 1)   # the tiny data's few validation rows
    old_a, old_b = tmp_path / "a.pt", tmp_path / "b.pt"
    for p in (old_a, old_b):
        torch.save({"old": 1}, p)
    before = old_a.read_bytes(), old_b.read_bytes()
    if rel == "train_compute_cost_model.py":
        data = tmp_path / "data"
        data.mkdir()
        compute_csv(data / "compute_costs.csv", good_rows(12))
        argv = ["--data_dir", data, "--out_path", old_a, "--epochs", 2, "--quiet"]
    else:
        from test_hardening import script
        from test_neuroshard_helpers import comm_data

        monkeypatch.setattr(script(rel), "load_comm_data", lambda _: (*comm_data(30), {}))
        argv = ["--data_dir", tmp_path, "--fw_out_path", old_a, "--bw_out_path", old_b, "--epochs", 2, "--quiet"]
    code, _, err = run_script(rel, argv, capsys)
    one_line_error(code, err, r"training did not beat the untrained model on its own validation data")
    assert (old_a.read_bytes(), old_b.read_bytes()) == before


# -- class 5: provenance: a prediction is never read as a measurement -------------------------------------
def test_predictions_fed_back_are_refused(tmp_path, capsys):
    """tools/predict_shard_costs.py marks what it wrote ("predicted", "oracle"); the one reader of shard
    lines (shardcore.oracles.emulated.emulator.read_shard_lines: the emulator's fit, its accuracy tool, this tool) refuses it."""
    from shardcore.dataset import load_table_configs
    from shardcore.oracles.emulated.emulator import MEASUREMENTS_DIR

    configs = Path(MEASUREMENTS_DIR) / "dlrm_b65536" / "table_configs.json"
    if not configs.is_file():
        pytest.skip("no shipped GPU measurements")
    dim = load_table_configs(configs)[0].dim
    src = tmp_path / "shards.jsonl"
    src.write_text(f'{{"tables": [[0, {dim}]], "fw_ms": 1.0, "bw_ms": 2.0}}\n')
    pred = tmp_path / "pred.jsonl"
    code, _, err = run_script("tools/predict_shard_costs.py", ["--shards", src, "--out", pred], capsys)
    assert code == 0, err
    before = pred.read_bytes()
    code, _, err = run_script("tools/predict_shard_costs.py", ["--shards", pred, "--out", tmp_path / "again.jsonl"],
                              capsys)
    one_line_error(code, err, r"pred\.jsonl:1: holds predictions \(by emulated:h200")
    assert pred.read_bytes() == before and not (tmp_path / "again.jsonl").exists()
