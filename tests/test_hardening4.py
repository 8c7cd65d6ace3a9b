"""Issue #28, hardening round four, grouped by class: numbers that still got through (a table's rows and
pooling factor, batch sizes, DreamShard's one-episode batch, record costs that overflow the statistics),
silent wrong results (predictions read as measurements, concatenated runs, trained models kept when no
better than untrained), outputs that replaced inputs (the tools' --out), and checks that came too late
(shardkit's calibration pool, run_experiments' --out-dir). Scripts run through ``run_main`` in this
process (a traceback fails the test)."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from shardcore.errors import ShardError

from helpers import make_dataset, small_base
from test_hardening import run_script, script
from test_hardening2 import compute_csv, good_rows, one_line_error

ROOT = Path(__file__).resolve().parent.parent
GPU = ROOT / "data" / "gpu_measurements"
EMU_DS = GPU / "dlrm_b65536"
T50 = GPU / "tasks" / "dlrm_tasks_50_test.txt"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return small_base(tmp_path_factory, "hardening4")


def emu(*extra):
    return ["--oracle", "emulated:h200", "--data-dir", EMU_DS, "--task-path", T50, "--gpu-devices", "0,1,2,3",
            "--max-memory", 5, "--quiet", "--max-tasks", 2, *extra]


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """An eval.py --out file of two tasks on the emulated H200 (lookup_greedy, size_greedy)."""
    from shardcore.cli import common as cli

    out = tmp_path_factory.mktemp("records") / "emu.jsonl"
    with pytest.raises(SystemExit) as exc:
        cli.run_main(script("eval.py").main, [str(a) for a in emu("--alg", "lookup_greedy,size_greedy", "--out", out)])
    assert exc.value.code == 0 and out.is_file()
    return out


# -- class 1: numbers ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("row, pattern", [
    ("a,1000000000000000000000000000000,8,1", r"row=\d{31},.*\) \(at most 2\*\*40 rows"),     # crashed in C
    ("a,100,8,1e300", r"pooling_factor=1e\+300\) \(at most 2\*\*40 rows and pooling factor 100000"),                       # costs of 1e300 ms, exit 0
])
def test_table_numbers_bounded(row, pattern, tmp_path, capsys):
    csv = tmp_path / "t.csv"
    csv.write_text(f"name,rows,dim,pooling_factor\n{row}\nb,10,8,1\n")
    code, _, err = run_script("plan.py", ["--tables", csv, "--ndevices", 2, "--max-memory", 5, "--alg",
                                          "lookup_greedy,shardkit", "--oracle", "emulated:h200", "--batch-size", 64],
                              capsys)
    one_line_error(code, err, r"t\.csv:2 \(table 'a'\): .*" + pattern)


@pytest.mark.parametrize("rel, argv", [
    ("eval.py", emu("--alg", "lookup_greedy", "--batch-size", str(10 ** 21))),   # ran, exit 0
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


def test_compare_costs_that_overflow_the_statistics(tmp_path, capsys):
    p = tmp_path / "big.jsonl"
    p.write_text("".join(json.dumps({"alg": a, "task": t, "cost_ms": 1.7e308,
                                     "device_costs_ms": [[1.7e308, 0, 0, 0], [1.0, 0, 0, 0]]}) + "\n"
                         for a in "ab" for t in range(3)))
    code, _, err = run_script("tools/shardkit_compare.py", [p, "--alg", "a"], capsys)
    one_line_error(code, err, r"big\.jsonl:1: 'cost_ms' must be a finite number in \[0, 1e12\]")


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


# -- class 2: silent wrong results --------------------------------------------------------------------------
def test_eval_records_carry_provenance(records):
    for line in records.read_text().splitlines():
        stamp = json.loads(line)["produced_by"]
        assert stamp["tool"] == "eval.py" and stamp["predicted"] is False and "emulated" in stamp["oracle"]


def _stamped(src, dst, stamp):
    dst.write_text("".join(json.dumps({**json.loads(x), "produced_by": stamp}) + "\n"
                           for x in src.read_text().splitlines()))
    return dst


@pytest.mark.parametrize("rel, argv", [
    ("tools/shardkit_compare.py", ["{f}", "--alg", "lookup_greedy"]),
    ("tools/shardkit_cost_accuracy.py", ["--records", "{f}", "--task-path", T50, "--data-dir", EMU_DS,
                                         "--oracle", "emulated:h200"]),
])
def test_predicted_records_never_read_as_costs(rel, argv, records, tmp_path, capsys):
    """eval_simulator.py's records (the simulator's predictions) fed to a reader of an oracle's costs."""
    sim = _stamped(records, tmp_path / "sim.jsonl", {"tool": "eval_simulator.py", "predicted": True})
    before = sim.read_bytes()
    code, _, err = run_script(rel, [str(a).replace("{f}", str(sim)) for a in argv], capsys)
    one_line_error(code, err, r"sim\.jsonl:?1?: ?.*holds predictions \(produced by eval_simulator\.py\)")
    assert sim.read_bytes() == before


def test_a_broken_stamp_is_refused(records, tmp_path, capsys):
    bad = _stamped(records, tmp_path / "bad.jsonl", "eval.py")
    code, _, err = run_script("tools/shardkit_compare.py", [bad, "--alg", "lookup_greedy"], capsys)
    one_line_error(code, err, r"bad\.jsonl:1: 'produced_by' must be an object")


def test_predicted_cost_data_refused(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    compute_csv(data / "compute_costs.csv", good_rows(12))
    (data / "meta.json").write_text(json.dumps({"kind": "compute", "produced_by": {"tool": "a model",
                                                                                   "predicted": True}}))
    code, _, err = run_script("train_compute_cost_model.py", ["--data_dir", data, "--out_path", tmp_path / "m.pt",
                                                             "--epochs", 1, "--quiet"], capsys)
    one_line_error(code, err, r"meta\.json: holds predictions \(produced by a model\)")
    assert not (tmp_path / "m.pt").exists()


def test_concatenated_runs_refused(records, tmp_path, capsys):
    cat = tmp_path / "cat.jsonl"
    cat.write_text(records.read_text() * 2)
    code, _, err = run_script("tools/shardkit_compare.py", [cat, "--alg", "lookup_greedy"], capsys)
    one_line_error(code, err, r"lookup_greedy on task 0 appears twice")
    lines = [json.loads(x) for x in records.read_text().splitlines()]
    lines[-1]["hardware"] = "another oracle"
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps(r) + "\n" for r in lines))
    code, _, err = run_script("tools/shardkit_compare.py", [mixed, "--alg", "lookup_greedy"], capsys)
    one_line_error(code, err, r"records priced with different oracles")


def test_checkpoints_and_cost_data_carry_provenance(base, tmp_path):
    from dreamshard.config import DreamShardConfig
    from dreamshard.sharder import DreamShardModel
    from neuroshard.collect import collect_compute
    from shardcore.io import load_checkpoint
    from shardcore.oracles.factory import open_oracle
    from shardcore.tables import FeatureScaler

    from shardcore.dataset import load_dataset

    tables = load_dataset(base / "ds", with_lookups=False).tables
    m = DreamShardModel.new(DreamShardConfig(), FeatureScaler.fit(tables))
    m.extra = {"provenance": {"hardware": "emulated X"}}
    m.save(tmp_path / "0.pt")
    assert load_checkpoint(tmp_path / "0.pt")["produced_by"] == {"tool": "train_dreamshard.py", "predicted": False,
                                                                 "oracle": "emulated X"}
    with open_oracle(base / "ds", 2, oracle="emulated:h200") as ev:
        collect_compute(ev, tmp_path / "cc", 2, max_tables=2, max_mem_gb=1.0, progress=False)
    stamp = json.loads((tmp_path / "cc" / "meta.json").read_text())["produced_by"]
    assert stamp["predicted"] is False and "emulated" in stamp["oracle"]


# -- a trained placement model is kept only if it beats its untrained self ----------------------------------
def test_beats_untrained_rule():
    from shardcore.oracles.factory import MIN_JUDGED_TASKS, check_beats_untrained

    n = MIN_JUDGED_TASKS
    check_beats_untrained([1.0] * n, [2.0] * n, "m.pt")                   # better: kept
    check_beats_untrained([3.0] * (n - 1), [2.0] * (n - 1), "m.pt")       # too few tasks to judge
    with pytest.raises(ShardError, match=r"m\.pt: not saved: training did not beat the untrained model .*"
                                         r"mean plan cost 2 ms vs 2 ms untrained"):
        check_beats_untrained([2.0] * n, [2.0] * n, "m.pt")
    with pytest.raises(ShardError, match=r"1 of its plans over the cap"):
        check_beats_untrained([1.0] * (n - 1) + [None], [2.0] * n, "m.pt")


DS_TINY = ["--max-memory", 5, "--bench-steps", 2, "--bench-training-steps", 2, "--rl-num-batches", 1,
           "--rl-batch-size", 2, "--curve-tasks", 0, "--gpu-devices", "0,1", "--oracle", "emulated:h200"]


def test_dreamshard_final_model_no_better_than_untrained_not_saved(tmp_path, capsys, monkeypatch):
    """Training that changes nothing (the optimisers' steps are no-ops) on enough validation tasks: the
    run's last checkpoint is not written; the earlier one stays."""
    from dreamshard import trainer

    make_dataset(tmp_path / "ds", num_tables=12, batch_size=8)
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("".join(",".join(str((k + j) % 12) for j in range(4)) + "\n" for k in range(6)))
    out = tmp_path / "out"
    argv = ["--data-dir", tmp_path / "ds", "--task-path", tasks, "--out-dir", out, *DS_TINY]
    code, _, err = run_script("train_dreamshard.py", [*argv, "--num-iterations", 1], capsys)
    if code != 0:   # the untrained policy's plans are beaten or tied by chance on the first iteration
        assert code == 2 and "0.pt: not saved: training did not beat the untrained model" in err
        assert not (out / "0.pt").exists()
        return
    saved = (out / "0.pt").read_bytes()
    monkeypatch.setattr(torch.optim.Adam, "step", lambda self, closure=None: None)
    untrained = torch.load(out / "0.pt", weights_only=True)["extra"]["untrained_ms"]
    assert len(untrained) == 6 and all(c > 0 for c in untrained)     # judged once, kept for --resume
    monkeypatch.setattr(trainer.DreamShardTrainer, "validation_costs", lambda self: [max(untrained)] * 6)
    code, _, err = run_script("train_dreamshard.py", [*argv, "--num-iterations", 2, "--resume"], capsys)
    last = err.strip().splitlines()[-1]      # (above it, the iterations' progress bar)
    assert code == 2 and "Traceback" not in err
    assert re.search(r"^error: .*1\.pt: not saved: training did not beat the untrained model on its own validation "
                     r"tasks \(mean plan cost .* vs .* untrained, 6 training tasks", last), last
    assert (out / "0.pt").read_bytes() == saved and not (out / "1.pt").exists()


def test_autoshard_refusal_keeps_the_old_model(tmp_path, monkeypatch):
    """AutoShard: the run's end judges the model; a refusal leaves model.pt as it was (in process, one actor)."""
    from autoshard import trainer as at
    from autoshard.config import AutoShardConfig
    from shardcore.dataset import load_dataset
    from shardcore.oracles.factory import open_oracle
    from shardcore.tasks import load_tasks

    make_dataset(tmp_path / "ds", num_tables=12, batch_size=8)
    tasks_file = tmp_path / "tasks.txt"
    tasks_file.write_text("".join(",".join(str((k + j) % 12) for j in range(4)) + "\n" for k in range(6)))
    ds = load_dataset(tmp_path / "ds", with_lookups=False)
    tasks = load_tasks(tasks_file, num_tables=ds.num_tables)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.pt").write_bytes(b"old")
    costs = iter([[2.0] * 6, [2.0] * 6])   # untrained, then trained: a tie
    monkeypatch.setattr(at.AutoShardTrainer, "validation_costs", lambda self, lock: next(costs))
    cfg = AutoShardConfig(unroll_length=5, batch_size=1, replay_ratio=0, eval_interval=0, num_actors=1)
    with open_oracle(tmp_path / "ds", 2, oracle="emulated:h200") as oracle:
        t = at.AutoShardTrainer(cfg, ds.tables, tasks, 2, 5.0, oracle, tmp_path / "out", log=lambda s: None)
        with pytest.raises(ShardError, match=r"model\.pt: not saved: training did not beat the untrained model.*"
                                             r"model\.pt keeps what it held"):
            t.run(5, num_actors=1)
    assert (tmp_path / "out" / "model.pt").read_bytes() == b"old"


def test_neuroshard_refused_comm_model_leaves_compute_pt(tmp_path, capsys, monkeypatch):
    """train_neuroshard.py wrote compute.pt before a communication model could be refused."""
    from test_neuroshard_helpers import comm_data

    mod = script("train_neuroshard.py")
    data = tmp_path / "compute"
    data.mkdir()
    compute_csv(data / "compute_costs.csv", good_rows(30))
    out = tmp_path / "models"
    out.mkdir()
    (out / "compute.pt").write_bytes(b"old")
    monkeypatch.setattr(mod, "load_comm_data", lambda _: (*comm_data(30), {}))

    def refuse(kind, *a, **k):
        raise ShardError(f"{kind}: training did not beat the untrained model on its own validation data")

    monkeypatch.setattr(mod, "fit_comm_model", refuse)
    code, _, err = run_script("train_neuroshard.py", ["--skip-collection", "--compute-data-dir", data,
                                                      "--comm-data-dir", tmp_path, "--out-dir", out, "--epochs", 2,
                                                      "--quiet", "--gpu-devices", "0,1"], capsys)
    one_line_error(code, err, r"fw_comm: training did not beat")
    assert (out / "compute.pt").read_bytes() == b"old" and sorted(os.listdir(out)) == ["compute.pt"]


# -- class 3: outputs that replaced inputs ------------------------------------------------------------------
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


# -- class 4: checks that came too late ---------------------------------------------------------------------
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


def test_run_experiments_out_dir_checked_first(base, tmp_path, capsys):
    victim = tmp_path / "a_file"
    victim.write_text("x\n")
    code, _, err = run_script("tools/run_experiments.py", ["--scale", "tiny", "--oracle", "emulated:h200",
                                                           "--data-dir", EMU_DS, "--out-dir", victim, "--skip-train"],
                              capsys)
    one_line_error(code, err, r"--out-dir .*a_file: is a file, not a directory")
    assert victim.read_text() == "x\n"


def test_simulator_setting_warned_before_workers(tmp_path, capsys, monkeypatch):
    """eval_simulator.py --measure: NeuroShard models trained at another batch are said so before any
    measuring worker starts (the warning used to follow the start-up)."""
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


def test_help_answers_without_torch_and_scripts_keep_one_torch_thread():
    """`eval.py --help` imports no torch (2 s saved on every --help and bad flag); a script that does
    import torch later still runs it on one thread (SHARDKIT_NUM_THREADS overrides), as when run_main
    imported torch first, and the environment is left alone."""
    code = ("import sys, runpy\nsys.argv = ['eval.py', '--help']\n"
            "try:\n    runpy.run_path('eval.py', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('TORCH', 'torch' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and "TORCH False" in proc.stdout, proc.stderr[-2000:]
    code = ("import os, sys\nsys.argv = ['x']\nfrom shardcore.cli.common import run_main\n"
            "def main(argv):\n    assert 'torch' not in sys.modules\n    import torch\n"
            "    print('THREADS', torch.get_num_threads(), os.environ.get('OMP_NUM_THREADS'))\n"
            "run_main(main)\n")
    for given, want in ((None, 1), ("2", 2)):
        env = {k: v for k, v in os.environ.items() if k not in ("SHARDKIT_NUM_THREADS", "OMP_NUM_THREADS")}
        if given:
            env["SHARDKIT_NUM_THREADS"] = given
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
                              timeout=120)
        assert proc.returncode == 0 and f"THREADS {want} None" in proc.stdout, proc.stderr[-2000:]


def test_scripts_run_numpys_openblas_on_the_same_threads_as_torch():
    """run_main sets the OpenBLAS numpy has already loaded to SHARDKIT_NUM_THREADS (default 1), as torch,
    unless OPENBLAS_NUM_THREADS is given; the environment is left alone."""
    code = ("import os, sys, ctypes\nimport numpy\nsys.argv = ['x']\nfrom shardcore.cli.common import run_main\n"
            "def main(argv):\n"   # what run_main left set: read back from the library, not set again here
            "    paths = sorted({l.split()[-1] for l in open('/proc/self/maps') if 'openblas' in l.lower()})\n"
            "    paths = [p for p in paths if p.startswith('/')]\n"
            "    lib = ctypes.CDLL(paths[0]) if paths else None\n"
            "    get = next((getattr(lib, n) for n in ('scipy_openblas_get_num_threads64_', "
            "'openblas_get_num_threads64_', 'openblas_get_num_threads') if lib is not None and hasattr(lib, n)), None)\n"
            "    print('BLAS', len(paths), get() if get else None, os.environ.get('OPENBLAS_NUM_THREADS'))\n"
            "run_main(main)\n")
    runs = {}
    for given in (None, "2", "user"):
        env = {k: v for k, v in os.environ.items() if k not in ("SHARDKIT_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
        if given == "user":
            env["OPENBLAS_NUM_THREADS"] = "2"
        elif given:
            env["SHARDKIT_NUM_THREADS"] = given
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs[given] = proc.stdout.split("BLAS ")[1].split()
    if runs[None][0] == "0" or runs[None][1] == "None":
        pytest.skip("numpy here is not linked against a loadable OpenBLAS")
    assert runs[None] == ["1", "1", "None"] and runs["2"] == ["1", "2", "None"]
    assert runs["user"] == ["1", "2", "2"]          # the user's OPENBLAS_NUM_THREADS stands
