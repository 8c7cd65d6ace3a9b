"""AutoShard end to end on tiny data with the real evaluator (CPU, gloo): training, resume, Ctrl-C,
clean actor shutdown, evaluation."""

import csv
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from autoshard.config import AutoShardConfig
from autoshard.sharder import AutoShardModel
from autoshard.trainer import AutoShardTrainer
from shardcore.dataset import load_dataset
from shardcore.oracles.cache import CachedOracle
from shardcore.oracles.measured.driver import PlanEvaluator
from shardcore.tasks import Task, save_tasks

from helpers import make_dataset
from shardcore.topology import Topology

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("autoshard")
    make_dataset(d / "ds", num_tables=24, batch_size=64)
    save_tasks(d / "train.txt", [Task(tuple(range(k, k + 6))) for k in range(0, 12, 3)])
    save_tasks(d / "test.txt", [Task(tuple(range(12, 20))), Task(tuple(range(16, 24)))])
    return d


def common(d):
    return ["--data-dir", d / "ds", "--ndevices", 2, "--max-memory", 5, "--cache-path", d / "c.sqlite",
            "--bench-iters", 2, "--warmup-iters", 1, "--comm-iters", 3]


def train_cmd(d, steps, *extra):
    return list(map(str, [sys.executable, os.path.join(ROOT, "train_autoshard.py"), "--task-path", d / "train.txt",
                          "--savedir", d / "models", "--total-steps", steps, "--unroll-length", 10,
                          "--batch-size", 2, "--num-actors", 2, "--replay-ratio", 2] + common(d) + list(extra)))


def descendants(pid):
    """Live processes below ``pid`` (from /proc)."""
    children = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                stat = open(f"/proc/{p}/stat").read()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(p))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def alive(pid):
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_train_resume_and_eval(tiny):
    d = tiny
    proc = subprocess.run(train_cmd(d, 120), capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = d / "models" / "default"
    for name in ("model.pt", "train_log.csv", "episodes.csv", "train_curve.png"):
        assert (out / name).exists(), name
    assert (out / "train_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.DictReader(open(out / "train_log.csv")))
    assert [int(r["step"]) for r in rows] == [20 * (k + 1) for k in range(6)]
    episodes = list(csv.DictReader(open(out / "episodes.csv")))
    assert episodes and all(0.0 <= float(e["return"]) <= 1.0 and float(e["cost_ms"]) > 0 for e in episodes)
    ckpt = torch.load(out / "model.pt", weights_only=True)
    assert ckpt["method"] == "autoshard" and ckpt["steps"] == 120
    assert len(ckpt["extra"]["cost_buffer"]["costs"]) >= 2 * len(episodes) - 2

    # an existing checkpoint is never overwritten by a fresh run
    proc = subprocess.run(train_cmd(d, 120), capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error:") and "--resume" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1

    # a resumed training keeps its hyper-parameters: one given with another value is refused in one line
    saved = (out / "model.pt").read_bytes()
    proc = subprocess.run(train_cmd(d, 160, "--resume", "--learning-rate", "0.01"), capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
    assert "--learning-rate 0.001, this run gives 0.01" in proc.stderr
    assert (out / "model.pt").read_bytes() == saved

    proc = subprocess.run(train_cmd(d, 160, "--resume"), capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert torch.load(out / "model.pt", weights_only=True)["steps"] == 160
    assert len(list(csv.DictReader(open(out / "train_log.csv")))) == 8

    # evaluate on unseen tables and another device count, beside a baseline
    res = d / "r.jsonl"
    cmd = list(map(str, [sys.executable, os.path.join(ROOT, "eval.py"), "--alg", "random,autoshard", "--checkpoint",
                         out / "model.pt", "--task-path", d / "test.txt", "--out", res, "--quiet"] + common(d)))
    cmd[cmd.index("--ndevices") + 1] = "3"
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(res.read_text().splitlines()) == 4 and "% over random" in proc.stdout


def test_actors_stop_cleanly_in_process(tiny):
    d = tiny
    ds = load_dataset(d / "ds", with_lookups=False)
    tasks = [Task(tuple(range(k, k + 6))) for k in range(0, 12, 3)]
    cfg = AutoShardConfig(unroll_length=10, batch_size=2, replay_ratio=1)
    with CachedOracle(PlanEvaluator(d / "ds", ndevices=2, bench_iters=2, warmup_iters=1, comm_iters=3), d / "c2.sqlite") as ev:
        trainer = AutoShardTrainer(cfg, ds.tables, tasks, Topology(2, 5.0), ev, d / "inproc", log=lambda *_: None)
        summary = trainer.run(40, num_actors=2)
        workers = ev.oracle.worker_pids
    assert summary["steps"] == 40 and not summary["interrupted"] and summary["plans_measured"] >= 1
    assert (d / "inproc" / "model.pt").exists()
    # the actors are gone (the evaluator's workers belong to the evaluator, closed by its with-block)
    assert [p for p in multiprocessing.active_children() if p.name.startswith("autoshard-actor")] == []
    assert not any(alive(p) for p in workers)


def test_ctrl_c_again_and_again_saves_and_leaves_no_processes(tiny):
    d = tiny
    cmd = train_cmd(d, 100000, "--xpid", "interrupted")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    episodes = d / "models" / "interrupted" / "episodes.csv"
    kids = []
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:   # wait until it trains (a few episodes logged)
            if episodes.exists() and len(episodes.read_text().splitlines()) > 3:
                break
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            time.sleep(0.5)
        kids = descendants(proc.pid)
        assert len(kids) >= 2 + 2          # 2 actors, 2 evaluator workers (and helpers)
        proc.send_signal(signal.SIGINT)
        for _ in range(12):   # an impatient user: Ctrl-C again and again must not cost the checkpoint or the
            time.sleep(0.3)   # summary, whether it comes while stopping, saving, plotting or exiting
            if proc.poll() is not None:
                break
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:   # never leave a stuck run behind for the other tests
        if proc.poll() is None:
            for k in kids + [proc.pid]:
                try:
                    os.kill(k, signal.SIGKILL)
                except OSError:
                    pass
            proc.wait()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted, saved" in _ or "interrupted, saved" in err
    ckpt = torch.load(d / "models" / "interrupted" / "model.pt", weights_only=True)
    assert ckpt["steps"] > 0
    time.sleep(1.0)
    assert [k for k in kids if alive(k)] == []


def test_run_autoshard_with_more_plan_devices_than_listed_devices(tiny):
    """AutoShard's own command line: plans of --ndevices 8 measured on the 4 listed (logical) devices,
    each plan device's compute on those in turn and the exchange modelled, as eval.py does."""
    d = tiny
    cmd = list(map(str, [sys.executable, os.path.join(ROOT, "run_autoshard.py"), "--gpu-devices", "0,1,2,3",
                         "--ndevices", 8, "--task-path", d / "train.txt", "--data-dir", d / "ds",
                         "--max-memory", 5, "--cache-path", d / "c8.sqlite", "--bench-iters", 2, "--comm-iters", 3,
                         "--warmup-iters", 1, "--savedir", d / "models8", "--total-steps", 40,
                         "--unroll-length", 10, "--batch-size", 2, "--num-actors", 1, "--replay-ratio", 2]))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "8 devices (measured on 4)" in proc.stdout
    ckpt = torch.load(d / "models8" / "default" / "model.pt", weights_only=True)
    assert ckpt["method"] == "autoshard" and ckpt["steps"] == 40
    episodes = list(csv.DictReader(open(d / "models8" / "default" / "episodes.csv")))
    assert episodes and all(float(e["cost_ms"]) > 0 for e in episodes)


def test_speedup_reward_bounded_queue_and_policy_checks_in_process(tiny):
    """The learner's queue is bounded (the actors never run far ahead: few plans measured beyond those
    learned from, policy lag of a few updates), the speedup reward is the lookup greedy's cost over the
    plan's, and the greedy policy is checked against the lookup greedy into policy_eval.csv."""
    d = tiny
    ds = load_dataset(d / "ds", with_lookups=False)
    tasks = [Task(tuple(range(k, k + 6))) for k in range(0, 12, 3)]
    cfg = AutoShardConfig(unroll_length=10, batch_size=2, replay_ratio=1, reward="speedup", eval_interval=40)
    with CachedOracle(PlanEvaluator(d / "ds", ndevices=2, bench_iters=2, warmup_iters=1, comm_iters=3), d / "c3.sqlite") as ev:
        trainer = AutoShardTrainer(cfg, ds.tables, tasks, Topology(2, 5.0), ev, d / "speedup", log=lambda *_: None)
        summary = trainer.run(100, num_actors=2)
        refs = trainer.reference_costs()
    assert summary["steps"] == 100 and len(refs) == 4 and all(r > 0 for r in refs)
    episodes = list(csv.DictReader(open(d / "speedup" / "episodes.csv")))
    for e in episodes:   # every reward is its task's reference cost over the plan's cost
        assert float(e["return"]) == pytest.approx(refs[int(e["task"])] / float(e["cost_ms"]), rel=1e-3)
    rows = list(csv.DictReader(open(d / "speedup" / "train_log.csv")))
    assert all(float(r["policy_lag"]) <= 2 * cfg.buffers(2) for r in rows)
    # unrolls of 10 steps hold at most 2 episodes of 6 tables; the bounded queue holds buffers(2) of them
    assert summary["plans_measured"] <= summary["episodes"] + 2 * (cfg.buffers(2) + 2) + 2
    checks = list(csv.DictReader(open(d / "speedup" / "policy_eval.csv")))
    assert {r["alg"] for r in checks} == {"lookup_greedy", "policy"}
    assert sorted({int(r["step"]) for r in checks if r["alg"] == "policy"}) == [20, 60, 100]
    assert all(float(r["cost_ms"]) > 0 for r in checks)
    # best.pt: the weights of the check with the lowest mean cost over the lookup greedy's (what is evaluated)
    greedy = {r["task"]: float(r["cost_ms"]) for r in checks if r["alg"] == "lookup_greedy"}
    ratio = {}
    for r in checks:
        if r["alg"] == "policy":
            ratio.setdefault(int(r["step"]), []).append(float(r["cost_ms"]) / greedy[r["task"]])
    best_step = min(ratio, key=lambda k: (sum(ratio[k]) / len(ratio[k]), k))
    best = AutoShardModel.load(d / "speedup" / "best.pt")
    assert best.steps == best_step
    assert best.extra["best_ratio"] == pytest.approx(sum(ratio[best_step]) / len(ratio[best_step]), rel=1e-3)
    assert "optimizer" not in best.extra and "cost_buffer" not in best.extra   # planning weights only
    assert AutoShardModel.load(d / "speedup" / "model.pt").extra["best_ratio"] == best.extra["best_ratio"]


def test_time_limit_between_checks_still_checks_the_last_weights(tiny):
    """A run stopped by its time limit between two policy checks checks its last weights too, so best.pt is
    never an earlier policy only because the next check did not come."""
    d = tiny
    ds = load_dataset(d / "ds", with_lookups=False)
    tasks = [Task(tuple(range(k, k + 6))) for k in range(0, 12, 3)]
    cfg = AutoShardConfig(unroll_length=10, batch_size=2, replay_ratio=1, eval_interval=10 ** 6)
    with CachedOracle(PlanEvaluator(d / "ds", ndevices=2, bench_iters=2, warmup_iters=1, comm_iters=3), d / "c4.sqlite") as ev:
        trainer = AutoShardTrainer(cfg, ds.tables, tasks, Topology(2, 5.0), ev, d / "timed", log=lambda *_: None)
        summary = trainer.run(10 ** 6, num_actors=2, time_limit_s=3.0)
    assert trainer.timed_out and 20 < summary["steps"] < 10 ** 6
    checks = list(csv.DictReader(open(d / "timed" / "policy_eval.csv")))
    steps = sorted({int(r["step"]) for r in checks if r["alg"] == "policy"})
    assert steps == [20, summary["steps"]]          # the first update's check, and the last weights'
    assert AutoShardModel.load(d / "timed" / "best.pt").steps in steps
