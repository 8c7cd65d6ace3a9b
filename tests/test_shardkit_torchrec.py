"""shardkit inside TorchRec (shardkit_torchrec): ShardkitPlanner applied by DistributedModelParallel on 4
gloo CPU ranks, EmulatedPerfEstimator inside TorchRec's own planner, the table statistics, and what
TorchRec cannot express. Skipped without TorchRec, as tests/test_torchrec.py."""

import math
import os

import numpy as np
import pytest

from helpers import require_torchrec  # noqa: E402

require_torchrec()

import torch  # noqa: E402
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor  # noqa: E402
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: E402
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints  # noqa: E402
from torchrec.distributed.planner.constants import POOLING_FACTOR  # noqa: E402
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator  # noqa: E402
from torchrec.distributed.planner.shard_estimators import EmbeddingStorageEstimator  # noqa: E402
from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig  # noqa: E402

from shardcore.cli import algorithms  # noqa: E402
from shardcore.oracles.commmodel import CommModel  # noqa: E402
from shardcore.data.dlrm import reuse_bins, reuse_counts  # noqa: E402
from shardcore.oracles.emulated.emulator import load_gpu_model  # noqa: E402
from shardcore.errors import ShardError  # noqa: E402
from shardcore.plan import column_wise, data_parallel, row_wise, table_wise  # noqa: E402
from shardcore.tables import TableConfig  # noqa: E402
from shardcore.types import Topology  # noqa: E402
from shardkit_planner.costmodel import emulated_model  # noqa: E402
from shardkit_torchrec import stats as st  # noqa: E402
from shardkit_torchrec.estimator import EmulatedPerfEstimator  # noqa: E402
from shardkit_torchrec.planner import (INEXPRESSIBLE_MS, ShardkitPlanner, TorchRecCostModel,  # noqa: E402
                                       expressible_problem)
from shardkit_torchrec.sharder import EmulatedTorchRecSharder  # noqa: E402
from helpers import planning_ctx


def topology(world=4, compute="cuda", cap=2 << 30, local=None):
    caps = {"hbm_cap_bytes": cap} if compute == "cuda" else {"ddr_cap_bytes": cap}
    return TopologyFactory.create_topology(TrainerConfig(world_size=world, local_world_size=local or world, **caps),
                                           kernel_config=KernelConfig(compute_device=compute))


def ebc(spec, device="meta"):
    return EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=f"t{i}", embedding_dim=d, num_embeddings=r,
                                                             feature_names=[f"f{i}"]) for i, (r, d) in enumerate(spec)],
                                  device=torch.device(device))


# -------------------------------------------------------------------------------------------------
# The done-when test: 13 tables, ShardkitPlanner, DMP on 4 gloo CPU ranks, forward and backward
# -------------------------------------------------------------------------------------------------

def test_example_plans_applies_and_trains_on_four_gloo_ranks():
    import examples.torchrec_shardkit as ex

    assert len(ex.TABLES) >= 12 and len({d for _r, d, _pf in ex.TABLES}) >= 5
    results = ex.run(world=4, local_batch=32)
    assert sorted(results) == [0, 1, 2, 3]
    for rank, res in results.items():
        assert "error" not in res, f"rank {rank}:\n{res.get('error')}"
    plans = {res["plan"] for res in results.values()}
    assert len(plans) == 1                                  # every rank got rank 0's plan
    types = results[0]["types"]
    assert sorted(types) == sorted(f"t{i}" for i in range(len(ex.TABLES)))
    assert types["t0"] == "row_wise"                        # the large hot table, spread over the ranks
    assert len(set(types.values())) >= 2, types
    assert "param | sharding type | compute kernel" in results[0]["plan"]   # TorchRec's own table format
    for res in results.values():
        assert res["max_err"] < 1e-4                        # sharded forward == the unsharded model's
        assert math.isfinite(res["loss"]) and res["dense_grads"] > 0 and res["grads_finite"]


# -------------------------------------------------------------------------------------------------
# ShardkitPlanner without processes
# -------------------------------------------------------------------------------------------------

SPEC = [(200_000, 64), (5_000, 16), (20_000, 32), (1_000, 8), (50_000, 64), (3_000, 128), (8_000, 32), (12_000, 16)]
PFS = [150.0, 2.0, 4.0, 1.0, 6.0, 3.0, 1.5, 8.0]


def test_planner_plan_is_shardkits_plan_in_torchrecs_form():
    cons = {f"t{i}": ParameterConstraints(pooling_factors=[pf]) for i, pf in enumerate(PFS)}
    # a budget the cold first plan (the emulator's held-out fits, ~6 s on 2 cores) cannot exhaust; the search
    # stops on its own once it converges
    planner = ShardkitPlanner(topology(), batch_size=16384, constraints=cons, time_budget_s=20.0)
    sp = planner.plan(ebc(SPEC), [EmbeddingBagCollectionSharder()])
    module_plan = sp.plan[""]
    ours = list(planner.last_plan.shardings)
    assert planner.global_batch == 65536 and planner.last_stats[0].table.pooling_factor == 150.0
    assert math.isclose(planner.cap_gb(), 2 * 0.85)
    for i, s in enumerate(ours):
        ps = module_plan[f"t{i}"]
        assert expressible_problem(s, 4) is None
        if s.type == "data_parallel":
            assert ps.sharding_type == "data_parallel" and ps.compute_kernel == "dense" and ps.sharding_spec is None
            continue
        assert ps.compute_kernel == "fused" and ps.sharding_type == s.type
        shards = [(sm.shard_offsets, sm.shard_sizes, str(sm.placement)) for sm in ps.sharding_spec.shards]
        if s.type == "column_wise":   # uneven blocks allowed: in column order on their ranks
            offs = [sum(s.dims[:j]) for j in range(len(s.dims))]
            assert shards == [([0, o], [SPEC[i][0], w], f"rank:{d}/cuda:{d}") for o, w, d in zip(offs, s.dims, s.devices)]
        elif s.type == "row_wise":    # block j on rank j
            assert [sh[2] for sh in shards] == [f"rank:{r}/cuda:{r}" for r in range(4)]
    assert ours[0].type == "row_wise"   # the hot table


def test_planner_refuses_what_it_cannot_plan():
    with pytest.raises(ShardError, match="one host"):
        ShardkitPlanner(topology(world=4, local=2))
    with pytest.raises(ShardError, match="no default cost model"):
        ShardkitPlanner(topology(compute="cpu"))
    two = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name="a", embedding_dim=8, num_embeddings=10,
                                                            feature_names=["x", "y"])], device=torch.device("meta"))
    with pytest.raises(ShardError, match="serves 2 features"):
        ShardkitPlanner(topology()).plan(two, [EmbeddingBagCollectionSharder()])
    with pytest.raises(ShardError, match="does not offer row_wise on cpu"):
        ShardkitPlanner(topology(compute="cpu"), oracle="emulated:h200").plan(ebc(SPEC), [EmbeddingBagCollectionSharder()])


def test_what_torchrec_cannot_express_is_refused_and_kept_out_of_the_search():
    assert expressible_problem(row_wise([0, 1, 2, 3]), 4) is None
    for s in (table_wise(2), column_wise([(1, 12), (1, 20)]), data_parallel(4)):
        assert expressible_problem(s, 4) is None
    assert "row-wise over ranks [2, 3]" in expressible_problem(row_wise([2, 3]), 4)
    assert "row-wise over ranks [3, 1, 0, 2]" in expressible_problem(row_wise([3, 1, 0, 2]), 4)
    t = TableConfig(0, 1000, 32, 10.0)
    base = emulated_model(os.devnull, 65536, CommModel())
    model = TorchRecCostModel.wrap(base, 4)
    full = [[p] for _d, p in row_wise([0, 1, 2, 3]).pieces(t, 4)]
    sub = [[p] for _d, p in row_wise([2, 3]).pieces(t, 4)]
    assert np.allclose(model.shard_compute(full), base.shard_compute(full))
    assert np.all(model.shard_compute(sub) >= INEXPRESSIBLE_MS)


# -------------------------------------------------------------------------------------------------
# Table statistics
# -------------------------------------------------------------------------------------------------

def test_stats_from_samples_then_constraints_then_torchrecs_default():
    module = ebc([(100, 8), (50, 16), (30, 4)])
    lengths = torch.tensor([3, 1, 2, 0, 1, 1, 1, 1])     # f0: 3, 1, 2, 0; f1: 1, 1, 1, 1
    values = torch.tensor([5, 5, 7, 5, 9, 9, 1, 2, 3, 3])
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["f0", "f1"], values=values, lengths=lengths)
    cons = {"t1": ParameterConstraints(pooling_factors=[9.0]), "t2": ParameterConstraints()}
    out = st.table_stats(module, cons, [kjt, kjt])
    f0 = np.array([3, 1, 2, 0, 3, 1, 2, 0])
    assert out[0].source == "samples" and out[0].table.pooling_factor == 1.5
    assert math.isclose(out[0].length_cv, f0.std() / f0.mean())
    ids0 = np.array([5, 5, 7, 5, 9, 9] * 2)
    assert out[0].table.bins == reuse_bins(reuse_counts(ids0, 100)[0])
    assert out[1].source == "samples" and out[1].table.pooling_factor == 1.0 and out[1].length_cv == 0.0
    assert out[2].source == "constraints" and out[2].table.pooling_factor == POOLING_FACTOR   # the dataclass default
    assert st.table_stats(module)[1].source == "default" and st.DEFAULT_POOLING_FACTOR == POOLING_FACTOR
    # the reuse statistics stop at the global batch
    first = st.table_stats(module, None, [kjt, kjt], global_batch=4)[0]
    assert first.table.bins == reuse_bins(reuse_counts(np.array([5, 5, 7, 5, 9, 9]), 100)[0])
    bad = KeyedJaggedTensor.from_lengths_sync(keys=["f0"], values=torch.tensor([100]), lengths=torch.tensor([1]))
    with pytest.raises(ShardError, match="outside"):
        st.table_stats(module, None, [bad])


# -------------------------------------------------------------------------------------------------
# EmulatedPerfEstimator inside TorchRec's planner
# -------------------------------------------------------------------------------------------------

def test_estimator_prices_shards_with_the_emulator_and_the_exchange_model():
    spec = [(200_000, 64), (5_000, 16), (20_000, 32)]
    pfs = [40.0, 2.0, 4.0]
    topo = topology()
    cons = {f"t{i}": ParameterConstraints(pooling_factors=[pf]) for i, pf in enumerate(pfs)}
    comm = CommModel()
    est = EmulatedPerfEstimator(topo, cons, comm=comm)
    enum = EmbeddingEnumerator(topology=topo, batch_size=1024, constraints=cons,
                               estimator=[est, EmbeddingStorageEstimator(topology=topo, constraints=cons)])
    options = enum.enumerate(ebc(spec), [EmbeddingBagCollectionSharder()])
    gpu = load_gpu_model("h200")
    B = 1024 * 4
    seen = set()
    for o in options:
        i = int(o.name[1:])
        t = TableConfig(-1, spec[i][0], spec[i][1], pfs[i])
        seen.add(o.sharding_type)
        if o.compute_kernel not in ("fused", "dense"):   # the UVM kernels: test_estimator_prices_uvm_kernels_...
            continue
        if o.sharding_type == "table_wise":
            (fw, bw), = gpu.predict_many([[t]], B, length_cv=[[gpu.default_cv]], precision=est.precision)
            perf = o.shards[0].perf
            assert math.isclose(perf.fwd_compute, fw) and math.isclose(perf.bwd_compute, bw)
            # its comm is what it adds to the oracle's exchange on its rank (its ids and pooled outputs
            # forward, its pooled gradients backward), less the collectives' latencies
            widths = [spec[i][1], 0, 0, 0]
            efw, ebw = comm.exchange_ms(widths, B, [pfs[i] + 1.0, 0, 0, 0])
            assert math.isclose(perf.fwd_comms, efw[0] - 2 * comm.latency_us * 1e-3)
            assert math.isclose(perf.bwd_comms, ebw[0] - comm.latency_us * 1e-3)
        if o.sharding_type == "row_wise":   # the id all-to-all forward, the pooled outputs both ways
            p = o.shards[0].perf
            assert p.fwd_comms > p.bwd_comms > 0
        if o.sharding_type == "data_parallel":   # no pooled outputs, the gradient all-reduce backward
            p = o.shards[0].perf
            assert p.fwd_comms == 0 and p.bwd_comms > 0
    assert {"table_wise", "row_wise", "column_wise", "data_parallel"} <= seen
    planner = EmbeddingShardingPlanner(topology=topo, batch_size=1024, constraints=cons, enumerator=enum)
    sp = planner.plan(ebc(spec), [EmbeddingBagCollectionSharder()])
    assert sorted(sp.plan[""]) == ["t0", "t1", "t2"]


def test_alg_torchrec_emu_is_a_declared_plugin_and_plans():
    sharder = algorithms.build("torchrec-emu", planning_ctx(batch_size=65536))
    assert isinstance(sharder, EmulatedTorchRecSharder) and sharder.name == "torchrec-emu"
    tables = [TableConfig(i, r, d, pf) for i, ((r, d), pf) in enumerate(zip(SPEC, PFS))]
    plan = sharder.shard(tables, Topology(4, 0.5))
    assert plan.feasible
    assert len(sharder.last_info["torchrec_types"]) == len(tables)


def test_torchrec_emu_plans_the_same_whatever_the_string_hash_seed(tmp_path):
    """TorchRec enumerates a table's sharding types and kernels in the order of a set of their names, which
    follows PYTHONHASHSEED, and keeps the first of equally priced options; the emulator prices the fused
    and dense kernels alike. Without the estimator's tie-break a DLRM-50 task's plan (and its cost) followed
    the seed; with it every seed gives the same plan."""
    import json
    import subprocess
    import sys

    from shardkit_torchrec.estimator import KERNEL_ORDER, TYPE_ORDER, tie_break_ms

    assert KERNEL_ORDER[0] == "fused" and "dense" in KERNEL_ORDER and TYPE_ORDER[0] == "table_wise"

    class Option:
        def __init__(self, kind, kernel):
            self.sharding_type, self.compute_kernel = kind, kernel

    ranks = [tie_break_ms(Option(t, k)) for t in ("table_wise", "data_parallel") for k in ("fused", "dense", "odd")]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks) and 0 <= min(ranks) and max(ranks) < 1e-9   # ms
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    plans = []
    for seed in ("0", "7"):
        out = tmp_path / f"r{seed}.jsonl"
        env = dict(os.environ, PYTHONHASHSEED=seed)
        done = subprocess.run([sys.executable, os.path.join(root, "eval.py"), "--alg", "torchrec-emu", "--oracle",
                               "emulated:h200", "--data-dir", os.path.join(root, "data/gpu_measurements/dlrm_b65536"),
                               "--task-path", os.path.join(root, "data/gpu_measurements/tasks/dlrm_tasks_50_test.txt"),
                               "--ndevices", "4", "--max-memory", "5", "--max-tasks", "5", "--quiet", "--out", str(out)],
                              capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        recs = [json.loads(x) for x in out.read_text().splitlines()]
        plans.append([(r["task"], r["cost_ms"], json.dumps(r["shardings"], sort_keys=True)) for r in recs])
    assert plans[0] == plans[1]   # the same plans at the same costs, whatever the seed


# -------------------------------------------------------------------------------------------------
# Every kernel TorchRec may enumerate is priced or declined
# -------------------------------------------------------------------------------------------------

UVM_KERNELS = ["fused", "fused_uvm", "fused_uvm_caching"]


def _enumerated(spec, pfs, cons_extra=None, topo=None, batch=1024):
    from shardkit_torchrec.estimator import EmulatedPerfEstimator

    topo = topo or topology()
    cons = {f"t{i}": ParameterConstraints(pooling_factors=[pf], **(cons_extra or {}).get(f"t{i}", {}))
            for i, pf in enumerate(pfs)}
    est = EmulatedPerfEstimator(topo, cons)
    enum = EmbeddingEnumerator(topology=topo, batch_size=batch, constraints=cons,
                               estimator=[est, EmbeddingStorageEstimator(topology=topo, constraints=cons)])
    return est, cons, enum, enum.enumerate(ebc(spec), [EmbeddingBagCollectionSharder()])


def test_estimator_prices_uvm_kernels_over_the_host_link():
    """fused_uvm: the fused price plus the distinct rows' bytes over the host link (once forward, read and
    write backward); fused_uvm_caching: only the cache's misses, fetched forward and written back backward,
    the hit rate the load factor's where the table has no access statistics."""
    from torchrec.distributed.types import CacheParams

    from shardkit_torchrec.estimator import HostLink, distinct_rows

    spec, pfs = [(200_000, 64), (50_000, 32)], [2.0, 4.0]
    extra = {"t1": {"cache_params": CacheParams(load_factor=0.5)}}
    est, _cons, _enum, options = _enumerated(spec, pfs, extra)
    assert est.host_link == HostLink() and est.host_link.bytes_per_ms == 64e6 * 0.1
    by = {(o.name, o.sharding_type, o.compute_kernel): o for o in options}
    assert {k for _n, _t, k in by} == set(UVM_KERNELS) | {"dense"}
    B = 1024 * 4
    for i, (rows, dim) in enumerate(spec):
        fused = by[(f"t{i}", "table_wise", "fused")].shards[0].perf
        uvm = by[(f"t{i}", "table_wise", "fused_uvm")].shards[0].perf
        cache = by[(f"t{i}", "table_wise", "fused_uvm_caching")].shards[0].perf
        row_bytes = dim * 4                                   # TorchRec's default data_type: fp32
        link = distinct_rows(TableConfig(-1, rows, dim, pfs[i]), B) * row_bytes / est.host_link.bytes_per_ms
        assert distinct_rows(TableConfig(-1, rows, dim, pfs[i]), B) == min(rows, B * pfs[i])   # no reuse known
        assert math.isclose(uvm.fwd_compute, fused.fwd_compute + link, rel_tol=1e-9)
        assert math.isclose(uvm.bwd_compute, fused.bwd_compute + 2 * link, rel_tol=1e-9)
        clf = 0.5 if i == 1 else 0.2                          # the option's load factor, else TorchRec's default
        assert math.isclose(cache.fwd_compute, fused.fwd_compute + (1 - clf) * link, rel_tol=1e-9)
        assert math.isclose(cache.bwd_compute, fused.bwd_compute + (1 - clf) * link, rel_tol=1e-9)
        assert (uvm.fwd_comms, uvm.bwd_comms) == (fused.fwd_comms, fused.bwd_comms)
        price = est.prices[(f"t{i}", "table_wise", "fused_uvm_caching")]
        assert price.kind == "uvm_caching" and price.load_factor == clf and math.isclose(price.hit_rate, clf)
    # a host link the topology states replaces the H200's
    from torchrec.distributed.planner.types import HardwareConfig

    stated = TopologyFactory.create_topology(
        TrainerConfig(world_size=4, local_world_size=4, hbm_cap_bytes=2 << 30),
        hardware_config=HardwareConfig(hbm_to_ddr_mem_bw=20e6),
        kernel_config=KernelConfig(compute_device="cuda", use_hardware_based_bandwidth=True))
    assert HostLink.of(stated).bandwidth_gbps == 20.0


def test_cache_hit_rate_comes_from_access_statistics_where_given():
    from shardkit_torchrec.estimator import cache_hit_rate

    cold = TableConfig(0, 100_000, 64, 2.0)
    for clf in (0.1, 0.2, 0.5, 1.0):
        assert math.isclose(cache_hit_rate(cold, 5_000, clf), clf)        # uniform access: the load factor
    hot_bins = (0.1, 0.3, 0.3, 0.3) + (0.0,) * 13                         # 90% of a batch's rows looked up 2+ times
    hot = TableConfig(0, 100_000, 64, 2.0, hot_bins)
    rates = [cache_hit_rate(hot, 5_000, clf) for clf in (0.01, 0.05, 0.2, 1.0)]
    assert rates == sorted(rates) and rates[-1] == 1.0
    assert cache_hit_rate(hot, 5_000, 0.05) > 0.05 + 0.5                 # the hot rows fit the cache

    class Stats:   # TorchRec's CacheStatistics: an LRU miss rate and the distinct ids per batch
        expected_lookups = 4_000

        def expected_miss_rate(self, clf):
            return 0.25

    assert math.isclose(cache_hit_rate(cold, 5_000, 0.2, Stats(), share=0.5), 1 - 500 / 5_000)
    assert cache_hit_rate(cold, 100, 0.2, Stats()) == 0.0                # never more misses than distinct rows


def test_estimator_declines_kernels_it_does_not_price_so_no_plan_uses_them():
    """key_value (enumerated where a rank has SSD and a constraint names it) gets an infinite price, which
    TorchRec's planner never keeps; a table left with no priced kernel is a one-line error."""
    from shardkit_torchrec.estimator import PRICED_KERNELS

    topo = TopologyFactory.create_topology(
        TrainerConfig(world_size=4, local_world_size=4, hbm_cap_bytes=2 << 30, ssd_cap_bytes=64 << 30),
        kernel_config=KernelConfig(compute_device="cuda"))
    spec, pfs = [(200_000, 64), (5_000, 16)], [40.0, 2.0]
    extra = {"t0": {"compute_kernels": ["key_value", "fused"]}, "t1": {"compute_kernels": ["key_value", "fused"]}}
    est, cons, enum, options = _enumerated(spec, pfs, extra, topo)
    declined = [o for o in options if o.compute_kernel == "key_value"]
    assert declined and all(math.isinf(s.perf.total) for o in declined for s in o.shards)
    assert all(math.isfinite(s.perf.total) for o in options if o.compute_kernel in PRICED_KERNELS for s in o.shards)
    planner = EmbeddingShardingPlanner(topology=topo, batch_size=1024, constraints=cons, enumerator=enum)
    sp = planner.plan(ebc(spec), [EmbeddingBagCollectionSharder()])
    assert {ps.compute_kernel for ps in sp.plan[""].values()} <= set(PRICED_KERNELS)
    with pytest.raises(ShardError, match="table t1's options use only key_value") as exc:
        _enumerated(spec, pfs, {"t1": {"compute_kernels": ["key_value"]}}, topo)
    assert "\n" not in str(exc.value)


MLPERF = "/work/shared/models/mlperf_dlrm_criteo1tb.csv"


def _mlperf_plan(hbm_gib: int):
    """The documented snippet: TorchRec's EmbeddingShardingPlanner with EmulatedPerfEstimator on the MLPerf
    DLRM tables (26 tables, dim 128, up to 40M rows, fp32) on 8 ranks of ``hbm_gib`` GiB, batch 65536."""
    from torchrec.modules.embedding_configs import DataType

    from shardcore.data.user_tables import read_tables
    from shardkit_torchrec.estimator import EmulatedPerfEstimator

    tables, names = read_tables(MLPERF)
    model = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=n, embedding_dim=t.dim, num_embeddings=t.row,
                                                              feature_names=[n], data_type=DataType.FP32)
                                           for t, n in zip(tables, names)], device=torch.device("meta"))
    topo = TopologyFactory.create_topology(TrainerConfig(world_size=8, local_world_size=8, hbm_cap_bytes=hbm_gib << 30),
                                           kernel_config=KernelConfig(compute_device="cuda"))
    cons = {n: ParameterConstraints(pooling_factors=[t.pooling_factor]) for t, n in zip(tables, names)}
    est = EmulatedPerfEstimator(topo, cons)
    enum = EmbeddingEnumerator(topology=topo, batch_size=65536 // 8, constraints=cons,
                               estimator=[est, EmbeddingStorageEstimator(topo, cons)])
    planner = EmbeddingShardingPlanner(topology=topo, batch_size=65536 // 8, constraints=cons, enumerator=enum)
    return est, planner.plan(model, [EmbeddingBagCollectionSharder()]), tables, names


@pytest.mark.skipif(not os.path.exists(MLPERF), reason="the MLPerf DLRM tables file is not on this machine")
def test_mlperf_dlrm_through_torchrecs_planner_is_hbm_only_or_says_which_tables_use_uvm():
    """The case that gave 19 GiB of weights on ranks of 16 GiB (every large table on fused_uvm, priced like
    HBM): with 16 GiB ranks the plan holds every table in HBM and fits; with 8 GiB it cannot, and the
    tables it moves to host memory are on a UVM kernel priced by the host link and named as modelled."""
    from shardkit_torchrec.estimator import HBM_KERNELS, UVM_KERNELS

    for hbm, expect_uvm in ((16, False), (8, True)):
        est, sp, tables, names = _mlperf_plan(hbm)
        params = sp.plan[""]
        weights = [0.0] * 8
        uvm = []
        for n, t in zip(names, tables):
            ps = params[n]
            price = est.prices[(n, ps.sharding_type, ps.compute_kernel)]
            assert price.kind != "declined"                          # never a kernel it did not price
            assert (ps.compute_kernel in UVM_KERNELS) == price.kind.startswith("uvm")
            if ps.compute_kernel in UVM_KERNELS:
                uvm.append(n)
                assert price.link_fw_ms > 0 and price.link_bw_ms > 0
            elif ps.compute_kernel in HBM_KERNELS:
                for sm in ps.sharding_spec.shards:
                    weights[sm.placement.rank()] += sm.shard_sizes[0] * sm.shard_sizes[1] * 4
        assert bool(uvm) == expect_uvm, (hbm, uvm)
        assert max(weights) <= hbm * 2 ** 30                         # what is in HBM fits HBM
        text = est.describe(sp)
        if not uvm:
            assert "HBM only" in text and f"of {hbm} GiB" in text
        else:
            assert "UVM" in text and "modelled" in text and all(n in text for n in uvm)


def test_estimator_reads_one_precision_and_refuses_a_mix():
    from torchrec.modules.embedding_configs import DataType

    from shardkit_torchrec.estimator import EmulatedPerfEstimator, precision_note

    topo = topology()
    mixed = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name="a", embedding_dim=8, num_embeddings=100, feature_names=["fa"], data_type=DataType.FP16),
        EmbeddingBagConfig(name="b", embedding_dim=8, num_embeddings=100, feature_names=["fb"], data_type=DataType.FP32)],
        device=torch.device("meta"))
    enum = EmbeddingEnumerator(topology=topo, batch_size=64, estimator=[EmulatedPerfEstimator(topo)])
    with pytest.raises(ShardError, match="one weights precision per plan; the tables mix fp16 .a. and fp32 .b.") as exc:
        enum.enumerate(mixed, [EmbeddingBagCollectionSharder()])
    assert "\n" not in str(exc.value)
    with pytest.raises(ShardError, match="mixes FP16, FP32"):
        st.precision_of(mixed.embedding_bag_configs())
    # fp16 and fp32 collections: the precision is the one each option's tensor has
    for dt, name in ((DataType.FP16, "fp16"), (DataType.FP32, "fp32")):
        est = EmulatedPerfEstimator(topo)
        one = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name="a", embedding_dim=8, num_embeddings=100,
                                                                feature_names=["fa"], data_type=dt)],
                                     device=torch.device("meta"))
        EmbeddingEnumerator(topology=topo, batch_size=64, estimator=[est]).enumerate(one, [EmbeddingBagCollectionSharder()])
        assert est.precision == name
        # the emulator prices fp32's compute from its fp16 measurements by the bytes it moves, and says so
        assert (precision_note(est.model, name) is None) == (name == "fp16")


def test_planner_arguments_are_checked_as_the_command_line_flags_are():
    for kwargs, match in [({"batch_size": 0}, "batch_size must be a positive whole number, got 0"),
                          ({"batch_size": -8}, "batch_size must be a positive"),
                          ({"batch_size": True}, "batch_size must be a positive"),
                          ({"batch_size": 2.5}, "batch_size must be a positive whole number"),
                          ({"time_budget_s": 0}, "time_budget_s must be a positive number"),
                          ({"reserve": 1.0}, r"reserve must be in \[0, 1\)"),
                          ({"device_type": "tpu"}, "device_type must be one of cpu, cuda"),
                          ({"optimizer": "lion"}, "unknown optimizer 'lion'")]:
        with pytest.raises(ShardError, match=match) as exc:
            ShardkitPlanner(topology(), **kwargs)
        assert "\n" not in str(exc.value)
    from torchrec.distributed.planner.constants import BATCH_SIZE

    planner = ShardkitPlanner(topology(), batch_size=None)
    assert planner.batch_size == BATCH_SIZE                     # None (not 0): TorchRec's default
    with pytest.raises(ShardError, match="plans a torch module .* got int"):
        planner.plan(42, [EmbeddingBagCollectionSharder()])
    with pytest.raises(ShardError, match="non-empty list"):
        planner.plan(ebc(SPEC), [])
    with pytest.raises(ShardError, match="holds no EmbeddingBagCollection"):
        planner.plan(torch.nn.Linear(2, 2), [EmbeddingBagCollectionSharder()])


def test_planner_refuses_a_cost_model_fitted_in_another_precision():
    base = emulated_model(os.devnull, 65536, CommModel())
    base.landscape, base.precision = "measured", "fp16"        # as a file fitted on fp16 measurements reads
    with pytest.raises(ShardError, match="fitted on fp16 weights and the collection's tables are fp32"):
        ShardkitPlanner(topology(), oracle=base, time_budget_s=1.0).plan(ebc(SPEC), [EmbeddingBagCollectionSharder()])


def test_planner_plans_fit_the_memory_account_with_the_optimizers_state():
    """Adam keeps two fp32 states per weight: four 49 MiB fp32 tables need 146 MiB each with their state.
    On 4 ranks of 200 MiB (170 after the 15% reserve) every rank's weights, state and buffers fit; on
    ranks of 100 MiB no plan does, and the planner says which rank needs what."""
    from shardcore.interop.memory import device_memory

    spec = [(200_000, 64)] * 4
    cons = {f"t{i}": ParameterConstraints(pooling_factors=[2.0]) for i in range(4)}
    planner = ShardkitPlanner(topology(cap=200 << 20), batch_size=512, constraints=cons, time_budget_s=1.0,
                              optimizer="adam")
    planner.plan(ebc(spec), [EmbeddingBagCollectionSharder()])
    assert [t.index for t in planner.last_plan.tables] == [s.table.index for s in planner.last_stats]
    assert planner.last_plan.topology.precision == "fp32"
    again = device_memory(planner.last_plan, "adam", planner.global_batch)
    assert [m.total for m in again] == [m.total for m in planner.last_memory]
    assert all(m.total <= planner.cap_gb() * 2 ** 30 for m in again)
    assert all(m.optimizer == 2 * m.weights for m in again)      # two fp32 states per fp32 weight
    with pytest.raises(ShardError, match=r"rank \d needs .* GiB \(weights .*adam state .*buffers") as exc:
        ShardkitPlanner(topology(cap=100 << 20), batch_size=512, constraints=cons, time_budget_s=1.0,
                        optimizer="adam").plan(ebc(spec), [EmbeddingBagCollectionSharder()])
    assert "\n" not in str(exc.value)
