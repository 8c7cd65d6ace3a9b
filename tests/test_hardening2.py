"""Issue #28, hardening round two, grouped by class: numbers that argparse (or a file) let through,
outputs that destroyed inputs, silent wrong results (derived state trusted, NaN networks kept,
predictions read as measurements) and checks that came too late. Each case runs the script's
``main`` through ``run_main`` in this process: a traceback fails the test."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

from shardcore import io
from shardcore.oracles.cache import CostCache
from shardcore.dataset import load_dataset
from shardcore.errors import ShardError
from shardcore.types import PlanResult
from shardcore.types import Topology

from helpers import small_base
from test_hardening import copy_ds, run_script

SEED_SCRIPTS = ["eval.py", "plan.py", "eval_simulator.py", "train_neuroshard.py", "train_compute_cost_model.py",
                "tools/gen_tasks.py", "tools/gen_dlrm_data.py", "tools/bench_planning.py", "tools/run_experiments.py",
                "train_autoshard.py", "train_dreamshard.py"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return small_base(tmp_path_factory, "hardening2")


def one_line_error(code, err, pattern):
    lines = err.splitlines()
    assert code == 2, err[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    assert re.search(pattern, lines[0]), lines[0]


def ep(base, *extra):
    return ["--task-path", base / "tasks.txt", "--data-dir", base / "ds", "--gpu-devices", "0,1",
            "--max-memory", 5, "--plan-only", "--quiet", *extra]


# -- class 1: numbers --------------------------------------------------------------------------------------
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


COMPUTE_HEADER = "sample,table_ids,dims,rows,pooling_factors,fw_ms,bw_ms\n"


def compute_csv(path, rows):
    path.write_text(COMPUTE_HEADER + "".join(rows))
    return path


def good_rows(n):
    return [f"{k},{k % 5};{(k + 1) % 5},8;4,{100 + k};{50 + k},2.0;1.0,{1.0 + 0.1 * k},{2.0 + 0.2 * k}\n"
            for k in range(n)]


@pytest.mark.parametrize("bad, pattern", [
    ("9,1;2,8;4,100;50,2.0;1.0,nan,2.0\n", r"c.csv:11: fw_ms must be a finite number >= 0"),
    ("9,1;2,8;4,100;50,2.0;1.0,-1,2.0\n", r"c.csv:11: fw_ms must be a finite number >= 0"),
    ("9,1;2,8;4,100;50\n", r"c.csv:11: "),                 # a row cut short
    ("9,1;x,8;4,100;50,2.0;1.0,1,2.0\n", r"c.csv:11: unreadable cost row"),
    ("9,1;2,8;4,100;50,2.0;inf,1,2.0\n", r"c.csv:11: .*pooling factors finite"),
])
def test_cost_csv_rows(bad, pattern, tmp_path, capsys):
    p = compute_csv(tmp_path / "c.csv", good_rows(9) + [bad])
    code, _, err = run_script("train_compute_cost_model.py",
                              ["--data_dir", p, "--out_path", tmp_path / "m.pt", "--epochs", 1, "--quiet"], capsys)
    one_line_error(code, err, pattern)
    assert not (tmp_path / "m.pt").exists()


@pytest.mark.parametrize("record, pattern", [
    ({"task": 0, "cost_ms": 1.0}, r"r.jsonl:1: not an eval.py --out record \(no 'alg'\)"),
    ({"alg": "a", "task": -1}, r"'task' must be a whole number"),
    ({"alg": "a", "task": 0, "cost_ms": float("nan"), "device_costs_ms": [[1, 1, 1, 1]]}, r"'cost_ms' must be finite"),
    ({"alg": "a", "task": 0, "cost_ms": 1.0, "device_costs_ms": [[1, 1, "x", 1]]}, r"'device_costs_ms'"),
])
def test_shardkit_compare_records(record, pattern, tmp_path, capsys):
    p = tmp_path / "r.jsonl"
    p.write_text(json.dumps(record) + "\n")
    code, _, err = run_script("tools/shardkit_compare.py", [p], capsys)
    one_line_error(code, err, pattern.replace("finite", "a finite number"))


# -- class 2: outputs that would destroy inputs ------------------------------------------------------------
def test_eval_out_names_an_input(base, tmp_path, capsys):
    before = (base / "tasks.txt").read_bytes()
    for target, flag in [(base / "tasks.txt", "--task-path"), (base / "ds" / "data.pt", r"--data-dir \(data.pt\)"),
                         (base / "ds" / "table_configs.json", r"--data-dir \(table_configs")]:
        code, _, err = run_script("eval.py", ep(base, "--out", target), capsys)
        one_line_error(code, err, rf"--out .* is also the input {flag}")
    os.link(base / "tasks.txt", tmp_path / "hard_link.txt")     # a hard link is the same file
    code, _, err = run_script("eval.py", ep(base, "--out", tmp_path / "hard_link.txt"), capsys)
    one_line_error(code, err, r"is also the input --task-path")
    cache = tmp_path / "c.sqlite"
    CostCache(cache).check_usable()
    code, _, err = run_script("eval.py", ep(base, "--cache-path", cache, "--out", cache), capsys)
    one_line_error(code, err, r"is also the input --cache-path")
    assert (base / "tasks.txt").read_bytes() == before


def test_out_never_replaces_another_kind(base, tmp_path, capsys):
    other = tmp_path / "other.sqlite"
    CostCache(other).check_usable()
    code, _, err = run_script("eval.py", ep(base, "--out", other), capsys)
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


def test_cache_path_problems_are_named(tmp_path):
    d = tmp_path / "adir"
    d.mkdir()
    with pytest.raises(ShardError, match="is a directory") as exc:
        CostCache(d).check_usable()
    assert "delete the file" not in str(exc.value)
    if os.geteuid() != 0:
        ro = tmp_path / "ro.sqlite"
        CostCache(ro).check_usable()
        os.chmod(ro, 0o444)
        with pytest.raises(ShardError, match="read-only") as exc:
            CostCache(ro).check_usable()
        assert "delete the file" not in str(exc.value)


def test_autoshard_sigterm_saves(tmp_path):
    import signal

    from test_hardening import additive_costs, fake_trainer

    box = {"sent": False}

    def measure(shards):
        if box["trainer"].model.steps > 0 and not box["sent"]:
            box["sent"] = True
            os.kill(os.getpid(), signal.SIGTERM)
        return additive_costs(shards)

    box["trainer"] = trainer = fake_trainer(tmp_path, measure, "term")
    before = signal.getsignal(signal.SIGTERM)
    summary = trainer.run(10 ** 6, num_actors=1)
    assert summary["interrupted"] and summary["steps"] > 0
    assert torch.load(tmp_path / "term" / "model.pt", weights_only=True)["steps"] == summary["steps"]
    assert signal.getsignal(signal.SIGTERM) is before


# -- class 3: silent wrong results -------------------------------------------------------------------------
def dreamshard_checkpoint(base, tmp_path, change):
    from dreamshard.config import DreamShardConfig
    from dreamshard.sharder import DreamShardModel
    from shardcore.tables import FeatureScaler

    tables = load_dataset(base / "ds", with_lookups=False).tables
    model = DreamShardModel.new(DreamShardConfig(), FeatureScaler.fit(tables))
    p = tmp_path / "ds.pt"
    model.save(p)
    obj = torch.load(p, weights_only=True)
    change(obj)
    torch.save(obj, p)
    return p


def nan_first_weight(obj):
    key = next(iter(obj["policy"]))
    obj["policy"][key] = torch.full_like(obj["policy"][key], float("nan"))


@pytest.mark.parametrize("change, pattern", [
    (nan_first_weight, r"broken checkpoint \(non-finite values in policy\."),
    (lambda o: o["scaler"].update(mean=[float("nan")] * len(o["scaler"]["mean"])), r"non-finite values in scaler"),
    (lambda o: o["scaler"].update(std=[0.0] * len(o["scaler"]["std"])), r"standard deviations finite and positive"),
])
def test_bad_checkpoint_refused(base, tmp_path, capsys, change, pattern):
    p = dreamshard_checkpoint(base, tmp_path, change)
    code, _, err = run_script("eval.py", ep(base, "--alg", p), capsys)
    one_line_error(code, err, pattern)


def test_nan_network_is_never_saved(tmp_path):
    p = tmp_path / "m.pt"
    p.write_bytes(b"old")
    with pytest.raises(ShardError, match="not saved .*non-finite values in net.w"):
        io.save_checkpoint({"method": "x", "net": {"w": torch.tensor([1.0, float("inf")])}}, p)
    assert p.read_bytes() == b"old"


def test_cost_model_never_kept_after_divergence():
    from neuroshard.config import compute_model_config
    from neuroshard.fitting import _train_loop

    net = torch.nn.Linear(2, 1)
    x = torch.ones(4, 2)
    with pytest.raises(ShardError, match=r"training diverged: no epoch has finite weights .*nothing saved"):
        _train_loop(net, compute_model_config(epochs=2), (x, torch.ones(4, 1)), predict=lambda b: net(b[0]).abs(),
                    target=lambda b: b[1], weight=lambda b: torch.ones_like(b[1]), val_score=lambda: float("nan"),
                    epochs=2)


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


def test_prediction_never_read_as_measurement(tmp_path):
    from shardcore.oracles.emulated.emulator import read_shard_lines
    from shardcore.tables import TableConfig

    tables = [TableConfig(0, 100, 8, 1.0)]
    p = tmp_path / "pred.jsonl"
    p.write_text(json.dumps({"tables": [[0, 8]], "fw_ms": 1.0, "bw_ms": 2.0, "oracle": "emulated:h200",
                             "predicted": True}) + "\n")
    with pytest.raises(ShardError, match=r"pred.jsonl:1: holds predictions"):
        read_shard_lines(p, tables)
    p.write_text('{"tables": [[0, 8]], "fw_ms": Infinity}\n')
    with pytest.raises(ShardError, match=r"fw_ms must be a non-negative number \(and finite\)"):
        read_shard_lines(p, tables)


def test_resume_refuses_other_settings(tmp_path):
    from test_hardening import fake_trainer

    trainer = fake_trainer(tmp_path, lambda shards: None, "r")
    extra = {"provenance": dict(trainer._provenance()), "ndevices": 2, "max_memory_gb": 5.0}
    trainer._check_resume(extra)     # the same settings: fine
    trainer_ctx = type("Ctx", (), {"hardware": "cpu", "dataset": "abcd", "batch_size": 16, "optimizer": "exact_sgd"})
    trainer.oracle.context = trainer_ctx     # a measured oracle's cache setting
    extra["provenance"] = dict(trainer._provenance())
    for key, value in [("hardware", "another GPU"), ("dataset", "0123abcd"), ("batch_size", 999), ("ndevices", 8),
                       ("max_memory_gb", 1.0), ("pf_augment", 0.25)]:     # tables made heavier (--pf-augment)
        bad = {**extra, "provenance": {**extra["provenance"], key: value}}
        if key in ("ndevices", "max_memory_gb"):
            bad = {**extra, key: value, "provenance": {k: v for k, v in extra["provenance"].items() if k != key}}
        with pytest.raises(ShardError, match="--resume: the checkpoint was trained with"):
            trainer._check_resume(bad)


def test_autoshard_divergence_is_one_line(tmp_path):
    from test_hardening import additive_costs, fake_trainer

    trainer = fake_trainer(tmp_path, additive_costs, "div")
    real_learn = trainer.learn

    def poisoned(unrolls):
        stats = real_learn(unrolls)
        with torch.no_grad():
            next(trainer.model.net.parameters()).fill_(float("nan"))
        return stats

    trainer.learn = poisoned
    with pytest.raises(ShardError, match=r"training diverged at update 1 .*; nothing saved from the diverged"):
        trainer.run(10 ** 6, num_actors=1)
    assert not (tmp_path / "div" / "model.pt").exists()


# -- class 4: checks that came too late --------------------------------------------------------------------
def test_unusable_cache_found_before_workers(base, tmp_path, monkeypatch):
    from shardcore.oracles.measured import driver as evaluator
    from shardcore.oracles import factory as oracles

    started = []
    monkeypatch.setattr(evaluator.PlanEvaluator, "__init__", lambda self, *a, **k: started.append(1))
    d = tmp_path / "cache_dir"
    d.mkdir()
    with pytest.raises(ShardError, match="is a directory"):
        oracles.open_oracle(base / "ds", 2, cache=d)
    assert started == []


def test_shardkit_falls_back_to_torchrec_where_greedy_cannot_place():
    """A table larger than one device's cap: no greedy start places it, TorchRec's row-wise split does;
    shardkit must not call the task infeasible."""
    from shardcore.cli import algorithms
    from shardcore.tables import TableConfig

    tables = [TableConfig(0, 4_000_000, 128, 2.0), TableConfig(1, 1000, 16, 1.0), TableConfig(2, 5000, 32, 3.0)]
    sharder = algorithms.resolve("shardkit", oracle="emulated:h200", time=0.2)
    plan = sharder.shard(tables, Topology(4, 0.6, "fp16"))
    assert plan.is_feasible(tables, 0.6, "fp16")
