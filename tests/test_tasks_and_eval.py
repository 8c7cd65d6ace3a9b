import json
import os
import subprocess
import sys

import pytest

from shardcore.dataset import load_dataset
from shardcore.errors import ShardError
from shardcore.data.taskgen import TaskSpec, generate_tasks, halving_dims
from shardcore.tasks import load_tasks

from helpers import make_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(script, *args, check=True):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, script), *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("ds")
    make_dataset(d, num_tables=40, batch_size=16)
    return d


def test_pools_are_disjoint_and_seeded(dataset_dir):
    tables = load_dataset(dataset_dir, with_lookups=False).tables
    spec = TaskSpec(t_min=5, t_max=12, num_train=20, num_test=20, seed=7)
    train, test = generate_tasks(tables, spec)
    train_ids = {i for t in train for i in t.table_ids}
    test_ids = {i for t in test for i in t.table_ids}
    assert train_ids and test_ids and not train_ids & test_ids
    assert all(5 <= len(t) <= 12 for t in train + test)
    assert {len(t) for t in train} != {5}  # the range is used
    assert generate_tasks(tables, spec) == (train, test)
    assert generate_tasks(tables, TaskSpec(5, 12, 20, 20, seed=8)) != (train, test)


def test_neuroshard_style_respects_memory(dataset_dir):
    tables = load_dataset(dataset_dir, with_lookups=False).tables
    assert halving_dims(128) == (128, 64, 32, 16, 8, 4)
    spec = TaskSpec(t_min=3, t_max=8, num_train=10, num_test=10, dims=halving_dims(64), max_mem_gb=0.01,
                    ndevices=2, seed=1)
    train, test = generate_tasks(tables, spec)
    for task in train + test:
        assert task.dims is not None and set(task.dims) <= {64, 32, 16, 8, 4}
        mems = [t.memory_gb() for t in task.tables(tables)]
        assert max(mems) <= 0.01 and sum(mems) <= 0.02
    with pytest.raises(ShardError, match="could not draw"):
        generate_tasks(tables, TaskSpec(8, 8, 1, 1, dims=(1 << 20,), max_mem_gb=1e-6))
    with pytest.raises(ShardError, match="fewer than T"):
        generate_tasks(tables, TaskSpec(30, 30, 1, 1))


def test_gen_tasks_and_eval_plan_only_cli(dataset_dir, tmp_path):
    out = tmp_path / "tasks"
    run("tools/gen_tasks.py", "--data-dir", dataset_dir, "--T-range", "4,8", "--num-train", 5, "--num-test", 6,
        "--out-dir", out)
    assert len(load_tasks(out / "test.txt")) == 6 and len(load_tasks(out / "train.txt")) == 5
    run("tools/gen_tasks.py", "--data-dir", dataset_dir, "--T", 5, "--max-dim", 32, "--max-mem", 1,
        "--num-train", 2, "--num-test", 2, "--out-dir", tmp_path / "ns")
    assert load_tasks(tmp_path / "ns" / "test.txt")[0].dims is not None

    algs = "random,naive,dim_greedy,size_greedy,lookup_greedy,size_lookup_greedy"
    res = tmp_path / "r.jsonl"
    proc = run("eval.py", "--alg", algs, "--task-path", out / "test.txt", "--data-dir", dataset_dir,
               "--gpu-devices", "0,1,2", "--max-memory", 5, "--plan-only", "--out", res)
    assert "lookup_greedy" in proc.stdout and "feasible" in proc.stdout
    records = [json.loads(line) for line in res.read_text().splitlines()]
    assert len(records) == 6 * 6
    for r in records:
        assert {"task", "alg", "allocation", "feasible", "memory_gb", "planning_seconds"} <= set(r)
        assert r["feasible"] and len(r["memory_gb"]) == 3 and max(r["allocation"]) < 3
    # NeuroShard-style tasks load through the same path.
    run("eval.py", "--alg", "lookup_greedy", "--task-path", tmp_path / "ns" / "test.txt",
        "--data-dir", dataset_dir, "--ndevices", 2, "--plan-only")


def test_eval_reports_infeasible_tasks(dataset_dir, tmp_path):
    tables = load_dataset(dataset_dir, with_lookups=False).tables
    big = max(tables, key=lambda t: t.size)
    task = tmp_path / "t.txt"
    task.write_text(f"{big.index}\n")
    res = tmp_path / "r.jsonl"
    cap = big.memory_gb() / 2
    proc = run("eval.py", "--alg", "random,lookup_greedy", "--task-path", task, "--data-dir", dataset_dir,
               "--ndevices", 4, "--max-memory", cap, "--plan-only", "--out", res)
    assert "infeasible" in proc.stdout
    for line in res.read_text().splitlines():
        r = json.loads(line)
        assert r["feasible"] is False and r["allocation"] is None and "fits on no device" in r["error"]


@pytest.mark.parametrize("args, message", [
    (["--task-path", "missing.txt"], "task file not found"),
    (["--alg", "best_greedy"], "unknown algorithm"),
    (["--alg", "nothere.pt"], "checkpoint not found"),
    (["--gpu-devices", "0,0"], "distinct"),
])
def test_eval_errors_are_one_line(dataset_dir, tmp_path, args, message):
    task = tmp_path / "t.txt"
    task.write_text("0,1,2\n")
    base = ["--task-path", task, "--data-dir", dataset_dir, "--plan-only"]
    proc = run("eval.py", *(base + args), check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
