"""The persistent measurement cache (SQLite)."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import time

import numpy as np
import pytest
import torch

from shardcore.types import CacheContext, DeviceCost
from shardcore.oracles.cache import CostCache, open_cache, shard_key
from shardcore.oracles.setting import dataset_digest, hardware_fingerprint
from shardcore.dataset import save_dataset
from shardcore.errors import ShardError
from shardcore.tables import TableConfig

CTX = CacheContext(hardware=hardware_fingerprint(), dataset="abc123", batch_size=512,
                   optimizer="exact_sgd", precision="fp16")
T = [TableConfig(i, 100 * (i + 1), 8 * (1 + i % 3), 2.0) for i in range(6)]


def test_shard_roundtrip_and_order_insensitive(tmp_path):
    cache = CostCache(tmp_path / "c.sqlite")
    assert cache.get_shard(CTX, T[:3]) is None
    cache.put_shard(CTX, T[:3], 1.25, 3.5, bench_iters=7, warmup_iters=2)
    assert cache.get_shard(CTX, T[:3]) == (1.25, 3.5)
    assert cache.get_shard(CTX, [T[2], T[0], T[1]]) == (1.25, 3.5)   # order of tables irrelevant
    assert cache.get_shard(CTX, [T[0], T[1], T[2].with_dim(4)]) is None  # another dim: another shard
    assert cache.get_shard(CTX, T[:2]) is None


def test_a_plan_of_an_older_cost_convention_is_neither_answered_nor_listed(tmp_path):
    """Plans measured before every table's ids were exchanged (stored under the old key) must not
    stand for today's: get_plan misses them and plan_entries skips them; shards stay valid."""
    import json

    from shardcore.oracles import cache as cache_mod

    cache = CostCache(tmp_path / "c.sqlite")
    shards = [T[:2], T[2:]]
    cache.put_shard(CTX, T[:2], 1.0, 2.0)
    cache.put_plan(CTX, shards, [[1, 2, 3, 4], [5, 6, 7, 8]])
    assert cache_mod.PLAN_CONVENTION == "exchange-2"
    # the row as the previous code keyed it (kind "plan")
    old_key = cache_mod._digest("plan", CTX, [shard_key(s) for s in shards])
    with sqlite3.connect(tmp_path / "c.sqlite") as conn:
        conn.execute("UPDATE plan_costs SET key = ?", (old_key,))
    assert cache.counts() == {"shards": 1, "plans": 1}
    assert cache.get_plan(CTX, shards) is None and cache.plan_entries(CTX) == []
    assert cache.get_shard(CTX, T[:2]) == (1.0, 2.0)
    cache.put_plan(CTX, shards, [[1, 1, 1, 1], [1, 1, 1, 1]])      # measured afresh: listed again
    assert cache.get_plan(CTX, shards) == [DeviceCost(1.0, 1.0, 1.0, 1.0)] * 2
    assert [json.loads(json.dumps(e.device_costs_ms)) for e in cache.plan_entries(CTX)] == [[[1.0] * 4] * 2]
    assert len(cache.plan_entries(CTX, limit=1)) == 1


@pytest.mark.parametrize("field,value", [("hardware", "other-gpu"), ("dataset", "ffff"), ("batch_size", 1024),
                                         ("optimizer", "exact_adagrad"), ("precision", "fp32")])
def test_setting_is_part_of_the_key(tmp_path, field, value):
    cache = CostCache(tmp_path / "c.sqlite")
    cache.put_shard(CTX, T[:2], 1.0, 2.0)
    cache.put_plan(CTX, [T[:2], T[2:]], [[1, 2, 3, 4], [5, 6, 7, 8]])
    other = CacheContext(**{**CTX.__dict__, field: value})
    assert cache.get_shard(other, T[:2]) is None
    assert cache.get_plan(other, [T[:2], T[2:]]) is None


def test_plan_roundtrip_and_device_order_matters(tmp_path):
    cache = CostCache(tmp_path / "c.sqlite")
    shards = [T[:2], [], T[2:]]
    costs = [[1.0, 2.0, 3.0, 4.0], [0.0, 0.5, 0.5, 0.0], [2.0, 2.0, 2.0, 2.0]]
    cache.put_plan(CTX, shards, costs)
    assert [list(c) for c in cache.get_plan(CTX, shards)] == costs
    assert [list(c) for c in cache.get_plan(CTX, [[T[1], T[0]], [], T[2:]])] == costs   # order within a shard: same plan
    assert cache.get_plan(CTX, [T[2:], [], T[:2]]) is None             # devices swapped: another plan
    entries = cache.plan_entries(CTX)
    assert len(entries) == 1
    e = entries[0]
    assert e.cost_ms == pytest.approx(10.0) and e.ndevices == 3
    assert e.shards[1] == () and e.shards[0] == shard_key(T[:2])
    assert [list(c) for c in e.device_costs_ms] == costs


def test_entries_listing_and_filters(tmp_path):
    cache = CostCache(tmp_path / "c.sqlite")
    for k in range(1, 5):
        cache.put_shard(CTX, T[:k], float(k), 2.0 * k)
    other = CacheContext(**{**CTX.__dict__, "batch_size": 64})
    cache.put_shard(other, T[:1], 9.0, 9.0)
    assert cache.counts() == {"shards": 5, "plans": 0}
    entries = cache.shard_entries(CTX)
    assert [len(e.tables) for e in entries] == [1, 2, 3, 4]
    assert entries[2].tables == shard_key(T[:3]) and entries[2].total_ms == pytest.approx(9.0)
    assert len(cache.shard_entries()) == 5
    assert len(cache.shard_entries(batch_size=64)) == 1
    assert cache.shard_entries(batch_size=64)[0].fw_ms == 9.0


def test_replace_keeps_one_entry(tmp_path):
    cache = CostCache(tmp_path / "c.sqlite")
    cache.put_shard(CTX, T[:2], 1.0, 2.0)
    cache.put_shard(CTX, T[:2], 1.5, 2.5)
    assert cache.get_shard(CTX, T[:2]) == (1.5, 2.5)
    assert cache.counts()["shards"] == 1


def test_hit_is_fast(tmp_path):
    cache = CostCache(tmp_path / "c.sqlite")
    shards = [T[:3], T[3:]]
    cache.put_plan(CTX, shards, [[1, 2, 3, 4], [1, 2, 3, 4]])
    cache.get_plan(CTX, shards)
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        assert cache.get_plan(CTX, shards) is not None
        times.append(time.perf_counter() - t0)
    assert sorted(times)[10] < 0.010


def _writer(path, start, n):
    cache = CostCache(path)
    for k in range(start, start + n):
        cache.put_shard(CTX, [TableConfig(k, 10, 4, 1.0)], float(k), float(k))


def test_several_writer_processes(tmp_path):
    path = tmp_path / "c.sqlite"
    CostCache(path).counts()  # create it
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(path), 100 * w, 40)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    cache = CostCache(path)
    assert cache.counts()["shards"] == 120
    assert cache.get_shard(CTX, [TableConfig(205, 10, 4, 1.0)]) == (205.0, 205.0)
    mode = sqlite3.connect(str(path)).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode.lower() == "wal"


def test_dataset_digest_tracks_content(tmp_path):
    def write(path, seed):
        rng = np.random.default_rng(seed)
        idx = [torch.from_numpy(rng.integers(0, 50, 40))]
        off = [torch.arange(0, 41, 4)]
        save_dataset(path, [TableConfig(0, 50, 8, 4.0)], idx, off, 10)

    write(tmp_path / "a", 0)
    write(tmp_path / "b", 0)
    write(tmp_path / "c", 1)
    da, db, dc = (dataset_digest(tmp_path / x) for x in "abc")
    assert da == db and da != dc
    with pytest.raises(ShardError, match="cannot read dataset"):
        dataset_digest(tmp_path / "missing")


def test_open_cache_and_corrupt_file(tmp_path):
    assert open_cache(None) is None and open_cache(False) is None
    c = CostCache(tmp_path / "x.sqlite")
    assert open_cache(c) is c
    assert isinstance(open_cache(tmp_path / "y.sqlite"), CostCache)
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(ShardError, match="cost cache"):
        CostCache(bad).counts()
