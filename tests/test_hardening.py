"""Issue #16: adversarial inputs. Every bad input gives exactly one line ``error: ...`` on stderr and
exit status 2 before any expensive work; nothing exits 0 with a wrong result; AutoShard keeps its
checkpoint on Ctrl-C and on failures, and notices a dead actor.

The table ``CASES`` runs the scripts' ``main`` in this process (through ``run_main``, as the scripts
do): fast, and a traceback would fail the test."""

from __future__ import annotations

import importlib.util
import json
import math
import multiprocessing
import os
import re
import shutil
import signal
import sqlite3
import time

import pytest
import torch

from shardcore.cli import common as cli
from shardcore.types import CacheContext
from shardcore.oracles.cache import CostCache
from shardcore.dataset import load_dataset, load_table_configs
from shardcore.errors import ShardError
from shardcore.tables import TableConfig

from helpers import FnOracle, make_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _script(rel):
    name = "hardening_" + rel.replace("/", "_").replace(".py", "")
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, rel))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SCRIPTS = {}


def script(rel):
    if rel not in SCRIPTS:
        SCRIPTS[rel] = _script(rel)
    return SCRIPTS[rel]


def run_script(rel, argv, capsys):
    """(exit status, stdout, stderr) of ``rel``'s main through run_main, in this process."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        cli.run_main(script(rel).main, [str(a) for a in argv])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("hardening")
    make_dataset(d / "ds", num_tables=20, batch_size=16)
    (d / "tasks.txt").write_text("0,1,2,3,4\n5,6,7,8,9\n10,11,12\n13,14,15,16\n")
    (d / "a_file").write_text("not a directory\n")
    return d


def copy_ds(base, tmp_path):
    shutil.copytree(base / "ds", tmp_path / "ds")
    return tmp_path / "ds"


def edit_configs(base, tmp_path, change):
    ds = copy_ds(base, tmp_path)
    p = ds / "table_configs.json"
    obj = json.loads(p.read_text())
    change(obj["tables"])
    # allow_nan: writes NaN / Infinity as the adversary's file has them
    p.write_text(json.dumps(obj, allow_nan=True))
    return ds


NON_UTF8 = b"\xff\xfe\x00bad \xe9 bytes\n"


# -- builders: each returns the argv for the script, given the base fixture and a fresh folder ---------------
def ep(base, ds=None, tasks=None, *extra):
    """The issue's ``EP``: eval.py --plan-only on 4 devices, cap 5 GB."""
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


def write(t, name, data):
    p = t / name
    if isinstance(data, bytes):
        p.write_bytes(data)
    else:
        p.write_text(data)
    return p


def set_field(k, name, value):
    def change(tables):
        tables[k][name] = value
    return change


def checkpoint(t, obj, name="ck.pt"):
    p = t / name
    torch.save(obj, p)
    return p


def dreamshard_mismatch(base, t):
    from dreamshard.config import DreamShardConfig
    from dreamshard.sharder import DreamShardModel
    from shardcore.tables import FeatureScaler

    tables = load_dataset(base / "ds", with_lookups=False).tables
    model = DreamShardModel.new(DreamShardConfig(), FeatureScaler.fit(tables))
    p = t / "ds.pt"
    model.save(p)
    obj = torch.load(p, weights_only=True)
    obj["config"]["hidden"] = 64    # the weights are 128 wide
    torch.save(obj, p)
    return p


class Evil:
    def __reduce__(self):
        return (print, ("PWNED: code ran while loading",))


CASES = [
    # 1. files that are not UTF-8 text
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
    ("1-plan-csv", "plan.py", lambda b, t: ["--tables", write(t, "t.csv", b"name,rows,dim,pooling_factor\n" + NON_UTF8)],
     r"t.csv: not UTF-8"),
    ("1-plan-json", "plan.py", lambda b, t: ["--tables", write(t, "t.json", NON_UTF8)], r"t.json: not UTF-8"),
    # 2. infinite numbers
    ("2-row-infinity", "eval.py", lambda b, t: ep(b, edit_configs(b, t, set_field(3, "row", math.inf))),
     r"tables\[3\]: row must be finite"),
    ("2-max-memory-inf", "eval.py", lambda b, t: ep(b, None, None, "--alg", "torchrec", "--max-memory", "inf"),
     r"--max-memory.*finite"),
    ("2-max-memory-nan", "plan.py", lambda b, t: ["--tables", "x.csv", "--max-memory", "nan"], r"finite"),
    # 3. outputs that cannot be written: refused before any work
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
    # 4. broken checkpoints
    ("4-checkpoint-no-config", "eval.py",
     lambda b, t: ep(b, None, None, "--alg", checkpoint(t, {"method": "dreamshard", "version": 1})),
     r"broken checkpoint \(no 'config' entry\)"),
    ("4-checkpoint-config-mismatch", "eval.py", lambda b, t: ep(b, None, None, "--alg", dreamshard_mismatch(b, t)),
     r"broken checkpoint \(weights do not match its config\)"),
    # 6., 7., 8. inputs that gave wrong results with exit 0
    ("6-nan-reuse-bin", "eval.py", lambda b, t: ep(b, edit_configs(b, t, set_field(2, "bin_3", math.nan))),
     r"tables\[2\]: bin_3 must be finite"),
    ("7-row-below-max-index", "eval.py", lambda b, t: ep(b, edit_configs(b, t, set_field(4, "row", 2))),
     r"table 4 looks up row \d+ but table_configs.json gives it only 2 rows"),
    ("8-max-tasks-negative", "eval.py", lambda b, t: ep(b, None, None, "--max-tasks", -1), r"--max-tasks.*positive"),
    ("8-max-tasks-zero", "eval.py", lambda b, t: ep(b, None, None, "--max-tasks", 0), r"--max-tasks.*positive"),
    ("8-replay-ratio-negative", "train_autoshard.py", lambda b, t: ["--replay-ratio", -3], r"--replay-ratio.*>= 0"),
    ("8-row-fraction", "eval.py", lambda b, t: ep(b, edit_configs(b, t, set_field(1, "row", 12.7))),
     r"row must be a whole number"),
    # 9., 10. checkpoints as an attack
    ("9-method-imported", "eval.py", lambda b, t: ep(b, None, None, "--alg", checkpoint(t, {"method": "this"})),
     r"unknown method 'this'"),
    ("10-malicious-pickle", "eval.py",
     lambda b, t: ep(b, None, None, "--alg", checkpoint(t, {"method": "dreamshard", "x": Evil()})),
     r"refused as unsafe"),
    # 12. validation that came too late
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
    ("12-dim-plan", "plan.py", lambda b, t: ["--tables", write(t, "t.csv", "name,rows,dim,pooling_factor\na,10,6,1\n")],
     r"dim 6 is not a multiple of 4"),
    ("12-dim-task-file", "eval.py", lambda b, t: ep(b, None, write(t, "t.txt", "0,1 8,10\n")),
     r"t.txt:1: dim 10 is not a multiple of 4"),
    ("12-dim-configs", "eval.py", lambda b, t: ep(b, edit_configs(b, t, set_field(0, "dim", 7))),
     r"tables\[0\]: dim 7 is not a multiple of 4"),
    # minor: a flag error is one line (no usage block)
    ("minor-unknown-flag", "eval.py", lambda b, t: ["--no-such-flag"], r"^error: \S+: unrecognized arguments: --no-such-flag \(see --help\)$"),
    ("minor-bad-int", "tools/gen_tasks.py", lambda b, t: ["--num-test", "-1"], r"--num-test.*>= 0"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line(case, base, tmp_path, capsys):
    _, rel, build, pattern = case
    argv = build(base, tmp_path)
    t0 = time.perf_counter()
    code, out, err = run_script(rel, argv, capsys)
    lines = err.splitlines()
    assert code == 2, (out[-500:], err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and "weights_only=False" not in err
    assert re.search(pattern, lines[0]), lines[0]
    assert "PWNED" not in out and "Beautiful is better" not in out     # nothing in the file ran
    assert time.perf_counter() - t0 < 20    # before any expensive work (no workers, no measuring)
    assert not list(tmp_path.rglob("*.tmp"))


def test_flag_error_from_the_command_line_is_one_line():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, os.path.join(ROOT, "plan.py"), "--tables", "t.csv", "--ndevices", "0"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == "error: plan.py: argument --ndevices: expected a positive integer, got '0' (see --help)\n"


def test_csv_with_bom_and_crlf_is_read(tmp_path, capsys):
    p = tmp_path / "t.csv"
    p.write_bytes("\ufeffname,rows,dim,pooling_factor\r\na,1000,8,1\r\nb,10,4,2\r\n".encode())
    code, out, err = run_script("plan.py", ["--tables", p, "--ndevices", 2, "--out", tmp_path / "p.json"], capsys)
    assert code == 0, err
    assert [t["name"] for t in json.loads((tmp_path / "p.json").read_text())["tables"]] == ["a", "b"]


def test_max_tasks_counts_exactly(base, capsys):
    code, out, err = run_script("eval.py", ep(base, None, None, "--max-tasks", 3), capsys)
    assert code == 0, err
    assert out.startswith("3 tasks from")


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


# -- 5., 8., minor: the measurement cache ---------------------------------------------------------------------
CTX = CacheContext("hw", "ds", 16, "exact_sgd", "fp16")
SHARDS = [[(0, 10, 4)], [(1, 20, 8)]]


@pytest.mark.parametrize("device_costs, msg", [
    ("[[1, 2, 3", "not a JSON list"),
    ('[[1, 2, 3, 4], [-5, 0, 0, 0]]', "negative or non-finite"),
    ('[[1, 2, 3, 4], [1, 2, 3, NaN]]', "negative or non-finite"),
    ('[[1, 2, 3, 4]]', "four costs per device"),
    ('{"a": 1}', "not a JSON list"),
])
def test_corrupt_cache_plan_rows(tmp_path, device_costs, msg):
    cache = CostCache(tmp_path / "c.sqlite")
    cache.put_plan(CTX, SHARDS, [[1, 2, 3, 4], [1, 1, 1, 1]])
    with sqlite3.connect(tmp_path / "c.sqlite") as conn:
        conn.execute("UPDATE plan_costs SET device_costs = ?", (device_costs,))
    for call in (lambda: cache.get_plan(CTX, SHARDS), lambda: cache.plan_entries()):
        with pytest.raises(ShardError, match=msg) as exc:
            call()
        assert "\n" not in str(exc.value) and "--no-cache" in str(exc.value)


def test_negative_shard_cost_not_served(tmp_path):
    cache = CostCache(tmp_path / "c.sqlite")
    cache.put_shard(CTX, SHARDS[0], 1.0, 2.0)
    assert cache.get_shard(CTX, SHARDS[0]) == (1.0, 2.0)
    with sqlite3.connect(tmp_path / "c.sqlite") as conn:
        conn.execute("UPDATE shard_costs SET fw_ms = -5.0")
    with pytest.raises(ShardError, match="negative"):
        cache.get_shard(CTX, SHARDS[0])
    with pytest.raises(ShardError, match="negative"):
        cache.shard_entries()


def test_locked_cache_does_not_advise_deleting(tmp_path):
    path = tmp_path / "c.sqlite"
    CostCache(path).put_shard(CTX, SHARDS[0], 1.0, 2.0)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(ShardError) as exc:
            CostCache(path, busy_timeout_s=0.2).put_shard(CTX, SHARDS[1], 1.0, 1.0)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    text = str(exc.value)
    assert "locked" in text and "another process" in text and "--cache-path" in text
    assert "delete the file" not in text and "\n" not in text


def test_unsafe_pickle_refused_by_every_loader(tmp_path):
    from shardcore.io import load_checkpoint

    p = checkpoint(tmp_path, {"method": "autoshard", "x": Evil()})
    for load in (load_checkpoint, lambda q: torch.load(q, weights_only=True)):
        with pytest.raises(Exception) as exc:
            load(p)
        if load is load_checkpoint:
            assert isinstance(exc.value, ShardError) and "refused as unsafe" in str(exc.value)
            assert "\n" not in str(exc.value)
    ds = copy_ds_empty(tmp_path)
    torch.save({"format": "shardcore-lookups-v1", "evil": Evil()}, ds / "data.pt")
    with pytest.raises(ShardError, match="data.pt: refused as unsafe"):
        load_dataset(ds)


def copy_ds_empty(tmp_path):
    ds = tmp_path / "ds2"
    make_dataset(ds, num_tables=2, batch_size=4)
    return ds


# -- 11. AutoShard: Ctrl-C, failed measurements and dead actors keep the checkpoint ---------------------------
def fake_trainer(tmp_path, measure, name):
    from autoshard.config import AutoShardConfig
    from autoshard.trainer import AutoShardTrainer
    from shardcore.tasks import Task

    tables = [TableConfig(i, 1000 * (i + 1), 8 if i % 2 else 16, float(i % 5 + 1)) for i in range(12)]
    tasks = [Task(tuple(range(k, k + 6))) for k in range(0, 6, 2)]
    cfg = AutoShardConfig(unroll_length=6, batch_size=2, replay_ratio=0, cost_steps_per_update=1)
    return AutoShardTrainer(cfg, tables, tasks, 2, 5.0, FnOracle(measure), tmp_path / name, log=lambda *_: None)


def additive_costs(shards):
    return [[sum(t.dim * t.pooling_factor for t in s) / 100.0, 0.1, 0.1, 0.05] for s in shards]


def test_autoshard_measurement_failure_saves(tmp_path):
    box = {}

    def measure(shards):
        if box["trainer"].model.steps > 0:
            raise ShardError("device 1 worker was killed by SIGKILL; all workers stopped")
        return additive_costs(shards)

    box["trainer"] = trainer = fake_trainer(tmp_path, measure, "fail")
    with pytest.raises(ShardError) as exc:
        trainer.run(10 ** 6, num_actors=1)
    text = str(exc.value)
    assert "measurement failed: device 1 worker was killed" in text and "checkpoint saved" in text
    assert "\n" not in text
    ckpt = torch.load(tmp_path / "fail" / "model.pt", weights_only=True)
    assert ckpt["steps"] > 0
    assert [p for p in multiprocessing.active_children() if p.name.startswith("autoshard-actor")] == []


def test_autoshard_dead_actor_is_noticed(tmp_path):
    box = {"killed": False}

    def measure(shards):
        if box["trainer"].model.steps > 0 and not box["killed"]:
            victim = [p for p in multiprocessing.active_children() if p.name == "autoshard-actor-1"][0]
            os.kill(victim.pid, signal.SIGKILL)
            box["killed"] = True
        return additive_costs(shards)

    box["trainer"] = trainer = fake_trainer(tmp_path, measure, "dead")
    t0 = time.monotonic()
    with pytest.raises(ShardError, match=r"actor 1 died \(killed by SIGKILL\); checkpoint saved") as exc:
        trainer.run(10 ** 6, num_actors=2)
    assert "\n" not in str(exc.value) and time.monotonic() - t0 < 60
    assert torch.load(tmp_path / "dead" / "model.pt", weights_only=True)["steps"] > 0
    assert [p for p in multiprocessing.active_children() if p.name.startswith("autoshard-actor")] == []


def test_autoshard_second_ctrl_c_waits_for_the_save(tmp_path, capfd):
    box = {"sent": False}

    def measure(shards):
        if box["trainer"].model.steps > 0 and not box["sent"]:
            box["sent"] = True
            os.kill(os.getpid(), signal.SIGINT)             # the first Ctrl-C
        return additive_costs(shards)

    box["trainer"] = trainer = fake_trainer(tmp_path, measure, "ctrlc")
    real_save = trainer.save

    def slow_save(elapsed):
        os.kill(os.getpid(), signal.SIGINT)                 # a second Ctrl-C while saving
        time.sleep(0.2)
        return real_save(elapsed)

    trainer.save = slow_save
    before = signal.getsignal(signal.SIGINT)
    summary = trainer.run(10 ** 6, num_actors=1)
    assert summary["interrupted"] and summary["steps"] > 0
    ckpt = torch.load(tmp_path / "ctrlc" / "model.pt", weights_only=True)
    assert ckpt["steps"] == summary["steps"]
    assert "saving the checkpoint, please wait" in capfd.readouterr().err
    assert signal.getsignal(signal.SIGINT) is before
