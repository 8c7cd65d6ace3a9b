"""Numbers on the command line and in files: seeds, learning rates, bandwidths, batch sizes, time ranges, dims,
device counts, costs. Each out of range is one line naming the flag (or file and field), before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardcore.errors import ShardError
from shardcore.types import PlanResult

from helpers import ROOT, attack_base, check_one_line_case, one_line_error, run_script


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return attack_base(tmp_path_factory, "test_inputs_numbers")


CASES = [
    ("8-replay-ratio-negative", "train_autoshard.py", lambda b, t: ["--replay-ratio", -3], r"--replay-ratio.*>= 0"),
    ("12-T-range-empty", "train_neuroshard.py",
     lambda b, t: ["--data-dir", b / "ds", "--T-range", "5,5", "--out-dir", t / "ns"], r"MAX must exceed MIN"),
    ("12-sleep-range-inf", "train_neuroshard.py",
     lambda b, t: ["--data-dir", b / "ds", "--sleep-range", "0,inf"], r"--sleep-range.*finite"),
    ("12-entropy-weight-nan", "train_dreamshard.py", lambda b, t: ["--entropy-weight", "nan"],
     r"--entropy-weight.*finite"),
    ("12-entropy-cost-nan", "train_autoshard.py", lambda b, t: ["--entropy-cost", "nan"], r"--entropy-cost.*finite"),
    ("12-dim-gen_dlrm_data", "tools/gen_dlrm_data.py", lambda b, t: ["--synthetic", "--dim", 6, "--out-dir", t / "o"],
     r"dim 6 is not a multiple of 4"),
    ("12-dims-gen_tasks", "tools/gen_tasks.py",
     lambda b, t: ["--data-dir", b / "ds", "--T", 3, "--dims", "8,6", "--out-dir", t / "tk"],
     r"dim 6 is not a multiple of 4"),
    ("minor-bad-int", "tools/gen_tasks.py", lambda b, t: ["--num-test", "-1"], r"--num-test.*>= 0"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line(case, base, tmp_path, capsys):
    check_one_line_case(case, base, tmp_path, capsys)


SEED_SCRIPTS = ["eval.py", "plan.py", "eval_simulator.py", "train_neuroshard.py", "train_compute_cost_model.py",
                "tools/gen_tasks.py", "tools/gen_dlrm_data.py", "tools/bench_planning.py", "tools/run_experiments.py",
                "train_autoshard.py", "train_dreamshard.py"]


@pytest.mark.parametrize("rel", SEED_SCRIPTS)
@pytest.mark.parametrize("seed", ["-1", str(2 ** 40)])
def test_seed_out_of_range_is_one_line(rel, seed, capsys):
    code, _, err = run_script(rel, ["--seed", seed], capsys)
    one_line_error(code, err, r"--seed: expected a seed")


@pytest.mark.parametrize("rel, argv, pattern", [
    ("train_autoshard.py", ["--learning-rate", "1e10"], r"--learning-rate: expected a learning rate in \(0, 1\]"),
    ("train_autoshard.py", ["--cost-learning-rate", "inf"], r"--cost-learning-rate: expected a finite number"),
    ("train_dreamshard.py", ["--rl-lr", "1e10"], r"--rl-lr: expected a learning rate"),
    ("train_compute_cost_model.py", ["--lr", "1e300"], r"--lr: expected a learning rate"),
    ("eval.py", ["--comm-bandwidth", "1e-320"], r"--comm-bandwidth: expected a bandwidth"),
    ("eval.py", ["--comm-bandwidth", "0"], r"--comm-bandwidth: expected a bandwidth"),
    ("eval.py", ["--comm-latency", "-1"], r"--comm-latency: expected a latency"),
    ("eval.py", ["--warmup-iters", "-3"], r"--warmup-iters: expected an integer >= 0"),
    ("eval.py", ["--timeout", "1e308"], r"--timeout: expected a number of seconds"),
    ("tools/gen_tasks.py", ["--train-fraction", "nan"], r"--train-fraction: expected a finite number"),
    ("train_compute_cost_model.py", ["--val-fraction", "2"], r"--val-fraction\S*: expected a fraction"),
])
def test_numeric_flags(rel, argv, pattern, capsys):
    code, _, err = run_script(rel, argv, capsys)
    one_line_error(code, err, pattern)


@pytest.mark.parametrize("costs", [[[1.0, float("nan"), 0.0, 0.0]], [[1.0, float("inf"), 0.0, 0.0]],
                                   [[1.0, -2.0, 0.0, 0.0]], [[1.0, 2.0]]])
def test_plan_result_refuses_bad_costs(costs):
    with pytest.raises(ShardError, match="oracle X") as exc:
        PlanResult(costs, hardware="oracle X")
    assert "\n" not in str(exc.value)


GPU = Path(ROOT) / "data" / "gpu_measurements"
EMU_DS = GPU / "dlrm_b65536"
T50 = GPU / "tasks" / "dlrm_tasks_50_test.txt"


def emu(*extra):
    return ["--oracle", "emulated:h200", "--data-dir", EMU_DS, "--task-path", T50, "--gpu-devices", "0,1,2,3",
            "--max-memory", 5, "--quiet", "--max-tasks", 2, *extra]


@pytest.mark.parametrize("rel, argv", [
    ("eval.py", emu("--alg", "lookup_greedy", "--batch-size", str(10 ** 21))),
    ("plan.py", ["--batch-size", str(2 ** 31)]),
    ("tools/predict_shard_costs.py", ["--batch-size", str(2 ** 40)]),
    ("train_dreamshard.py", ["--bench-batch-size", str(2 ** 31)]),
])
def test_batch_size_bounded(rel, argv, capsys):
    code, _, err = run_script(rel, argv, capsys)
    one_line_error(code, err, r"batch-size: expected a batch size <= 2147483647")


def test_dreamshard_one_episode_batch_refused(capsys):
    """One episode per update: its returns have no spread, the policy loss was NaN and the error said
    'training diverged; lower the learning rate'."""
    code, _, err = run_script("train_dreamshard.py", ["--rl-batch-size", 1], capsys)
    one_line_error(code, err, r"--rl-batch-size: expected an integer >= 2")


@pytest.mark.parametrize("where", ["weight", "default_cv", "replica_weights"])
def test_emulator_parameters_must_be_finite(where, tmp_path, capsys):
    params = json.loads((GPU / "h200_emulator.json").read_text())
    if where == "weight":
        params["sets"][next(iter(params["sets"]))]["fw"][3] = float("nan")
    elif where == "default_cv":
        params["default_cv"] = float("inf")
    else:
        params["replica_weights"] = [[0.1, float("nan"), 0.04, 0.01], [0.2, 0.05, 0.05, 0.01]]
    p = tmp_path / "params.json"
    p.write_text(json.dumps(params))   # json writes NaN / Infinity, and reads them back
    code, _, err = run_script("tools/emulator_accuracy.py", ["--params", p], capsys)
    one_line_error(code, err, r"GPU emulator parameters.*finite")
