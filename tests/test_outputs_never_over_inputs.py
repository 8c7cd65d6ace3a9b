"""One rule for every command that writes (shardcore.io.check_outputs): no output names, links to or lives over
an input, none is a device file, none replaces a file of another kind, an unwritable folder is refused; all
before any work."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from shardcore.oracles.cache import CostCache

from helpers import (ROOT, attack_base, check_one_line_case, compute_csv, good_rows, one_line_error, run_script,
                     write)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return attack_base(tmp_path_factory, "test_outputs_never_over_inputs")


def ep(base, ds=None, tasks=None, *extra):
    """The attack tables' base command: eval.py --plan-only on 4 devices, cap 5 GB."""
    return ["--task-path", tasks or base / "tasks.txt", "--data-dir", ds or base / "ds",
            "--gpu-devices", "0,1,2,3", "--max-memory", 5, "--plan-only", "--quiet", *extra]


def ep_small(base, *extra):
    return ["--task-path", base / "tasks.txt", "--data-dir", base / "ds", "--gpu-devices", "0,1",
            "--max-memory", 5, "--plan-only", "--quiet", *extra]


CASES = [
    ("3-eval-out-dir", "eval.py", lambda b, t: ep(b, None, None, "--out", t), r"--out .*is a directory"),
    ("3-eval-out-under-file", "eval.py", lambda b, t: ep(b, None, None, "--out", b / "a_file" / "r.jsonl"),
     r"--out .*a_file is a file"),
    ("3-eval-export-file", "eval.py", lambda b, t: ep(b, None, None, "--export-torchrec", b / "a_file"),
     r"--export-torchrec .*is a file"),
    ("3-plan-out-dir", "plan.py",
     lambda b, t: ["--tables", write(t, "t.csv", "name,rows,dim,pooling_factor\na,10,8,1\n"), "--out", t],
     r"--out .*is a directory"),
    ("3-gen_dlrm_data-out-file", "tools/gen_dlrm_data.py", lambda b, t: ["--synthetic", "--out-dir", b / "a_file"],
     r"--out-dir .*is a file"),
    ("3-gen_tasks-out-file", "tools/gen_tasks.py",
     lambda b, t: ["--data-dir", b / "ds", "--T", 3, "--out-dir", b / "a_file"], r"--out-dir .*is a file"),
    ("3-train_dreamshard-out-file", "train_dreamshard.py",
     lambda b, t: ["--data-dir", b / "ds", "--task-path", b / "tasks.txt", "--out-dir", b / "a_file"],
     r"--out-dir .*is a file"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line(case, base, tmp_path, capsys):
    check_one_line_case(case, base, tmp_path, capsys)


def test_eval_out_names_an_input(base, tmp_path, capsys):
    before = (base / "tasks.txt").read_bytes()
    for target, flag in [(base / "tasks.txt", "--task-path"), (base / "ds" / "data.pt", r"--data-dir \(data.pt\)"),
                         (base / "ds" / "table_configs.json", r"--data-dir \(table_configs")]:
        code, _, err = run_script("eval.py", ep_small(base, "--out", target), capsys)
        one_line_error(code, err, rf"--out .* is also the input {flag}")
    os.link(base / "tasks.txt", tmp_path / "hard_link.txt")     # a hard link is the same file
    code, _, err = run_script("eval.py", ep_small(base, "--out", tmp_path / "hard_link.txt"), capsys)
    one_line_error(code, err, r"is also the input --task-path")
    cache = tmp_path / "c.sqlite"
    CostCache(cache).check_usable()
    code, _, err = run_script("eval.py", ep_small(base, "--cache-path", cache, "--out", cache), capsys)
    one_line_error(code, err, r"is also the input --cache-path")
    assert (base / "tasks.txt").read_bytes() == before


def test_out_never_replaces_another_kind(base, tmp_path, capsys):
    other = tmp_path / "other.sqlite"
    CostCache(other).check_usable()
    code, _, err = run_script("eval.py", ep_small(base, "--out", other), capsys)
    one_line_error(code, err, r"exists and is an SQLite database, not a text file")
    assert other.read_bytes().startswith(b"SQLite format 3")


def test_plan_out_is_tables(tmp_path, capsys):
    t = tmp_path / "t.csv"
    t.write_text("name,rows,dim,pooling_factor\na,10,8,1\n")
    code, _, err = run_script("plan.py", ["--tables", t, "--out", t], capsys)
    one_line_error(code, err, r"--out .* is also the input --tables")
    assert t.read_text().startswith("name,rows")


def test_cost_model_outputs(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    csv = compute_csv(data / "compute_costs.csv", good_rows(10))
    before = csv.read_bytes()
    code, _, err = run_script("train_compute_cost_model.py", ["--data_dir", data, "--out_path", csv], capsys)
    one_line_error(code, err, r"--out_path .* is also the input --data_dir")
    assert csv.read_bytes() == before
    code, _, err = run_script("train_comm_cost_model.py", ["--data_dir", data, "--fw_out_path", tmp_path / "m.pt",
                                                           "--bw_out_path", tmp_path / "m.pt"], capsys)
    one_line_error(code, err, r"--fw_out_path .* is also the output --bw_out_path")
    (tmp_path / "notes.txt").write_text("my notes\n")
    code, _, err = run_script("train_compute_cost_model.py", ["--data_dir", data, "--out_path", tmp_path / "notes.txt"],
                              capsys)
    one_line_error(code, err, r"exists and is text, not a zip/torch file")


def test_gen_tasks_zero_keeps_file(base, tmp_path, capsys):
    out = tmp_path / "tk"
    out.mkdir()
    (out / "train.txt").write_text("0,1,2\n")
    code, stdout, err = run_script("tools/gen_tasks.py", ["--data-dir", base / "ds", "--T", 3, "--num-train", 0,
                                                          "--num-test", 2, "--out-dir", out], capsys)
    assert code == 0, err
    assert (out / "train.txt").read_text() == "0,1,2\n" and "train.txt not written" in stdout
    assert len((out / "test.txt").read_text().splitlines()) == 2
    code, _, err = run_script("tools/gen_tasks.py", ["--data-dir", base / "ds", "--T", 3, "--num-train", 0,
                                                     "--num-test", 0, "--out-dir", out], capsys)
    one_line_error(code, err, r"both 0")


GPU = Path(ROOT) / "data" / "gpu_measurements"
EMU_DS = GPU / "dlrm_b65536"
T50 = GPU / "tasks" / "dlrm_tasks_50_test.txt"


def _shards(tmp_path):
    p = tmp_path / "sh.jsonl"
    p.write_text("".join((GPU / "h200_b65536_random_shards.jsonl").read_text().splitlines(True)[:3]))
    return p


@pytest.mark.parametrize("case", ["predict_same", "predict_hardlink", "hot_tasks", "fit_shardkit_cache",
                                  "emulator_accuracy_params", "fit_gpu_emulator_measurement", "simulator_tasks",
                                  "cpu_repeatability_data"])
def test_tool_outputs_never_replace_inputs(case, base, tmp_path, capsys):
    if case.startswith("predict"):
        src = _shards(tmp_path)
        out = src
        if case == "predict_hardlink":
            out = tmp_path / "link.jsonl"
            os.link(src, out)
        rel, argv, victim, pattern = "tools/predict_shard_costs.py", ["--shards", src, "--out", out], src, "--shards"
    elif case == "hot_tasks":
        victim = tmp_path / "t50.txt"
        shutil.copy(T50, victim)
        rel, argv, pattern = "tools/gen_hot_tasks.py", ["--data-dir", EMU_DS, "--tasks", victim, "--out", victim], \
            "--tasks"
    elif case == "fit_shardkit_cache":
        victim = tmp_path / "c.sqlite"
        sqlite3.connect(victim).execute("create table x(a)").connection.close()
        rel, argv, pattern = "tools/fit_shardkit_model.py", ["--data-dir", base / "ds", "--cache-path", victim,
                                                             "--out", victim], "--cache-path"
    elif case == "emulator_accuracy_params":
        victim = tmp_path / "p.json"
        shutil.copy(GPU / "h200_emulator.json", victim)
        rel, argv, pattern = "tools/emulator_accuracy.py", ["--params", victim, "--out", victim], "--params"
    elif case == "fit_gpu_emulator_measurement":
        meas = tmp_path / "meas"
        meas.mkdir()
        victim = meas / "h200_b65536_plan_shards.jsonl"
        victim.write_text("{}\n")
        rel, argv, pattern = "tools/fit_gpu_emulator.py", ["--measurements", meas, "--out", victim], "--measurements"
    elif case == "simulator_tasks":
        victim = tmp_path / "tasks.txt"
        shutil.copy(base / "tasks.txt", victim)
        rel, argv, pattern = "eval_simulator.py", ["--task-path", victim, "--data-dir", base / "ds", "--gpu-devices",
                                                   "0,1", "--out", victim], "--task-path"
    else:
        ds = shutil.copytree(base / "ds", tmp_path / "ds")
        victim = ds / "data.pt"
        rel, argv, pattern = "tools/cpu_repeatability.py", ["--data-dir", ds, "--out", victim, "--gpu-devices", "0,1"], \
            r"--data-dir \(data\.pt\)"
    before = victim.read_bytes()
    code, _, err = run_script(rel, argv, capsys)
    one_line_error(code, err, r"--out \S+ is also the input " + pattern)
    assert victim.read_bytes() == before


def test_run_experiments_out_dir_checked_first(base, tmp_path, capsys):
    victim = tmp_path / "a_file"
    victim.write_text("x\n")
    code, _, err = run_script("tools/run_experiments.py", ["--scale", "tiny", "--oracle", "emulated:h200",
                                                           "--data-dir", EMU_DS, "--out-dir", victim, "--skip-train"],
                              capsys)
    one_line_error(code, err, r"--out-dir .*a_file: is a file, not a directory")
    assert victim.read_text() == "x\n"
