"""The tools' own inputs: gen_tasks.py's task styles and the flags they refuse together."""

from __future__ import annotations


import pytest


from helpers import one_line_error, run_script, small_base


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return small_base(tmp_path_factory, "test_inputs_tools")


def test_gen_tasks_all_tables_draws_autoshard_style_tasks(base, tmp_path, capsys):
    """--all-tables: training and test tasks over every table (AutoShard's protocol), not disjoint pools."""
    from shardcore.dataset import load_dataset
    from shardcore.tasks import load_tasks

    out = tmp_path / "as"
    code, stdout, err = run_script("tools/gen_tasks.py", ["--data-dir", base / "ds", "--T", 4, "--all-tables",
                                                          "--num-train", 40, "--num-test", 40, "--out-dir", out], capsys)
    assert code == 0, err
    assert "AutoShard" in stdout
    n = load_dataset(base / "ds", with_lookups=False).num_tables
    train, test = (load_tasks(out / f, num_tables=n) for f in ("train.txt", "test.txt"))
    assert len(train) == len(test) == 40 and all(len(t) == 4 for t in train + test)
    seen = {i for t in train for i in t.table_ids}
    assert {i for t in test for i in t.table_ids} & seen      # a test task's tables may be seen in training
    code, _, err = run_script("tools/gen_tasks.py", ["--data-dir", base / "ds", "--T", 4, "--all-tables",
                                                     "--train-fraction", 0.3, "--out-dir", tmp_path / "x"], capsys)
    one_line_error(code, err, r"--all-tables .* takes no")
    assert not (tmp_path / "x").exists()


def test_run_experiments_refuses_a_training_flag_typo_before_any_work(tmp_path, capsys):
    """A typo in --autoshard-args would skip AutoShard with a note (its training failing) and end with status 0:
    each method's flags are parsed by its training script's parser before anything is written."""
    from helpers import ROOT

    common = ["--scale", "tiny", "--oracle", "emulated:h200", "--data-dir", ROOT / "data" / "gpu_measurements" /
              "dlrm_b65536", "--out-dir", tmp_path / "out"]
    for flag, value, pattern in (("--autoshard-args", "--totl-steps 5", r"--autoshard-args: train_autoshard\.py: "
                                                                        r"unrecognized arguments: --totl-steps 5"),
                                 ("--dreamshard-args", "--seed x", r"--dreamshard-args: train_dreamshard\.py: argument "
                                                                   r"--seed: expected an integer"),
                                 ("--neuroshard-args", "--epochs '3", r"--neuroshard-args .*--epochs '3.*: No closing quotation")):
        code, _, err = run_script("tools/run_experiments.py", [*common, f"{flag}={value}"], capsys)
        one_line_error(code, err, pattern)
    assert not (tmp_path / "out").exists()


def test_measure_plan_refuses_a_key_given_twice(base, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text('{"tables": [0, 1], "tables": [2, 3], "shardings": []}')
    code, _, err = run_script("tools/measure_plan.py", ["--data-dir", base / "ds", "--plan", plan], capsys)
    one_line_error(code, err, r"--plan \S+plan\.json: key 'tables' appears twice in one object")


def test_the_probes_smoke_attacks_end_clean(tmp_path):
    """tools/probe_inputs.py's handful (one attack per class, as subprocesses): each a one-line error or a
    correct run, no input touched; its judge names every other outcome."""
    import json
    import os
    import subprocess
    import sys

    from helpers import ROOT

    out = tmp_path / "probe.json"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "probe_inputs.py"), "--smoke", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads(out.read_text())
    assert len(results) >= 5 and {r["outcome"] for r in results} <= {"clean error", "correct run"}
    assert {r["class"] for r in results} >= {"outputs", "ambiguity", "bounds", "files"}


def test_the_probes_judge():
    from tools.probe_inputs import Attack, judge

    refuse, run = Attack("a", "files", "plan.py", []), Attack("b", "files", "plan.py", [], expect="ok")
    refuse.timeout = 5
    assert judge(refuse, None, "", "", [], None)[0] == "hang"
    assert judge(refuse, 2, "", "error: x\n", ["t.csv"], None)[0] == "lost input"
    assert judge(refuse, 1, "", "Traceback (most recent call last):\nValueError: x\n", [], None)[0] == "traceback"
    assert judge(refuse, -9, "", "", [], None)[0] == "traceback"
    assert judge(refuse, 0, "wrote it\n", "", [], None)[0] == "silent wrong result"
    assert judge(run, 0, "", "", [], "p.json not written")[0] == "silent wrong result"
    assert judge(refuse, 2, "", "warning: y\nerror: x\n", [], None)[0] == "unclean error"
    assert judge(run, 2, "", "error: x\n", [], None)[0] == "false refusal"
    assert judge(refuse, 2, "", "error: x\n", [], None) == ("clean error", "error: x")
    assert judge(run, 0, "", "", [], None)[0] == "correct run"
