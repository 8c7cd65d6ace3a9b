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
