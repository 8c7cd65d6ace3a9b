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


# -- every command that writes goes through the one rule ------------------------------------------------------
PLAN_FILE = {"tables": [0, 1], "shardings": [{"type": "table_wise", "devices": [0]},
                                             {"type": "table_wise", "devices": [1]}]}


def writer_table(b, t):
    """(script, argv) of every command that writes, its output (a file or a folder) at ``OUT``."""
    import json

    ds, tasks = b / "ds", b / "tasks.txt"
    (t / "plan.json").write_text(json.dumps(PLAN_FILE))
    (t / "t.csv").write_text("name,rows,dim,pooling_factor\na,10,8,1\nb,20,4,2\n")
    (t / "sh.jsonl").write_text("")
    (t / "data").mkdir(exist_ok=True)
    emu = ROOT / "data" / "gpu_measurements" / "dlrm_b65536"
    return [
        ("eval.py", ep(b, None, None, "--out", "OUT")), ("eval.py", ep(b, None, None, "--export-torchrec", "OUT")),
        ("eval_simulator.py", ["--task-path", tasks, "--data-dir", ds, "--gpu-devices", "0,1", "--out", "OUT"]),
        ("plan.py", ["--tables", t / "t.csv", "--out", "OUT"]),
        ("tools/measure_plan.py", ["--data-dir", ds, "--plan", t / "plan.json", "--out", "OUT"]),
        ("tools/measure_plan.py", ["--data-dir", ds, "--plan", t / "plan.json", "--torchrec", "OUT"]),
        ("tools/gen_hot_tasks.py", ["--data-dir", ds, "--tasks", tasks, "--out", "OUT"]),
        ("tools/fit_shardkit_model.py", ["--data-dir", ds, "--cache-path", t / "c.sqlite", "--out", "OUT"]),
        ("tools/predict_shard_costs.py", ["--shards", t / "sh.jsonl", "--out", "OUT"]),
        ("tools/cpu_repeatability.py", ["--data-dir", ds, "--gpu-devices", "0,1", "--out", "OUT"]),
        ("tools/emulator_accuracy.py", ["--out", "OUT"]), ("tools/fit_gpu_emulator.py", ["--out", "OUT"]),
        ("tools/bench_oracle.py", ["--data-dir", ds, "--json", "OUT"]),
        ("tools/gen_tasks.py", ["--data-dir", ds, "--T", 3, "--out-dir", "OUT"]),
        ("tools/gen_tasks.py", ["--data-dir", ds, "--data_size", 3, "--out-dir", "OUT"]),
        ("tools/gen_dlrm_data.py", ["--synthetic", "--out-dir", "OUT"]),
        ("tools/gen_dlrm_data.py", ["--synthetic", "--out-dir", t / "never", "--raw-out", "OUT"]),
        ("train_autoshard.py", ["--data-dir", ds, "--task-path", tasks, "--savedir", "OUT", "--xpid", "."]),
        ("train_dreamshard.py", ["--data-dir", ds, "--task-path", tasks, "--out-dir", "OUT"]),
        ("train_neuroshard.py", ["--dataset-dir", ds, "--gpu-devices", "0,1", "--out-dir", "OUT"]),
        ("collect_compute_cost_data.py", ["--dataset_dir", ds, "--out_dir", "OUT"]),
        ("collect_comm_cost_data.py", ["--dataset_dir", ds, "--gpu-devices", "0,1", "--out_dir", "OUT"]),
        ("train_compute_cost_model.py", ["--data_dir", t / "data", "--out_path", "OUT"]),
        ("train_comm_cost_model.py", ["--data_dir", t / "data", "--fw_out_path", "OUT"]),
        ("tools/run_experiments.py", ["--scale", "tiny", "--oracle", "emulated:h200", "--data-dir", emu,
                                      "--out-dir", "OUT", "--skip-train"]),
        ("tools/bench_planning.py", ["--data-dir", ds, "--out-dir", "OUT"]),
        ("tools/honest_margins.py", ["--out-dir", "OUT", "--force"]), ("tools/train_anchors.py", ["--out-dir", "OUT"]),
        ("tools/gpu_check.py", ["--work-dir", "OUT"]), ("tools/gpu_check.py", ["--shards-out", "OUT"]),
    ]


def test_every_writer_refuses_a_pipe_or_device_as_its_output(base, tmp_path, capsys):
    """A named pipe stands for a device file (``/dev/full``): an output is a regular file renamed into
    place, so it would replace the device; every command refuses it in one line before any work."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for rel, argv in writer_table(base, tmp_path):
        code, _, err = run_script(rel, [fifo if a == "OUT" else a for a in argv], capsys)
        one_line_error(code, err, r"fifo: is a device, pipe or socket, not a regular file|fifo is a file, not a directory")
        assert (tmp_path / "fifo").exists() and not (tmp_path / "fifo").is_file(), rel
    assert not (tmp_path / "never").exists()


def test_measure_plan_never_writes_over_its_plan(base, tmp_path, capsys):
    """tools/measure_plan.py --out (or --torchrec) naming --plan, or a link to it: refused before any
    worker starts; the plan file is as it was."""
    import json

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN_FILE))
    (tmp_path / "link.json").symlink_to(plan)
    before = plan.read_bytes()
    for flag, target in (("--out", plan), ("--torchrec", plan), ("--out", tmp_path / "link.json")):
        code, out, err = run_script("tools/measure_plan.py", ["--data-dir", base / "ds", "--plan", plan, flag, target],
                                    capsys)
        one_line_error(code, err, rf"{flag} \S+ is also the input --plan")
        assert "hardware:" not in out
    assert plan.read_bytes() == before


def test_an_unwritable_folder_is_refused():
    """The rule asks the folder with the process's effective ids: a read-only folder is refused (as a user
    without write access; root writes anywhere, so the check runs under another effective uid)."""
    from shardcore import io
    from shardcore.errors import ShardError

    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="ro-", dir="/tmp"))
    try:
        os.chmod(folder, 0o555)
        root = os.geteuid() == 0
        if root:
            os.seteuid(65534)
        try:
            with pytest.raises(ShardError, match=r"--out .*: directory .* is not writable"):
                io.check_outputs({"--out": folder / "r.json"})
        finally:
            if root:
                os.seteuid(0)
    finally:
        os.chmod(folder, 0o755)
        shutil.rmtree(folder)


def test_outputs_under_a_file_are_refused_before_any_worker(base, tmp_path, capsys, monkeypatch):
    """tools/measure_plan.py measured first and failed on writing: the output is checked before the
    evaluator is built."""
    import json

    from shardcore.oracles.measured import driver

    def no_worker(*a, **k):
        raise AssertionError("an evaluator was built")

    monkeypatch.setattr(driver.PlanEvaluator, "__init__", no_worker)
    (tmp_path / "plan.json").write_text(json.dumps(PLAN_FILE))
    code, _, err = run_script("tools/measure_plan.py", ["--data-dir", base / "ds", "--plan", tmp_path / "plan.json",
                                                        "--out", base / "a_file" / "r.json"], capsys)
    one_line_error(code, err, r"--out .*a_file is a file, not a directory")


def test_a_folder_replaced_whole_never_holds_an_input(tmp_path, capsys):
    """tools/honest_margins.py --force replaces --out-dir as a whole: never a folder that holds --anchors."""
    anchors = tmp_path / "out" / "anchors"
    anchors.mkdir(parents=True)
    (anchors / "keep.txt").write_text("mine\n")
    code, _, err = run_script("tools/honest_margins.py", ["--out-dir", tmp_path / "out", "--force",
                                                          "--anchors", anchors], capsys)
    one_line_error(code, err, r"--out-dir \S+ holds the input --anchors")
    assert (anchors / "keep.txt").read_text() == "mine\n"


def test_export_folder_never_holds_an_input(base, tmp_path, capsys):
    """eval.py --export-torchrec DIR rewrites DIR/<alg>/: a task file kept there is refused, not overwritten."""
    alg_dir = tmp_path / "exp" / "random"
    alg_dir.mkdir(parents=True)
    shutil.copy(base / "tasks.txt", alg_dir / "task_0000.json")
    code, _, err = run_script("eval.py", ep(base, None, alg_dir / "task_0000.json", "--alg", "random",
                                            "--export-torchrec", tmp_path / "exp"), capsys)
    one_line_error(code, err, r"--export-torchrec \(random/\) \S+ holds the input --task-path")


def test_neuroshard_models_of_an_earlier_run_need_overwrite(base, tmp_path, capsys):
    """train_neuroshard.py refuses an --out-dir holding an earlier run's models, as the other trainers
    refuse theirs; --overwrite replaces them."""
    import torch

    out = tmp_path / "models"
    out.mkdir()
    torch.save({"old": 1}, out / "compute.pt")
    before = (out / "compute.pt").read_bytes()
    code, _, err = run_script("train_neuroshard.py", ["--dataset-dir", base / "ds", "--gpu-devices", "0,1",
                                                      "--out-dir", out, "--skip-collection"], capsys)
    one_line_error(code, err, r"--out-dir \S+ holds the models of an earlier run \(compute\.pt\): pass --overwrite")
    assert (out / "compute.pt").read_bytes() == before
