"""One cost-oracle interface (shardcore.types) and the measurement cache as a layer around any oracle.

The cache-layer tests wrap the emulated oracle (deterministic, no workers, microseconds); the same
layer around the measuring evaluator is exercised in test_evaluator.py."""

from __future__ import annotations

import json

import pytest

from shardcore.oracles.cache import CachedOracle, CostCache
from shardcore.errors import ShardError
from shardcore.evaluation.compare import evaluate, plan_task
from shardcore.oracles.measured.driver import PlanEvaluator
from shardcore.oracles.emulated.oracle import EmulatedOracle
from shardcore.oracles.factory import open_oracle
from shardcore.baselines import make_baseline
from shardcore.tables import TableConfig
from shardcore.tasks import Task
from shardcore.types import COST_PARTS, CommLayout, CostOracle, DeviceCost, PlanResult, ShardCostOracle, Topology

from helpers import FnOracle, make_dataset
from helpers import BIG_CAP


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("oracles_ds")
    tables = make_dataset(path, num_tables=16, batch_size=64, seed=5)
    return path, tables


class CountingEmulated(EmulatedOracle):
    """The emulated oracle counting what it is asked; ``comm_measured`` as a test sets it."""

    def __init__(self, *a, comm_measured=False, fit="full", **kw):
        super().__init__(*a, fit=fit, **kw)
        self.comm_measured = comm_measured
        self.plans_asked = 0
        self.shards_asked = 0

    def evaluate(self, shards, no_cache=None, *, compute=None):
        self.plans_asked += 1
        self.shards_asked += sum(1 for d, s in enumerate(shards) if s and d not in (compute or {}))
        return super().evaluate(shards, no_cache, compute=compute)


def plan_of(tables):
    return [list(tables[0:3]), list(tables[3:5]), []]


# -- the protocol ------------------------------------------------------------------------------
def test_every_oracle_implements_the_protocol(tiny, tmp_path):
    path, _ = tiny
    ev = PlanEvaluator(path, ndevices=2, bench_iters=1, warmup_iters=0)   # no worker starts before a request
    emu = EmulatedOracle(path, 3)
    layer = CachedOracle(EmulatedOracle(path, 3, fit="full"), tmp_path / "c.sqlite")
    for oracle in (ev, emu, layer):
        assert isinstance(oracle, CostOracle) and isinstance(oracle, ShardCostOracle), type(oracle).__name__
    assert not ev.running   # checking the interface started nothing
    assert isinstance(FnOracle(lambda s: []), CostOracle) and not isinstance(FnOracle(lambda s: []), ShardCostOracle)
    assert ev.comm_measured and not emu.comm_measured
    assert COST_PARTS == ("fw_comp", "fw_comm", "bw_comm", "bw_comp")


def test_the_result_type_says_what_it_stands_for(tiny):
    path, tables = tiny
    with EmulatedOracle(path, 3) as emu:
        r = emu.evaluate(plan_of(tables))
    assert isinstance(r, PlanResult) and r.ndevices == 3 and all(len(d) == len(COST_PARTS) for d in r.device_costs_ms)
    assert r.cost_ms == max(sum(d) for d in r.device_costs_ms) and not r.from_cache
    assert r.hardware == emu.hardware and "emulated NVIDIA H200" in r.hardware
    assert r.parts == emu.parts and r.parts["compute"].startswith("modelled")


def test_open_oracle_builds_and_wraps(tiny, tmp_path):
    path, _ = tiny
    measured = open_oracle(path, 2, device_ids=[0, 1], cache=tmp_path / "c.sqlite", bench_iters=1)
    assert isinstance(measured, CachedOracle) and isinstance(measured.oracle, PlanEvaluator)
    assert measured.oracle.bench_iters == 1 and measured.ndevices == 2 and not measured.running
    assert isinstance(open_oracle(path, 2, device_ids=[0, 1], cache=None), PlanEvaluator)
    emu = open_oracle(path, 3, oracle="emulated:h200", cache=tmp_path / "c.sqlite", bench_iters=1)
    assert isinstance(emu, EmulatedOracle)   # never cached: it answers in microseconds
    with pytest.raises(ShardError, match="unknown oracle 'tpu'"):
        open_oracle(path, 2, oracle="tpu")


def test_topology_refuses_bad_values_in_one_line():
    assert Topology(4, 2, "fp32") == Topology(4, 2.0, "fp32")
    for args, msg in (((0, 1.0), "at least one device"), ((2, 0.0), "memory cap must be positive"),
                      ((2, 1.0, "int8"), "unknown precision 'int8'")):
        with pytest.raises(ShardError, match=msg) as exc:
            Topology(*args)
        assert "\n" not in str(exc.value)


# -- the consumers ----------------------------------------------------------------------------
def test_evaluate_keeps_the_oracles_whole_answer_out_of_the_record(tiny):
    _, tables = tiny
    oracle = FnOracle(lambda shards: [[len(s), 0.5, 0.25, 2.0 * len(s)] for s in shards])
    tasks = [Task((0, 1, 2, 3, 4)), Task((5, 6, 7))]
    results = evaluate(tasks, tables, {"naive": make_baseline("naive")}, Topology(2, 1.0), oracle=oracle)
    assert oracle.calls == 2
    for r in results:
        assert r.measured.hardware == "a test function" and r.cost_ms == r.measured.cost_ms
        assert r.device_costs_ms == r.measured.device_costs_ms
        record = r.to_json()
        assert "measured" not in record and record["cost_ms"] == r.cost_ms
        json.dumps(record)
    planned_only = evaluate(tasks, tables, {"naive": make_baseline("naive")}, Topology(2, 1.0))
    assert all(r.measured is None and "cost_ms" not in r.to_json() for r in planned_only)
    result, plan = plan_task(0, "naive", make_baseline("naive"), tasks[0].tables(tables), Topology(2, 1.0))
    assert plan is not None and result.ndevices == 2 and result.max_memory_gb == 1.0


def test_repeats_measure_interleaved_afresh_and_keep_medians(tiny):
    """--repeats N: a task's plans are measured in N rounds (every algorithm once per round), never
    from the cache, and each record keeps per device and part medians and every round's cost."""
    _, tables = tiny
    seen = []
    noise = iter([1.0, 10.0, 3.0, 30.0, 2.0, 20.0] * 2)

    def fn(shards):
        k = next(noise)
        return [[k * len(s), 0.0, 0.0, 0.0] for s in shards]

    class Recording(FnOracle):
        def evaluate(self, shards, no_cache=None):
            seen.append(no_cache)
            return super().evaluate(shards, no_cache)

    oracle = Recording(fn)
    sharders = {"naive": make_baseline("naive"), "size_greedy": make_baseline("size_greedy")}
    tasks = [Task((0, 1, 2, 3)), Task((4, 5, 6, 7))]
    results = evaluate(tasks, tables, sharders, Topology(2, 1.0), oracle=oracle, repeats=3)
    assert oracle.calls == 12 and seen == [True] * 12
    # rounds interleave the algorithms: naive got factors 1, 3, 2 (median 2), size_greedy 10, 30, 20
    first_naive, first_size = results[0], results[1]
    assert first_naive.alg == "naive" and first_naive.extra["repeat_costs_ms"] == [2.0, 6.0, 4.0]
    sizes = [len(s) for s in first_size.plan(tasks[0].tables(tables)).device_pieces]
    assert first_naive.cost_ms == 4.0 and first_size.cost_ms == 20.0 * max(sizes)
    assert first_size.device_costs_ms == [DeviceCost(20.0 * n, 0.0, 0.0, 0.0) for n in sizes]
    with pytest.raises(ShardError, match="repeats"):
        evaluate(tasks, tables, sharders, Topology(2, 1.0), oracle=oracle, repeats=0)


# -- the cache layer --------------------------------------------------------------------------
def test_cache_layer_stores_shards_but_not_plans_with_modelled_communication(tiny, tmp_path):
    path, tables = tiny
    cache = CostCache(tmp_path / "c.sqlite")
    inner = CountingEmulated(path, 3)
    with CachedOracle(inner, cache) as layer:
        first = layer.evaluate(plan_of(tables))
        assert (inner.plans_asked, inner.shards_asked) == (1, 2) and not first.from_cache
        assert first.compute_from_cache == [False, False, False]
        assert cache.counts() == {"shards": 2, "plans": 0}   # the exchange is modelled: no plan row
        again = layer.evaluate(plan_of(tables))
    # the plan is asked again (its exchange is modelled afresh), its shards' compute comes from the cache
    assert (inner.plans_asked, inner.shards_asked) == (2, 2)
    assert not again.from_cache and again.compute_from_cache == [True, True, False]
    assert again.device_costs_ms == first.device_costs_ms
    assert layer.stats == {"plan_hits": 0, "plan_misses": 2, "shard_hits": 2, "shard_misses": 2}
    # the shard entries read back as training data, under the oracle's setting
    entries = cache.shard_entries(inner.context)
    assert sorted(e.total_ms for e in entries) == sorted(d[0] + d[3] for d in first.device_costs_ms[:2])
    assert all(e.hardware == "emulated:h200" and e.batch_size == 64 for e in entries)


def test_cache_layer_answers_a_stored_plan_without_asking_the_oracle(tiny, tmp_path):
    path, tables = tiny
    inner = CountingEmulated(path, 3, comm_measured=True)   # as a measuring oracle: plans are stored
    layer = CachedOracle(inner, CostCache(tmp_path / "c.sqlite"))
    first = layer.evaluate(plan_of(tables))
    hit = layer.evaluate([list(reversed(plan_of(tables)[0])), plan_of(tables)[1], []])   # table order is irrelevant
    assert inner.plans_asked == 1 and hit.from_cache and hit.compute_from_cache == [True, True, True]
    assert hit.device_costs_ms == first.device_costs_ms and hit.comm is None
    assert hit.hardware == inner.hardware and hit.parts == inner.parts
    assert layer.cache.counts() == {"shards": 2, "plans": 1}
    # device order matters: the same shards on other devices are another plan (only the exchange is new)
    swapped = layer.evaluate([plan_of(tables)[1], plan_of(tables)[0], []])
    assert inner.plans_asked == 2 and not swapped.from_cache and swapped.compute_from_cache == [True, True, False]
    assert layer.stats["plan_hits"] == 1 and layer.stats["plan_misses"] == 2


def test_no_cache_reads_nothing_but_stores_what_it_measured(tiny, tmp_path):
    path, tables = tiny
    inner = CountingEmulated(path, 3, comm_measured=True)
    layer = CachedOracle(inner, CostCache(tmp_path / "c.sqlite"))
    layer.evaluate(plan_of(tables))
    fresh = layer.evaluate(plan_of(tables), no_cache=True)
    assert inner.plans_asked == 2 and inner.shards_asked == 4 and not fresh.from_cache
    assert fresh.compute_from_cache == [False, False, False]
    assert layer.cache.counts() == {"shards": 2, "plans": 1}   # replaced, not added
    always_fresh = CachedOracle(inner, layer.cache, no_cache=True)   # the default of every call
    always_fresh.evaluate(plan_of(tables))
    assert inner.plans_asked == 3 and always_fresh.stats["plan_hits"] == 0
    assert always_fresh.evaluate(plan_of(tables), no_cache=False).from_cache   # a call may still read
    assert inner.plans_asked == 3


def test_cache_keys_keep_settings_apart(tiny, tmp_path):
    path, tables = tiny
    cache = CostCache(tmp_path / "c.sqlite")
    CachedOracle(CountingEmulated(path, 3, comm_measured=True), cache).evaluate(plan_of(tables))
    other_batch = CountingEmulated(path, 3, comm_measured=True, batch_size=32)
    r = CachedOracle(other_batch, cache).evaluate(plan_of(tables))
    assert other_batch.plans_asked == 1 and not r.from_cache and r.compute_from_cache == [False] * 3
    assert cache.counts() == {"shards": 4, "plans": 2}


def test_cache_layer_measure_shards(tiny, tmp_path):
    path, tables = tiny
    inner = CountingEmulated(path, 3)
    layer = CachedOracle(inner, CostCache(tmp_path / "c.sqlite"))
    a, b = list(tables[0:2]), list(tables[2:5])
    first = layer.measure_devices([a, b, a, []])
    assert first[0] == first[2] and first[3].total_ms == 0.0
    assert layer.cache.counts()["shards"] == 2 and layer.stats["shard_misses"] == 2   # a given twice: stored once
    again = layer.measure_devices([b, a])
    assert again == [first[1], first[0]] and layer.stats["shard_hits"] == 2
    assert layer.measure_devices([b]) == [first[1]]
    # an error names the shard by its position in the call, cached shards counted
    with pytest.raises(ShardError, match=r"^shard 2: table id 99 out of range"):
        layer.measure_devices([a, b, [TableConfig(99, 10, 4, 1.0)]])


def test_cache_layer_validates_before_it_reads(tiny, tmp_path):
    path, tables = tiny
    layer = CachedOracle(CountingEmulated(path, 3, comm_measured=True), CostCache(tmp_path / "c.sqlite"))
    with pytest.raises(ShardError, match="plan has 2 shards but the oracle has 3 devices"):
        layer.evaluate(plan_of(tables)[:2])
    with pytest.raises(ShardError, match="a cache layer needs a cache"):
        CachedOracle(layer.oracle, None)


def test_cache_layer_is_transparent_otherwise(tiny, tmp_path):
    path, tables = tiny
    inner = CountingEmulated(path, 3)
    layer = CachedOracle(inner, tmp_path / "c.sqlite")
    assert layer.batch_size == inner.batch_size and layer.hardware == inner.hardware
    pooled = CommLayout([8, 8, 0])
    assert layer.context == inner.context and layer.measure_comm(pooled)[0] == inner.measure_comm(pooled)[0]
    layer.oracle.comm_model = inner.comm_model.__class__(bandwidth_gbps=1.0)   # set on the wrapped oracle
    assert layer.comm_model.bandwidth_gbps == 1.0 and "comm_model" not in vars(layer)   # the layer answers with it
    with pytest.raises(AttributeError):   # the layer forwards nothing it does not state: the contract is explicit
        layer.comm_model = None
    assert not hasattr(layer, "worker_pids") and not hasattr(CachedOracle, "__getattr__")


def test_cache_layer_never_keeps_row_wise_or_data_parallel_pieces(tiny, tmp_path):
    """A piece's lookups are a row range or a batch slice, which the cache's keys (index, rows, dim)
    cannot tell apart from the whole table: neither its shard nor its plan is stored or answered."""
    from shardcore.plan import Plan, data_parallel, row_wise, table_wise

    path, tables = tiny
    task = list(tables[:4])
    plan = Plan(task, [row_wise([0, 1, 2]), table_wise(2), data_parallel(3), table_wise(1)], Topology(3, BIG_CAP))
    shards = plan.device_pieces
    inner = CountingEmulated(path, 3, comm_measured=True)
    layer = CachedOracle(inner, CostCache(tmp_path / "c.sqlite"))
    first = layer.evaluate(shards)
    again = layer.evaluate(shards)
    assert inner.plans_asked == 2 and not again.from_cache
    assert layer.cache.counts() == {"shards": 0, "plans": 0}   # every device holds a piece
    assert again.device_costs_ms == first.device_costs_ms
    whole = layer.evaluate(Plan(task, [table_wise(0), table_wise(2), table_wise(1), table_wise(1)], Topology(3, BIG_CAP)).device_pieces)
    assert not whole.from_cache and layer.cache.counts() == {"shards": 3, "plans": 1}


# -- the emulated oracle prices row-wise and data-parallel collectives --------------------------
def _hot_task(tables):
    """Four tables with lookups (a row-wise table's id exchange is not empty)."""
    task = [t for t in tables if t.pooling_factor > 0][:4]
    assert len(task) == 4
    return task


def _slices(B, n):
    base, rem = divmod(B, n)
    return [base + (1 if j < rem else 0) for j in range(n)]


def _hand_ids(task, shardings, n, B):
    """``ids[j][k]``: int64 elements batch slice ``j`` sends device ``k``, counted by hand from the
    convention: a table-wise holder and every column block's holder get all the table's expected ids
    (pooling factor per sample), a row-wise block's holder those in its rows (pooling factor x row
    share), each plus one length per sample; a data-parallel replica nothing."""
    from shardcore.plan import row_blocks

    sl = _slices(B, n)
    ids = [[0.0] * n for _ in range(n)]
    for t, s in zip(task, shardings):
        if s.type == "table_wise":
            holders = [(s.devices[0], t.pooling_factor)]
        elif s.type == "column_wise":
            holders = [(d, t.pooling_factor) for d in s.devices]
        elif s.type == "row_wise":
            holders = [(d, t.pooling_factor * r / t.row) for d, r in zip(s.devices, row_blocks(t.row, len(s.devices)))]
        else:
            holders = []
        for k, pf in holders:
            for j in range(n):
                ids[j][k] += sl[j] * pf + sl[j]
    return ids


def _id_ms(model, ids, d):
    n = len(ids)
    sent = 8 * sum(ids[d][k] for k in range(n) if k != d)
    recv = 8 * sum(ids[j][d] for j in range(n) if j != d)
    return model.latency_us * 1e-3 + max(sent, recv) / (model.bandwidth_gbps * 1e9) * 1e3


def test_emulated_ids_travel_for_every_model_parallel_table(tiny):
    """Every table's input ids travel from the device that read the sample to the device(s) holding
    its rows: the forward adds one int64 all-to-all, counted here by hand for a table-wise, a
    column-wise, a row-wise and a data-parallel plan; the pooled outputs travel both ways as before."""
    from shardcore.oracles.commmodel import CommModel
    from shardcore.oracles.measured.worker import model_extra
    from shardcore.plan import Plan, column_wise, data_parallel, row_wise, table_wise


    path, tables = tiny
    task = _hot_task(tables)
    hot = task[0]
    n, B = 3, 64                              # uneven slices: 22, 21, 21
    model = CommModel(bandwidth_gbps=50.0, latency_us=10.0)
    emu = EmulatedOracle(path, n, comm_model=model)
    rest = [table_wise(2), table_wise(1), table_wise(0)]
    plans = {"tw": [table_wise(0)] + rest, "cw": [column_wise([(0, 4), (2, hot.dim - 4)])] + rest,
             "rw": [row_wise([0, 1, 2])] + rest, "dp": [data_parallel(n)] + rest}
    res = {}
    for name, shardings in plans.items():
        plan = Plan(task, shardings, Topology(n, BIG_CAP))
        shards = plan.device_pieces
        r = res[name] = emu.evaluate(shards)
        dims = [sum(0 if getattr(t, "kind", None) == "data_parallel" else t.dim for t in s) for s in shards]
        ids = _hand_ids(task, shardings, n, B)
        pooled = model.predict(dims, B)
        for d in range(n):
            fw, bw = r.device_costs_ms[d][1:3]
            # the forward is the pooled exchange plus exactly the hand-counted id all-to-all
            assert fw - pooled[d][0] == pytest.approx(_id_ms(model, ids, d), rel=1e-9)
            if name != "dp":        # no all-reduce: the backward is the pooled exchange alone
                assert bw == pytest.approx(pooled[d][1], rel=1e-12)
        # the measured evaluator's modelled exchange (oversubscribed), given those counts, is the same
        times = model_extra(model, pooled, CommLayout(dims, ids_send=ids, allreduce=[0] * n), "fp16")
        for d in range(n):
            assert r.device_costs_ms[d][1] == pytest.approx(times[d][0], rel=1e-9)
    # a table-wise holder receives the table's ids from the two other slices: device 0 holds two tables
    ids = _hand_ids(task, plans["tw"], n, B)
    assert ids[1][0] == pytest.approx(21 * (hot.pooling_factor + 1) + 21 * (task[3].pooling_factor + 1))
    # column blocks each receive all ids: more id traffic than table-wise; row blocks share them out
    assert res["cw"].device_costs_ms[2][1] > res["tw"].device_costs_ms[2][1]
    # the row-wise partials widen every holder's pooled exchange: its backward is that of the dims
    rw_dims = [sum(t.dim for t in s) for s in Plan(task, plans["rw"], Topology(n, BIG_CAP)).device_pieces]
    assert rw_dims[1] == task[1].dim + hot.dim
    assert "input-id all-to-all" in res["rw"].parts["comm"] and "data-parallel" in res["rw"].parts["comm"]
    assert res["rw"].parts["comm"].startswith("modelled (analytic")


def test_emulated_data_parallel_table_adds_its_all_reduce_and_sends_no_outputs(tiny):
    """A replica sends no pooled outputs and no ids; it adds the gradient all-reduce (backward), and its
    compute is a kernel of its own over the device's batch slice, with the table's pooling factor."""
    from shardcore.oracles.commmodel import CommModel
    from shardcore.plan import Plan, data_parallel, table_wise

    path, tables = tiny
    task = _hot_task(tables)
    small = task[0]
    n, B = 3, 64
    model = CommModel()
    emu = EmulatedOracle(path, n, comm_model=model)
    rest = [table_wise(2), table_wise(1), table_wise(0)]
    dp_plan = Plan(task, [data_parallel(n)] + rest, Topology(n, BIG_CAP))
    dp = emu.evaluate(dp_plan.device_pieces)
    without = emu.evaluate(Plan(task[1:], rest, Topology(n, BIG_CAP)).device_pieces)
    ring = 2 * (n - 1) / n * small.row * small.dim * 2          # fp16 gradient, ring all-reduce
    expect = model.latency_us * 1e-3 + ring / (model.bandwidth_gbps * 1e9) * 1e3
    for d in range(n):
        fw, bw = dp.device_costs_ms[d][1:3]
        # neither its pooled dims nor its ids are exchanged: the forward is the plan's without the table
        assert fw == pytest.approx(without.device_costs_ms[d][1], rel=1e-12)
        assert bw - without.device_costs_ms[d][2] == pytest.approx(expect, rel=1e-9)
    assert dp.comm[0].fw_send == without.comm[0].fw_send
    # compute: the device's whole tables at the batch, plus the replica alone at the device's slice
    cv = emu.length_cv
    for d, (shard, slice_d) in enumerate(zip(dp_plan.device_pieces, _slices(B, n))):
        rep = [p for p in shard if getattr(p, "kind", None) == "data_parallel"]
        whole = [p for p in shard if getattr(p, "kind", None) != "data_parallel"]
        assert len(rep) == 1 and rep[0].pooling_factor == small.pooling_factor and rep[0].batch_part == (d, n)
        a = emu.model.predict(whole, B, [cv[t.index] for t in whole])
        # the replica kernel: fixed + weights x its lookup and distinct-row traffic at the slice,
        # fitted on the replica devices measured on an H200 (GpuComputeModel.predict_replicas)
        b = emu.model.predict_replicas([[small]], slice_d, [[cv[small.index]]])[0]
        assert dp.device_costs_ms[d][0] == pytest.approx(a[0] + b[0], rel=1e-12)
        assert dp.device_costs_ms[d][3] == pytest.approx(a[1] + b[1], rel=1e-12)
        assert 0 < b[0] < emu.model.predict([small], B, [cv[small.index]])[0]   # less than the table at the batch
    # one device: nothing to exchange
    one = EmulatedOracle(path, 1).evaluate(Plan(task, [data_parallel(1)] + [table_wise(0)] * 3, Topology(1, BIG_CAP)).device_pieces)
    assert one.device_costs_ms[0][1:3] == (0.0, 0.0)
