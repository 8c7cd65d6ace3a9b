"""NeuroShard search: memory and dim caps, column splits, beam search vs table-wise start, the sharder."""

import json

import numpy as np
import pytest
import torch

from neuroshard.config import SearchConfig
from neuroshard.checkpoints import save_bundle, save_model
from neuroshard.search import TaskSearch, search
from neuroshard.sharder import NeuroShardSharder, load_sharder
from helpers import build_planner, planning_ctx
from shardcore.errors import InfeasibleError, ShardError
from shardcore.evaluation.compare import plan_task
from shardcore.types import Topology
from shardcore.plan import Plan
from shardcore.tables import TableConfig
from shardcore.interop.plan_export import plan_json, torchrec_plan_json

from test_neuroshard_helpers import synthetic_tables, train_simulator

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def sim():
    return train_simulator(compute_samples=250, comm_samples=100, epochs=25)


def task(n, seed, dims=(4, 8, 16, 32, 64, 128)):
    rng = np.random.default_rng(seed)
    base = synthetic_tables(120, seed=seed)
    ids = rng.choice(len(base), size=n, replace=False)
    return [base[int(i)].with_dim(int(rng.choice(dims))) for i in ids]


def test_grid_search_respects_memory_and_dim_caps(sim):
    tables = task(40, 1)
    mem = sum(t.memory_gb() for t in tables)
    cap = max(max(t.memory_gb() for t in tables), mem / 4 * 1.25)   # binds: some placements are refused
    ts = TaskSearch(sim, tables, Topology(4, cap))
    owner, emb, single, m, dim = ts.expanded([1] * len(tables))
    order = np.argsort(-single, kind="stable")
    caps = ts.scales * dim.sum() / 4
    alloc, alive, comp, dsum = ts._greedy(order, emb, m, dim, caps)
    assert alive.any()
    for g in np.flatnonzero(alive):
        assert (alloc[g] >= 0).all()
        used = np.bincount(alloc[g], weights=m, minlength=4)
        sums = np.bincount(alloc[g], weights=dim, minlength=4)
        assert used.max() <= cap + 1e-12 and np.allclose(sums, dsum[g])
        assert sums.max() <= caps[g] + 1e-9
    # the scale 1.0 cap is usually too tight to place everything; the last (no cap) always fits here
    assert alive[-1] and np.isinf(caps[-1])
    best = ts.table_wise()
    plan = Plan.table_wise(tables, best.allocation, Topology(4, cap))
    assert plan.feasible
    assert best.cost == pytest.approx(sim.plan_cost(plan))
    if np.isfinite(best.scale):
        sums = np.bincount(best.allocation, weights=dim, minlength=4)
        assert sums.max() <= best.scale * dim.sum() / 4 + 1e-9


def test_memory_cap_is_never_exceeded_and_infeasible_is_reported(sim):
    for seed in range(4):
        tables = task(30, 10 + seed)
        cap = max(max(t.memory_gb() for t in tables), sum(t.memory_gb() for t in tables) / 4 * 1.02)
        plan = NeuroShardSharder("neuroshard", sim, SearchConfig(max_length=3)).shard(tables, Topology(4, cap))
        assert plan.feasible
    big = [TableConfig(0, 10_000_000, 4, 1.0), TableConfig(1, 100, 4, 1.0)]   # dim 4 cannot be split
    with pytest.raises(InfeasibleError, match="infeasible"):
        NeuroShardSharder("neuroshard", sim).shard(big, Topology(2, big[0].memory_gb() / 2))


def test_column_split_halves_memory_and_keeps_lookups(sim):
    tables = task(12, 3, dims=(16, 32))
    huge = TableConfig(999, 5_000_000, 64, 25.0, tuple([1 / 17] * 17))
    tables.append(huge)
    cap = huge.memory_gb() * 0.6   # the whole table fits no device: only a column split can place it
    assert max(t.memory_gb() for t in tables[:-1]) < cap
    with pytest.raises(InfeasibleError):
        NeuroShardSharder("t", sim, SearchConfig(column_wise=False)).shard(tables, Topology(4, cap))
    sharder = NeuroShardSharder("neuroshard", sim, SearchConfig(k=2, n=4, max_length=4))
    plan = sharder.shard(tables, Topology(4, cap))
    assert plan.splits is not None and plan.splits[-1] >= 2
    assert plan.feasible
    k = plan.splits[-1]
    expanded = [p for _, p in plan.pieces]
    pieces = [t for t in expanded if t.index == 999]
    assert len(pieces) == k and all(t.dim == 64 // k and t.dim % 4 == 0 for t in pieces)
    assert all((t.row, t.pooling_factor, t.bins) == (huge.row, huge.pooling_factor, huge.bins) for t in pieces)
    assert sum(t.memory_gb() for t in pieces) == pytest.approx(huge.memory_gb())
    assert pieces[0].memory_gb() == pytest.approx(huge.memory_gb() / k)
    # the plan evaluates (plan-only) through the core like any other
    result, ok = plan_task(0, "neuroshard", sharder, tables, Topology(4, cap, "fp16"))
    assert ok is not None and result.feasible and result.splits == list(plan.splits)
    # exports: the split table is column-wise on the ranks of its shards
    plain = plan_json(plan)
    row = plain["tables"][-1]
    assert row["device"] is None and [c["dim"] for c in row["column_shards"]] == [64 // k] * k
    trec = torchrec_plan_json(plan)["tables"][-1]
    ranks = [plan.allocation[len(expanded) - k + j] for j in range(k)]
    assert trec["sharding_type"] == "column_wise" and trec["ranks"] == ranks
    assert [s["offsets"] for s in trec["shards"]] == [[0, j * 64 // k] for j in range(k)]
    assert torchrec_plan_json(Plan.table_wise(tables[:1], (2,), Topology(4, cap)))["tables"][0]["sharding_type"] == "table_wise"
    json.dumps(plain)


def test_beam_search_never_worse_than_table_wise_start(sim):
    for seed in range(5):
        tables = task(25, 20 + seed)
        cap = sum(t.memory_gb() for t in tables)
        res = search(sim, tables, Topology(4, cap), cfg=SearchConfig(k=2, n=5, max_length=4))
        assert res.cost <= res.table_wise_cost + 1e-9
        assert res.cost == pytest.approx(sim.plan_cost(res.plan))
        assert all(k in (1, 2, 4, 8, 16) for k in res.splits)
        assert all((t.dim // k) % 4 == 0 for t, k in zip(tables, res.splits))
        assert res.history == sorted(res.history, reverse=True)   # best-so-far only improves
    only_table_wise = search(sim, tables, Topology(4, cap), cfg=SearchConfig(column_wise=False))
    assert only_table_wise.plan.splits is None and only_table_wise.steps == 0


def test_load_sharder_paths_bundle_and_resolve(tmp_path, sim):
    for kind, model in (("compute", sim.compute), ("fw_comm", sim.fw_comm), ("bw_comm", sim.bw_comm)):
        save_model(model, tmp_path / f"{kind}.pt")
    kw = dict(compute_model=str(tmp_path / "compute.pt"), fw_comm_model=str(tmp_path / "fw_comm.pt"),
              bw_comm_model=str(tmp_path / "bw_comm.pt"))
    tables = task(15, 5)
    s1 = build_planner("neuroshard", planning_ctx(3, 10.0), **kw)
    p1 = s1.shard(tables, Topology(3, 10.0))
    # a single model's checkpoint: the others are found beside it; the search settings pass through
    s2 = build_planner(str(tmp_path / "compute.pt"), planning_ctx(3, 10.0), search={"max_length": 0})
    assert s2.search.max_length == 0 and s2.shard(tables, Topology(3, 10.0)).splits is None
    save_bundle(tmp_path / "neuroshard.pt", sim.compute, sim.fw_comm, sim.bw_comm, {"k": 2})
    s3 = load_sharder(str(tmp_path / "neuroshard.pt"))
    assert s3.search.k == 2
    assert s3.shard(tables, Topology(3, 10.0)) == p1
    with pytest.raises(ShardError, match="not found"):
        load_sharder(None, compute_model=str(tmp_path / "nope.pt"))
    with pytest.raises(ShardError, match="k, n"):
        build_planner("neuroshard", planning_ctx(3, 10.0), search={"k": 0}, **kw)
