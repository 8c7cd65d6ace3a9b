"""Checkpoints: unsafe or broken ones refused in one line, a diverged or no-better-than-untrained model never
saved, the last good one kept on failures, Ctrl-C and SIGTERM, and every checkpoint saying what produced it."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import signal
import time

import pytest
import torch

from shardcore import io
from shardcore.dataset import load_dataset
from shardcore.errors import ShardError

from helpers import (Evil, additive_costs, attack_base, check_one_line_case, compute_csv, fake_trainer, good_rows,
                     make_dataset, one_line_error, run_script, script)
from shardcore.topology import Topology


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return attack_base(tmp_path_factory, "test_checkpoints")


def ep(base, ds=None, tasks=None, *extra):
    """The attack tables' base command: eval.py --plan-only on 4 devices, cap 5 GB."""
    return ["--task-path", tasks or base / "tasks.txt", "--data-dir", ds or base / "ds",
            "--gpu-devices", "0,1,2,3", "--max-memory", 5, "--plan-only", "--quiet", *extra]


def ep_small(base, *extra):
    return ["--task-path", base / "tasks.txt", "--data-dir", base / "ds", "--gpu-devices", "0,1",
            "--max-memory", 5, "--plan-only", "--quiet", *extra]


def checkpoint(t, obj, name="ck.pt"):
    p = t / name
    torch.save(obj, p)
    return p


def dreamshard_mismatch(base, t):
    from dreamshard.config import DreamShardConfig
    from dreamshard.sharder import DreamShardModel
    from shardcore.data.features import FeatureScaler

    tables = load_dataset(base / "ds", with_lookups=False).tables
    model = DreamShardModel.new(DreamShardConfig(), FeatureScaler.fit(tables))
    p = t / "ds.pt"
    model.save(p)
    obj = torch.load(p, weights_only=True)
    obj["config"]["hidden"] = 64    # the weights are 128 wide
    torch.save(obj, p)
    return p


CASES = [
    ("4-checkpoint-no-config", "eval.py",
     lambda b, t: ep(b, None, None, "--alg", checkpoint(t, {"method": "dreamshard", "version": 1})),
     r"broken checkpoint \(no 'config' entry\)"),
    ("4-checkpoint-config-mismatch", "eval.py", lambda b, t: ep(b, None, None, "--alg", dreamshard_mismatch(b, t)),
     r"broken checkpoint \(weights do not match its config\)"),
    ("9-method-imported", "eval.py", lambda b, t: ep(b, None, None, "--alg", checkpoint(t, {"method": "this"})),
     r"unknown method 'this'"),
    ("10-malicious-pickle", "eval.py",
     lambda b, t: ep(b, None, None, "--alg", checkpoint(t, {"method": "dreamshard", "x": Evil()})),
     r"refused as unsafe"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line(case, base, tmp_path, capsys):
    check_one_line_case(case, base, tmp_path, capsys)


def copy_ds_empty(tmp_path):
    ds = tmp_path / "ds2"
    make_dataset(ds, num_tables=2, batch_size=4)
    return ds


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


def dreamshard_checkpoint(base, tmp_path, change):
    from dreamshard.config import DreamShardConfig
    from dreamshard.sharder import DreamShardModel
    from shardcore.data.features import FeatureScaler

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
    code, _, err = run_script("eval.py", ep_small(base, "--alg", p), capsys)
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


def test_autoshard_divergence_is_one_line(tmp_path):

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


def test_cost_model_kept_only_if_it_beats_untrained():
    from neuroshard.config import compute_model_config
    from neuroshard.fitting import _train_loop

    net = torch.nn.Linear(2, 1)
    scores = iter([10.0] + [20.0] * 5)     # untrained 10% validation MAPE, every epoch worse
    x = torch.ones(4, 2)
    with pytest.raises(ShardError, match=r"did not beat the untrained model .*20.00% vs 10.00% untrained.*"
                                         r"nothing saved"):
        _train_loop(net, compute_model_config(epochs=3), (x, torch.ones(4, 1)), predict=lambda b: net(b[0]).abs(),
                    target=lambda b: b[1], weight=lambda b: torch.ones_like(b[1]), val_score=lambda: next(scores),
                    epochs=3)


def test_a_handful_of_validation_samples_is_not_judged():
    """On fewer validation samples than MIN_JUDGED_VALIDATION the untrained and the trained scores are
    within each other's noise: the best epoch is kept, not refused."""
    from neuroshard.config import compute_model_config
    from neuroshard.fitting import MIN_JUDGED_VALIDATION, _train_loop

    net = torch.nn.Linear(2, 1)
    x = torch.ones(4, 2)
    scores = iter([10.0] + [10.5] * 3)
    best_epoch, best_val, _ = _train_loop(
        net, compute_model_config(epochs=3), (x, torch.ones(4, 1)), predict=lambda b: net(b[0]).abs(),
        target=lambda b: b[1], weight=lambda b: torch.ones_like(b[1]), val_score=lambda: next(scores), epochs=3,
        val_count=MIN_JUDGED_VALIDATION - 1)
    assert best_epoch == 0 and best_val == 10.5
    scores = iter([10.0] + [10.5] * 3)
    with pytest.raises(ShardError, match="did not beat the untrained model"):
        _train_loop(net, compute_model_config(epochs=3), (x, torch.ones(4, 1)), predict=lambda b: net(b[0]).abs(),
                    target=lambda b: b[1], weight=lambda b: torch.ones_like(b[1]), val_score=lambda: next(scores),
                    epochs=3, val_count=MIN_JUDGED_VALIDATION)


@pytest.mark.parametrize("rel", ["train_compute_cost_model.py", "train_comm_cost_model.py"])
def test_untrained_as_good_leaves_the_files(rel, tmp_path, capsys, monkeypatch):
    """Training that changes nothing (the optimiser's steps are no-ops) never replaces a model file."""

    import neuroshard.fitting

    monkeypatch.setattr(torch.optim.Adam, "step", lambda self, closure=None: None)
    monkeypatch.setattr(neuroshard.fitting, "MIN_JUDGED_VALIDATION", 1)   # the tiny data's few validation rows
    old_a, old_b = tmp_path / "a.pt", tmp_path / "b.pt"
    for p in (old_a, old_b):
        torch.save({"old": 1}, p)
    before = old_a.read_bytes(), old_b.read_bytes()
    if rel == "train_compute_cost_model.py":
        data = tmp_path / "data"
        data.mkdir()
        compute_csv(data / "compute_costs.csv", good_rows(12))
        argv = ["--data_dir", data, "--out_path", old_a, "--epochs", 2, "--quiet"]
    else:
        from test_neuroshard_helpers import comm_data

        monkeypatch.setattr(script(rel), "load_comm_data", lambda _: (*comm_data(30), {}))
        argv = ["--data_dir", tmp_path, "--fw_out_path", old_a, "--bw_out_path", old_b, "--epochs", 2, "--quiet"]
    code, _, err = run_script(rel, argv, capsys)
    one_line_error(code, err, r"training did not beat the untrained model on its own validation data")
    assert (old_a.read_bytes(), old_b.read_bytes()) == before


def test_checkpoints_and_cost_data_carry_provenance(base, tmp_path):
    from dreamshard.config import DreamShardConfig
    from dreamshard.sharder import DreamShardModel
    from neuroshard.collect import collect_compute
    from shardcore.io import load_checkpoint
    from shardcore.oracles.factory import open_oracle
    from shardcore.data.features import FeatureScaler

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
        t = at.AutoShardTrainer(cfg, ds.tables, tasks, Topology(2, 5.0), oracle, tmp_path / "out", log=lambda s: None)
        with pytest.raises(ShardError, match=r"model\.pt: not saved: training did not beat the untrained model.*"
                                             r"model\.pt keeps what it held"):
            t.run(5, num_actors=1)
    assert (tmp_path / "out" / "model.pt").read_bytes() == b"old"


def test_neuroshard_refused_comm_model_leaves_compute_pt(tmp_path, capsys, monkeypatch):
    """train_neuroshard.py --overwrite: a refused communication model leaves the compute.pt an earlier run
    wrote as it was (the three models are written together or not at all)."""
    from test_neuroshard_helpers import comm_data

    mod = script("train_neuroshard.py")
    data = tmp_path / "compute"
    data.mkdir()
    compute_csv(data / "compute_costs.csv", good_rows(30))
    out = tmp_path / "models"
    out.mkdir()
    torch.save({"old": 1}, out / "compute.pt")
    old = (out / "compute.pt").read_bytes()
    monkeypatch.setattr(mod, "load_comm_data", lambda _: (*comm_data(30), {}))

    def refuse(kind, *a, **k):
        raise ShardError(f"{kind}: training did not beat the untrained model on its own validation data")

    monkeypatch.setattr(mod, "fit_comm_model", refuse)
    code, _, err = run_script("train_neuroshard.py", ["--skip-collection", "--compute-data-dir", data,
                                                      "--comm-data-dir", tmp_path, "--out-dir", out, "--epochs", 2,
                                                      "--quiet", "--gpu-devices", "0,1", "--overwrite"], capsys)
    one_line_error(code, err, r"fw_comm: training did not beat")
    assert (out / "compute.pt").read_bytes() == old and sorted(os.listdir(out)) == ["compute.pt"]


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


def test_autoshard_sigterm_saves(tmp_path):
    import signal


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
