"""The measurement cache: corrupt rows and negative costs never served, a locked or unusable cache named in one
line (and found before any worker starts), never advice to delete it."""

from __future__ import annotations

import os
import sqlite3

import pytest

from shardcore.errors import ShardError
from shardcore.oracles.cache import CostCache
from shardcore.types import CacheContext

from helpers import small_base


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


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return small_base(tmp_path_factory, "caches")


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
