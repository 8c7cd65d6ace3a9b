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
