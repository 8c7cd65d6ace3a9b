"""shardkit on a freshly generated dataset with an empty cache, measured oracle (CPU): eval.py calibrates
it (plans and shards of the tables outside the evaluated tasks, measured through the cache) and plans and
measures without another command first; never on the evaluated tasks' tables."""

import os
import subprocess
import sys

import pytest

from shardcore.oracles.cache import CostCache
from shardcore.tasks import load_tasks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*argv, timeout=300):
    return subprocess.run([sys.executable, *map(str, argv)], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    d = tmp_path_factory.mktemp("calib")
    proc = run("tools/gen_dlrm_data.py", "--synthetic", "--out-dir", d / "D", "--num-tables", 40, "--batch-size", 64,
               "--quiet")
    assert proc.returncode == 0, proc.stderr
    proc = run("tools/gen_tasks.py", "--data-dir", d / "D", "--T", 6, "--num-train", 2, "--num-test", 2,
               "--out-dir", d / "T")
    assert proc.returncode == 0, proc.stderr
    return d


def eval_cmd(d, cache, *extra):
    return ["eval.py", "--alg", "lookup_greedy,shardkit", "--data-dir", d / "D", "--task-path", d / "T" / "test.txt",
            "--ndevices", 2, "--max-memory", 5, "--cache-path", cache, "--bench-iters", 2, "--warmup-iters", 1, "--comm-iters", 3,
            "--quiet", *extra]


def test_eval_shardkit_calibrates_itself_on_an_empty_cache(fresh):
    d = fresh
    cache = d / "cache.sqlite"
    assert not cache.exists()
    proc = run(*eval_cmd(d, cache, "--out", d / "r.jsonl"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "shardkit calibrated on this machine" in proc.stdout and "tables outside the evaluated tasks" in proc.stdout
    records = [line for line in (d / "r.jsonl").read_text().splitlines()]
    assert len(records) == 4 and sum('"alg": "shardkit"' in r and '"cost_ms"' in r for r in records) == 2

    # what calibration measured never holds a table of the evaluated tasks (only their own plans do)
    test_tables = {i for t in load_tasks(d / "T" / "test.txt") for i in t.table_ids}
    with CostCache(cache) as c:
        shards = [{int(i) for i, _r, _d in e.tables} for e in c.shard_entries()]
    clean = [s for s in shards if not s & test_tables]
    assert len(clean) >= 24
    assert all(s <= test_tables for s in shards if s & test_tables)   # the evaluated plans' own devices

    # the next run finds its model in the cache: nothing measured for calibration again (the evaluated
    # plans may differ, so shards of the test tables may be added; of the other tables none)
    proc = run(*eval_cmd(d, cache))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "shardkit calibrated" not in proc.stdout
    with CostCache(cache) as c:
        again = [{int(i) for i, _r, _d in e.tables} for e in c.shard_entries()]
    assert [s for s in again if not s & test_tables] == clean


def test_without_measuring_it_names_the_one_command(fresh):
    d = fresh
    for extra in (("--shardkit-calibrate", 0), ("--plan-only",)):
        proc = run(*eval_cmd(d, d / f"empty{len(extra)}.sqlite", *extra))
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), proc.stderr[-2000:]
        assert "python eval.py --alg shardkit" in lines[0] and "--shardkit-calibrate" in lines[0], lines[0]
