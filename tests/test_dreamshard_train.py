"""A short end-to-end DreamShard run on tiny data with the real evaluator (CPU, gloo)."""

import csv
import os
import subprocess
import sys

import torch

from shardcore.tasks import Task, save_tasks

from helpers import make_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_train_and_eval_end_to_end(tmp_path):
    ds = tmp_path / "ds"
    make_dataset(ds, num_tables=24, batch_size=64)
    save_tasks(tmp_path / "train.txt", [Task(tuple(range(k, k + 6))) for k in range(0, 12, 3)])
    save_tasks(tmp_path / "test.txt", [Task(tuple(range(12, 20))), Task(tuple(range(16, 24)))])
    out = tmp_path / "model"
    common = ["--data-dir", ds, "--ndevices", 2, "--max-memory", 5, "--cache-path", tmp_path / "c.sqlite",
              "--bench-iters", 2, "--warmup-iters", 1, "--comm-iters", 3]
    cmd = [sys.executable, os.path.join(ROOT, "train_dreamshard.py"), "--task-path", tmp_path / "train.txt",
           "--out-dir", out, "--num-iterations", 2, "--bench-steps", 3, "--bench-training-steps", 20,
           "--rl-num-batches", 3, "--rl-batch-size", 4, "--curve-tasks", 1, "--decode-samples", 4] + common
    proc = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "0.pt").exists() and (out / "1.pt").exists()
    rows = list(csv.DictReader(open(out / "train_log.csv")))
    assert [int(r["iteration"]) for r in rows] == [0, 1]
    assert all(float(r["measured_cost_ms"]) > 0 and float(r["cost_loss"]) >= 0 for r in rows)
    curve = list(csv.DictReader(open(out / "learning_curve.csv")))   # judged beside lookup greedy, drawn
    assert [int(r["iteration"]) for r in curve] == [0, 1] and float(curve[-1]["lookup_greedy_ms"]) > 0
    assert (out / "learning_curve.png").exists()
    # best.pt: a copy of the iteration whose decoded plans of the curve's tasks cost least (ties: the earlier)
    best = min((float(r["decoded_ms"]), int(r["iteration"])) for r in curve)[1]
    assert (out / "best.pt").read_bytes() == (out / f"{best}.pt").read_bytes()
    assert f"best.pt (iteration {best}:" in proc.stdout
    ckpt = torch.load(out / "1.pt", weights_only=True)
    assert ckpt["method"] == "dreamshard" and len(ckpt["extra"]["buffer"]) >= 1
    # --resume continues from the newest checkpoint
    proc = subprocess.run(list(map(str, cmd[:cmd.index("--num-iterations") + 1] + [3] +
                                   cmd[cmd.index("--num-iterations") + 2:] + ["--resume"])),
                          capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "2.pt").exists()
    assert len(list(csv.DictReader(open(out / "train_log.csv")))) == 3
    curve = list(csv.DictReader(open(out / "learning_curve.csv")))   # the resumed run's row counts too
    best = min((float(r["decoded_ms"]), int(r["iteration"])) for r in curve)[1]
    assert len(curve) == 3 and (out / "best.pt").read_bytes() == (out / f"{best}.pt").read_bytes()
    # evaluate the checkpoint beside a baseline, on other tables and another device count
    res = tmp_path / "r.jsonl"
    cmd = [sys.executable, os.path.join(ROOT, "eval.py"), "--alg", f"random,{out / '2.pt'}",
           "--task-path", tmp_path / "test.txt", "--out", res, "--quiet"] + common
    cmd[cmd.index("--ndevices") + 1] = 3
    proc = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = res.read_text().splitlines()
    assert len(lines) == 4
    assert "% over random" in proc.stdout
