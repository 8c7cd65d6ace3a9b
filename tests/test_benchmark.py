"""The shard micro-benchmark on the CPU (fbgemm-gpu-cpu), on tiny data built here."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from shardcore.oracles.measured import benchmark
from shardcore.oracles.measured.benchmark import (BufferPool, ShardRunner, benchmark_shard, check_fits, shard_lookups,
                                 shard_memory_bytes)
from shardcore.dataset import load_dataset, save_dataset
from shardcore.errors import ShardError
from shardcore.tables import TableConfig

B = 1024


def make_data(path, seed=0):
    """Tables 0 and 1: same rows/dim, table 1 with 10x the lookups; 2: pooling factor 0;
    3..5: assorted."""
    rng = np.random.default_rng(seed)
    specs = [(5000, 32, 4), (5000, 32, 40), (100, 16, 0), (20000, 8, 3), (50, 64, 1), (3000, 16, 6)]
    tables, indices, offsets = [], [], []
    for i, (row, dim, pf) in enumerate(specs):
        lengths = np.full(B, pf) if pf else np.zeros(B, dtype=np.int64)
        off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        idx = rng.integers(0, row, size=int(off[-1]))
        tables.append(TableConfig(i, row, dim, float(pf)))
        indices.append(torch.from_numpy(idx))
        offsets.append(torch.from_numpy(off))
    save_dataset(path, tables, indices, offsets, B)
    return load_dataset(path)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return make_data(tmp_path_factory.mktemp("bench_ds"))


def test_costs_positive_and_finite(ds):
    cost = benchmark_shard(ds, ds.tables[:4], warmup_iters=1, bench_iters=3)
    assert cost.fw_ms > 0 and cost.bw_ms > 0
    assert math.isfinite(cost.fw_ms) and math.isfinite(cost.bw_ms)
    assert cost.total_ms == pytest.approx(cost.fw_ms + cost.bw_ms)


def test_more_lookups_cost_more(ds):
    light = [ds.tables[0]] * 1  # 4 lookups per sample
    heavy = [ds.tables[1]]      # same rows and dim, 40 lookups per sample
    c_light = benchmark_shard(ds, light, warmup_iters=2, bench_iters=9)
    c_heavy = benchmark_shard(ds, heavy, warmup_iters=2, bench_iters=9)
    assert c_heavy.total_ms > c_light.total_ms
    assert c_heavy.bw_ms > c_light.bw_ms


def test_empty_shard_costs_zero(ds):
    cost = benchmark_shard(ds, [])
    assert (cost.fw_ms, cost.bw_ms) == (0.0, 0.0)


def test_zero_pooling_factor_is_legal(ds):
    only_empty = benchmark_shard(ds, [ds.tables[2]], warmup_iters=1, bench_iters=2)
    mixed = benchmark_shard(ds, [ds.tables[2], ds.tables[3]], warmup_iters=1, bench_iters=2)
    for c in (only_empty, mixed):
        assert c.fw_ms >= 0 and c.bw_ms >= 0 and math.isfinite(c.total_ms)


@pytest.mark.parametrize("optimizer", ["exact_sgd", "exact_adagrad", "exact_row_wise_adagrad"])
@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_optimizers_and_precisions(ds, optimizer, precision):
    cost = benchmark_shard(ds, ds.tables[3:6], optimizer=optimizer, precision=precision,
                           warmup_iters=1, bench_iters=1)
    assert cost.fw_ms > 0 and cost.bw_ms > 0


def test_unknown_optimizer_and_precision(ds):
    with pytest.raises(ShardError, match="unknown optimizer"):
        benchmark_shard(ds, ds.tables[:1], optimizer="adam-ish")
    with pytest.raises(ShardError, match="precision"):
        benchmark_shard(ds, ds.tables[:1], precision="int3")


def test_lookups_concatenated(ds):
    tabs = [ds.tables[0], ds.tables[2], ds.tables[3]]
    indices, offsets = shard_lookups(ds, tabs, batch_size=100)
    assert offsets.dtype == torch.int64 and indices.dtype == torch.int64
    assert offsets.numel() == len(tabs) * 100 + 1
    assert int(offsets[0]) == 0 and int(offsets[-1]) == indices.numel()
    assert indices.numel() == 100 * 4 + 0 + 100 * 3
    # table 3's bags come last and hold its first 100 samples' lookups
    idx3, off3 = ds.lookups(3)
    assert torch.equal(indices[400:], idx3[: int(off3[100])])


def test_other_dims_and_fewer_rows(ds):
    """A column split changes the dim; fewer rows fold the indices into range."""
    t = ds.tables[3]
    narrow = t.with_dim(4)
    fewer = TableConfig(t.index, 64, t.dim, t.pooling_factor)
    indices, _ = shard_lookups(ds, [fewer])
    assert int(indices.max()) < 64
    runner = ShardRunner(ds, [narrow, fewer], batch_size=64)
    out = runner.forward()
    assert out.shape == (64, 4 + t.dim) and out.dtype == torch.float32
    runner.backward(out)
    runner.close()


def test_batch_size_checked(ds):
    with pytest.raises(ShardError, match="batch size"):
        benchmark_shard(ds, ds.tables[:1], batch_size=B + 1)
    with pytest.raises(ShardError, match="out of range"):
        benchmark_shard(ds, [TableConfig(99, 10, 4, 1.0)])


def test_oversize_shard_refused_before_allocation(ds, monkeypatch):
    def no_build(*a, **k):  # pragma: no cover - must not be reached
        raise AssertionError("operator built for a shard that does not fit")

    monkeypatch.setattr(benchmark, "build_operator", no_build)
    huge = [TableConfig(0, 10 ** 12, 128, 4.0)]  # 256 TB of fp16 weights
    with pytest.raises(ShardError, match="refused before allocation"):
        benchmark_shard(ds, huge)
    # a shard over an explicit budget is refused too, with the figures in the message
    tabs = ds.tables[:2]
    need = shard_memory_bytes(tabs, "fp16")
    assert need == 2 * 5000 * 32 * 2
    with pytest.raises(ShardError, match="needs"):
        ShardRunner(ds, tabs, usable_bytes=need - 1)
    check_fits(tabs, usable=need)  # exactly enough is fine


def test_memory_counts_optimizer_state():
    t = TableConfig(0, 1000, 16, 1.0)
    assert shard_memory_bytes([t], "fp16", "exact_sgd") == 1000 * 16 * 2
    assert shard_memory_bytes([t], "fp32", "exact_sgd") == 1000 * 16 * 4
    assert shard_memory_bytes([t], "fp16", "exact_adagrad") == 1000 * 16 * 2 + 1000 * 16 * 4
    assert shard_memory_bytes([t], "fp16", "exact_row_wise_adagrad") == 1000 * 16 * 2 + 1000 * 4


def test_buffer_pool_reuses_memory(ds):
    pool = BufferPool(cap_bytes=1 << 24)
    a = pool.take("weights", 1000, torch.float16)
    b = pool.take("weights", 500, torch.float16)
    assert a.data_ptr() == b.data_ptr() and b.numel() == 500 and b.is_contiguous()
    big = pool.take("weights", 1 << 24, torch.float32)  # over the cap: a fresh buffer
    assert big.numel() == 1 << 24
    c1 = benchmark.ShardRunner(ds, ds.tables[3:5], pool=pool, batch_size=64).measure(1, 1)
    c2 = benchmark.ShardRunner(ds, ds.tables[3:6], pool=pool, batch_size=64).measure(1, 1)
    assert c1.total_ms > 0 and c2.total_ms > 0


def test_restores_thread_count(ds):
    before = torch.get_num_threads()
    benchmark_shard(ds, ds.tables[3:4], warmup_iters=0, bench_iters=1, num_threads=1)
    assert torch.get_num_threads() == before


def test_host_measurement_lock_excludes_others(tmp_path):
    from shardcore.oracles.measured.benchmark import host_measurement_lock

    path = str(tmp_path / "lock")
    with host_measurement_lock(path=path):
        with pytest.raises(ShardError, match="measurement lock"):
            with host_measurement_lock(timeout_s=0.2, path=path):
                pass
    with host_measurement_lock(timeout_s=0.2, path=path):  # free again
        pass
