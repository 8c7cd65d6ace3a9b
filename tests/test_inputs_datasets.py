"""Dataset files as every command reads them (table_configs.json, data.pt, task files): bytes that are not UTF-8,
numbers that are not finite or whole, lookups beyond a table's rows, offsets that lie, keys given twice: one
line ``error: ...`` before any work."""

from __future__ import annotations

import json
import math

import pytest
import torch

from shardcore.dataset import load_dataset, load_table_configs
from shardcore.errors import ShardError
from shardcore.tables import TableConfig

from helpers import (NON_UTF8, attack_base, check_one_line_case, copy_ds, edit_configs, one_line_error, run_script,
                     set_field, write)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return attack_base(tmp_path_factory, "test_inputs_datasets")


def ep(base, ds=None, tasks=None, *extra):
    """The attack tables' base command: eval.py --plan-only on 4 devices, cap 5 GB."""
    return ["--task-path", tasks or base / "tasks.txt", "--data-dir", ds or base / "ds",
            "--gpu-devices", "0,1,2,3", "--max-memory", 5, "--plan-only", "--quiet", *extra]


def bad_configs_bytes(base, t):
    ds = copy_ds(base, t)
    (ds / "table_configs.json").write_bytes(NON_UTF8)
    return ds


def bad_tasks_bytes(t):
    p = t / "tasks.txt"
    p.write_bytes(b"0,1,2\n" + NON_UTF8)
    return p


CASES = [
    ("1-configs-eval", "eval.py", lambda b, t: ep(b, bad_configs_bytes(b, t)), r"table_configs.json: not UTF-8"),
    ("1-configs-gen_tasks", "tools/gen_tasks.py",
     lambda b, t: ["--data-dir", bad_configs_bytes(b, t), "--T", 3, "--out-dir", t / "tk"], r"not UTF-8"),
    ("1-configs-train_autoshard", "train_autoshard.py",
     lambda b, t: ["--data-dir", bad_configs_bytes(b, t), "--task-path", b / "tasks.txt", "--savedir", t / "m"],
     r"table_configs.json: not UTF-8"),
    ("1-tasks-eval", "eval.py", lambda b, t: ep(b, None, bad_tasks_bytes(t)), r"tasks.txt: not UTF-8 .* line 2"),
    ("1-tasks-train_dreamshard", "train_dreamshard.py",
     lambda b, t: ["--data-dir", b / "ds", "--task-path", bad_tasks_bytes(t), "--out-dir", t / "m"], r"not UTF-8"),
    ("1-tasks-eval_simulator", "eval_simulator.py",
     lambda b, t: ["--data-dir", b / "ds", "--task-path", bad_tasks_bytes(t)], r"not UTF-8"),
    ("2-row-infinity", "eval.py", lambda b, t: ep(b, edit_configs(b, t, set_field(3, "row", math.inf))),
     r"tables\[3\]: row must be finite"),
    ("6-nan-reuse-bin", "eval.py", lambda b, t: ep(b, edit_configs(b, t, set_field(2, "bin_3", math.nan))),
     r"tables\[2\]: bin_3 must be finite"),
    ("7-row-below-max-index", "eval.py", lambda b, t: ep(b, edit_configs(b, t, set_field(4, "row", 2))),
     r"table 4 looks up row \d+ but table_configs.json gives it only 2 rows"),
    ("8-row-fraction", "eval.py", lambda b, t: ep(b, edit_configs(b, t, set_field(1, "row", 12.7))),
     r"row must be a whole number"),
    ("12-dim-task-file", "eval.py", lambda b, t: ep(b, None, write(t, "t.txt", "0,1 8,10\n")),
     r"t.txt:1: dim 10 is not a multiple of 4"),
    ("12-dim-configs", "eval.py", lambda b, t: ep(b, edit_configs(b, t, set_field(0, "dim", 7))),
     r"tables\[0\]: dim 7 is not a multiple of 4"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line(case, base, tmp_path, capsys):
    check_one_line_case(case, base, tmp_path, capsys)


def test_table_config_numbers(tmp_path):
    ok = TableConfig.from_json({"index": 0, "row": 12.0, "dim": "8", "pooling_factor": 1})
    assert (ok.row, ok.dim) == (12, 8)
    for field, value, msg in [("row", 12.7, "whole number"), ("row", math.inf, "finite"), ("row", True, "non-numeric"),
                              ("pooling_factor", math.nan, "finite"), ("bin_0", -0.5, "negative"),
                              ("row", "1e999", "finite")]:
        obj = {"index": 0, "row": 10, "dim": 8, "pooling_factor": 1.0, field: value}
        with pytest.raises(ShardError, match=msg):
            TableConfig.from_json(obj)
    p = tmp_path / "table_configs.json"
    p.write_text('{"tables": [{"index": 0, "row": Infinity, "dim": 4, "pooling_factor": 1}]}')
    with pytest.raises(ShardError, match="finite"):
        load_table_configs(p)


def test_data_pt_rows_checked_without_stored_range(base, tmp_path):
    """A data.pt written before min/max indices were stored is checked all the same."""
    ds = copy_ds(base, tmp_path)
    obj = torch.load(ds / "data.pt", weights_only=True)
    del obj["min_index"], obj["max_index"]
    torch.save(obj, ds / "data.pt")
    assert load_dataset(ds).batch_size == 16
    cfg = json.loads((ds / "table_configs.json").read_text())
    cfg["tables"][5]["row"] = int(obj["indices"][5].max())    # one too few
    (ds / "table_configs.json").write_text(json.dumps(cfg))
    with pytest.raises(ShardError, match="table 5 looks up row"):
        load_dataset(ds)


def edit_data(base, tmp_path, change):
    ds = copy_ds(base, tmp_path)
    obj = torch.load(ds / "data.pt", weights_only=True)
    change(obj)
    torch.save(obj, ds / "data.pt")
    return ds


def forge_range(obj):
    """Indices beyond the table's rows, with the stored range claiming otherwise."""
    obj["indices"][3] = obj["indices"][3].clone()
    if obj["indices"][3].numel():
        obj["indices"][3][0] = 10 ** 7
    else:
        obj["indices"][3] = torch.tensor([10 ** 7], dtype=torch.int32)
        obj["offsets"][3] = obj["offsets"][3].clone()
        obj["offsets"][3][1:] = 1
    obj["max_index"] = torch.zeros_like(obj["max_index"])


def bad_offsets(obj):
    off = obj["offsets"][2].clone()
    off[-1] = off[-1] + 5
    obj["offsets"][2] = off


def decreasing_offsets(obj):
    off = obj["offsets"][1].clone()
    off[1] = off[-1] + 1
    obj["offsets"][1] = off


@pytest.mark.parametrize("change, pattern", [
    (forge_range, r"table 3 looks up row 10000000"),
    (bad_offsets, r"table 2: offsets must start at 0, never decrease and end at"),
    (decreasing_offsets, r"table 1: offsets must"),
])
def test_data_pt_derived_state_checked(base, tmp_path, change, pattern):
    ds = edit_data(base, tmp_path, change)
    with pytest.raises(ShardError, match=pattern):
        load_dataset(ds)


def test_a_key_given_twice_in_table_configs_is_refused(base, tmp_path, capsys):
    """``{"row": 10, "row": 20}``: JSON keeps the last without a word; which one the data meant is a guess."""
    ds = copy_ds(base, tmp_path)
    p = ds / "table_configs.json"
    p.write_text(p.read_text().replace('"row":', '"row": 1, "row":', 1))
    code, _, err = run_script("eval.py", ep(base, ds), capsys)
    one_line_error(code, err, r"table_configs\.json: key 'row' appears twice in one object")
