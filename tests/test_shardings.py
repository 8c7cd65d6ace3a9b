"""Sharding types beyond table-wise: the plan type, its JSON, memory accounting, the pieces' real
lookups (numerically the same work as table-wise), and an RW/DP plan measured on 4 logical CPU devices."""

from __future__ import annotations

import json

import pytest
import torch

from shardcore.oracles.measured.benchmark import build_operator, shard_lookups
from shardcore.dataset import load_dataset
from shardcore.errors import ShardError
from shardcore.evaluation.compare import TaskResult, plan_task
from shardcore.types import Sharder, Topology
from shardcore.baselines import make_baseline
from shardcore.plan import (Plan, ShardPiece, column_wise, data_parallel, row_blocks, row_wise, table_wise)
from shardcore.oracles.measured.shardings import comm_layout, piece_lookups
from shardcore.tables import TableConfig
from tests.helpers import make_dataset
from helpers import BIG_CAP

B = 50


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("shardings")
    tables = make_dataset(path, num_tables=6, batch_size=B, seed=3, dims=(8, 16))
    return str(path), tables


def _op(tables, weights):
    op = build_operator(tables, precision="fp32")
    for w_dst, w in zip(op.split_embedding_weights(), weights):
        w_dst.copy_(w)
    return op


def _pooled(ds, tables, weights):
    idx, off = shard_lookups(ds, tables, B)
    return _op(tables, weights)(idx, off).detach()


def test_rw_cw_dp_pooled_outputs_equal_table_wise(data):
    path, tables = data
    ds = load_dataset(path)
    t = max(tables, key=lambda x: x.pooling_factor * (x.row > 100))   # a table with many lookups
    t = t.with_dim(16)
    assert t.pooling_factor > 0
    w = torch.randn(t.row, t.dim, generator=torch.Generator().manual_seed(0))
    tw = _pooled(ds, [t], [w])
    assert tw.abs().sum() > 0
    # row-wise over 3 devices (the last block shorter): the partial sums add up to the table-wise output
    plan = Plan([t], [row_wise([2, 0, 1])], Topology(3, BIG_CAP))
    pieces = [p for _, p in plan.pieces]
    assert [p.row for p in pieces] == row_blocks(t.row, 3) and all(p.kind == "row_wise" for p in pieces)
    partial = [_pooled(ds, [p], [w[p.row_start:p.row_start + p.row]]) for p in pieces]
    torch.testing.assert_close(sum(partial), tw, rtol=1e-5, atol=1e-5)
    # each piece looks up only its range: all lookups together are the table's
    assert sum(int(piece_lookups(ds, p, B)[0].numel()) for p in pieces) == int(piece_lookups(ds, t, B)[0].numel())
    # uneven column-wise: the blocks side by side are the table-wise output
    plan = Plan([t], [column_wise([(1, 4), (0, 12)])], Topology(2, BIG_CAP))
    blocks = [p for _, p in plan.pieces]
    assert [b.dim for b in blocks] == [4, 12]
    cw = torch.cat([_pooled(ds, [blocks[0]], [w[:, :4]]), _pooled(ds, [blocks[1]], [w[:, 4:]])], dim=1)
    torch.testing.assert_close(cw, tw, rtol=1e-5, atol=1e-5)
    # data-parallel: every replica pools its own slice of the batch (only those bags), together the
    # whole batch
    plan = Plan([t], [data_parallel(3)], Topology(3, BIG_CAP))
    reps = [p for _, p in plan.pieces]
    assert all(p.pooling_factor == t.pooling_factor for p in reps)   # its lookups per sample of its slice
    outs = [_pooled(ds, [p], [w]) for p in reps]
    start = 0
    for p, out in zip(reps, outs):
        n = len(range(*_slice(p.batch_part, B)))
        assert out.shape == (n, t.dim)
        torch.testing.assert_close(out, tw[start:start + n], rtol=1e-5, atol=1e-5)
        start += n
    assert start == B


def _slice(part, b):
    j, n = part
    base, rem = divmod(b, n)
    sizes = [base + (1 if k < rem else 0) for k in range(n)]
    return sum(sizes[:j]), sum(sizes[:j + 1])


TASK = [TableConfig(0, 1000, 16, 5.0), TableConfig(1, 10, 8, 2.0), TableConfig(2, 7, 32, 1.0),
        TableConfig(3, 300, 12, 3.0)]


def test_memory_accounting_per_type():
    plan = Plan(TASK, [row_wise([0, 1, 2]), data_parallel(3), column_wise([(2, 8), (0, 24)]),
                                      table_wise(1)], Topology(3, BIG_CAP))
    per_elem = 2 / float(1 << 30)   # fp16
    expect = [334 * 16 + 10 * 8 + 7 * 24, 334 * 16 + 10 * 8 + 300 * 12, 332 * 16 + 10 * 8 + 7 * 8]
    assert plan.device_memory_gb() == pytest.approx([e * per_elem for e in expect])
    assert plan.device_memory_gb("fp32") == pytest.approx([e * 2 * per_elem for e in expect])
    # a row-wise table with fewer rows than devices: empty trailing blocks hold nothing
    small = Plan([TASK[2]], [row_wise([0, 1, 2, 3])], Topology(4, BIG_CAP))
    assert row_blocks(7, 4) == [2, 2, 2, 1]
    assert row_blocks(3, 4) == [1, 1, 1, 0]
    assert small.device_memory_gb() == pytest.approx([2 * 32 * per_elem] * 3 + [32 * per_elem])
    # the feasibility check counts a replica on every device
    assert not Plan([TASK[0]], [data_parallel(4)], Topology(4, 1000 * 16 * per_elem * 0.99)).feasible


def test_plans_of_whole_tables_and_uniform_column_blocks_read_back_from_the_compact_form():
    topo = Topology(3, BIG_CAP)
    plan = Plan(TASK, [table_wise(0), column_wise([(1, 4), (0, 4)]), table_wise(2),
                       column_wise([(0, 4), (1, 4), (2, 4)])], topo)
    assert (plan.allocation, plan.splits) == ((0, 1, 0, 2, 0, 1, 2), (1, 2, 1, 3)) and not plan.general
    assert Plan.from_allocation(TASK, plan.allocation, topo, plan.splits) == plan
    whole = Plan(TASK, [table_wise(d) for d in (2, 1, 0, 0)], topo)
    assert whole == Plan.table_wise(TASK, (2, 1, 0, 0), topo) and whole.splits is None


def test_json_round_trip_of_every_type():
    shardings = [row_wise([2, 0]), data_parallel(3), column_wise([(2, 8), (0, 24)]), table_wise(1)]
    plan = Plan(TASK, shardings, Topology(3, 1.0, "fp16"))
    obj = json.loads(json.dumps(plan.shardings_json()))
    assert obj == [{"type": "row_wise", "devices": [2, 0], "rows": [500, 500]},
                   {"type": "data_parallel", "devices": [0, 1, 2]},
                   {"type": "column_wise", "devices": [2, 0], "dims": [8, 24]},
                   {"type": "table_wise", "devices": [1]}]
    assert Plan.from_json(TASK, obj, Topology(3, 1.0, "fp16")) == plan
    assert list(plan.shardings) == shardings and plan.sharding_types[0] == "row_wise"
    # an eval.py --out record: written, read back, the same plan
    class Fixed:
        name = "fixed"

        def shard(self, tables, topology):
            return plan
    result, _ = plan_task(0, "fixed", Fixed(), TASK, Topology(3, 1.0, "fp16"))
    rec = json.loads(json.dumps(result.to_json()))
    assert rec["shardings"] == obj and "splits" not in rec and len(rec["allocation"]) == len(plan.allocation)
    fields = {k: v for k, v in rec.items() if k in TaskResult.__dataclass_fields__}
    again = TaskResult(**fields, general=True)
    assert again.plan(TASK) == plan
    # today's records keep their form, and gain the shardings
    result, _ = plan_task(0, "lookup_greedy", make_baseline("lookup_greedy"), TASK, Topology(3, 1.0, "fp16"))
    rec = result.to_json()
    assert [s["type"] for s in rec["shardings"]] == ["table_wise"] * 4 and "splits" not in rec
    assert result.plan() == Plan.table_wise(TASK, rec["allocation"], Topology(3, 1.0, "fp16"))


@pytest.mark.parametrize("obj, match", [
    ([{"type": "diagonal", "devices": [0]}], "unknown sharding type"),
    ([{"type": "column_wise", "devices": [0, 1], "dims": [8, 4]}], "add up to 12"),
    ([{"type": "column_wise", "devices": [0, 1], "dims": [6, 10]}], "multiples of 4"),
    ([{"type": "row_wise", "devices": [0, 1], "rows": [600, 400]}], "equal blocks"),
    ([{"type": "data_parallel", "devices": [0, 1]}], "replicated on every device"),
    ([{"type": "table_wise", "devices": [5]}], "device 5"),
    ([{"type": "table_wise", "devices": [0, 1]}], "one device"),
    ([{"type": "row_wise", "devices": [1, 1]}], "each device once"),
    ([{"type": "table_wise", "devices": "0"}], "list of whole numbers"),
    ({"type": "table_wise"}, "must be a list"),
])
def test_bad_shardings_are_one_line_errors(obj, match):
    with pytest.raises(ShardError, match=match) as exc:
        Plan.from_json([TableConfig(0, 1000, 16, 5.0)], obj, Topology(3, BIG_CAP))
    assert "\n" not in str(exc.value)


def test_comm_layout_counts_the_real_ids(data):
    path, tables = data
    ds = load_dataset(path)
    task = [t for t in tables if t.pooling_factor > 0][:4]
    task[3] = task[3].with_dim(16)
    plan = Plan(task, [row_wise([0, 1, 2]), data_parallel(3), table_wise(2),
                                      column_wise([(0, 8), (1, 8)])], Topology(3, BIG_CAP))
    shards = plan.device_pieces
    layout = comm_layout(ds, shards, B)
    # ids sent: every id of the row-wise table once, plus a length per sample per holder; the
    # table-wise table's ids to its holder; every id of the column-wise table to each of its two
    # blocks; none of the replica's
    n_ids = [int(piece_lookups(ds, t, B)[0].numel()) for t in task]
    assert sum(map(sum, layout.ids_send)) == (n_ids[0] + 3 * B) + (n_ids[2] + B) + 2 * (n_ids[3] + B)
    # counted per slice (17, 17, 16 samples) from the offsets: what slice j sends the table-wise holder
    sl = [17, 17, 16]
    off = ds.offsets[task[2].index][: B + 1].to(torch.int64)
    cuts = [0, 17, 34, 50]
    tw_slice = [int(off[cuts[j + 1]] - off[cuts[j]]) for j in range(3)]
    off3 = ds.offsets[task[3].index][: B + 1].to(torch.int64)
    cw_slice = [int(off3[cuts[j + 1]] - off3[cuts[j]]) for j in range(3)]
    rw_to = [[0] * 3 for _ in range(3)]
    for k, p in enumerate([p for _, p in plan.pieces][:3]):          # the row blocks, on devices 0, 1, 2
        idx, offs = piece_lookups(ds, p, B)
        for j in range(3):
            rw_to[j][k] = int(offs[cuts[j + 1]] - offs[cuts[j]])
    for j in range(3):
        assert layout.ids_send[j][2] == rw_to[j][2] + sl[j] + tw_slice[j] + sl[j]
        assert layout.ids_send[j][0] == rw_to[j][0] + sl[j] + cw_slice[j] + sl[j]
        assert layout.ids_send[j][1] == rw_to[j][1] + sl[j] + cw_slice[j] + sl[j]
    assert layout.allreduce == [task[1].row * task[1].dim] * 3
    assert layout.dim_sums == [task[0].dim + 8, task[0].dim + 8, task[0].dim + task[2].dim]
    assert [len(g) for g in layout.rw_sums] == [3]


def test_a_device_runs_its_replicas_in_a_kernel_of_their_own_over_its_slice(data):
    """device_kernels: whole tables / blocks / row blocks at the batch, replicas at the device's slice;
    the measured runner builds one operator each, the replica's over its slice's bags only."""
    from shardcore.oracles.measured.benchmark import ShardRunner
    from shardcore.plan import device_kernels

    path, tables = data
    ds = load_dataset(path)
    task = [t for t in tables if t.pooling_factor > 0][:3]
    plan = Plan(task, [table_wise(1), data_parallel(3), row_wise([1, 2])], Topology(3, BIG_CAP))
    shards = plan.device_pieces
    sl = [17, 17, 16]
    for d, shard in enumerate(shards):
        kernels = device_kernels(shard, B)
        rep = [p for p in shard if getattr(p, "kind", None) == "data_parallel"]
        assert kernels[-1] == (sl[d], rep)
        assert [t for b, ts in kernels if b == B for t in ts] == [p for p in shard if p not in rep]
    assert device_kernels([task[0]], B) == [(B, [task[0]])]             # whole tables: one kernel
    runner = ShardRunner(ds, shards[2], batch_size=B)
    try:
        assert len(runner.kernels) == 2
        outs = runner.forward()
        assert [tuple(o.shape) for o in outs] == [(B, task[2].dim), (16, task[1].dim)]
        assert [p.kind for p in shards[2]] == ["data_parallel", "row_wise"]   # the runner puts the row block first
        assert int(runner.kernels[1][2].numel()) == 16 + 1                 # offsets over the slice's bags
        off = ds.offsets[task[1].index]
        slice_ids = int(off[B] - off[B - 16])
        row_ids = int(piece_lookups(ds, shards[2][1], B)[0].numel())
        assert runner.num_lookups == row_ids + slice_ids
        runner.backward(outs)
        fw, bw = runner.sample(0, 1)
        assert fw[0] > 0 and bw[0] > 0
    finally:
        runner.close()


def test_rw_dp_plan_measured_end_to_end_on_four_cpu_devices(data):
    from shardcore.oracles.measured.driver import PlanEvaluator

    path, tables = data
    task = [t for t in tables if t.pooling_factor > 0][:4]
    task[2] = task[2].with_dim(16)
    shardings = [row_wise([0, 1, 2, 3]), data_parallel(4), column_wise([(3, 4), (1, 12)]), table_wise(2)]
    plan = Plan(task, shardings, Topology(4, BIG_CAP))
    tw = Plan(task, [table_wise(d) for d in (0, 1, 3, 2)], Topology(4, BIG_CAP))
    with PlanEvaluator(path, 4, bench_iters=2, warmup_iters=1, comm_iters=3, timeout_s=120) as ev:
        r = ev.evaluate(plan.device_pieces)
        base = ev.evaluate(tw.device_pieces)
    assert r.ndevices == 4 and not r.from_cache
    for fw_comp, fw_comm, bw_comm, bw_comp in r.device_costs_ms:
        assert fw_comp > 0 and bw_comp > 0      # every device holds a row block and a replica
        assert fw_comm > 0 and bw_comm > 0      # ids + pooled outputs; gradients + the DP all-reduce
    assert r.cost_ms > 0 and base.cost_ms > 0
    # what device 0 measured: its row block and its replica, pieces with their own lookups
    assert [p.kind for p in plan.device_pieces[0]] == ["row_wise", "data_parallel"]
    assert all(isinstance(p, ShardPiece) for p in plan.device_pieces[0])


def test_gpu_check_reads_row_wise_and_data_parallel_plans_from_an_eval_file(tmp_path):
    from tools.gpu_check_lib import _load_plans
    from shardcore.tasks import Task

    plan = Plan(TASK, [row_wise([2, 0]), data_parallel(3), column_wise([(2, 8), (0, 24)]),
                       table_wise(1)], Topology(3, 1.0, "fp16"))

    class Fixed:
        name = "fixed"

        def shard(self, tables, topology):
            return plan
    result, _ = plan_task(0, "fixed", Fixed(), TASK, Topology(3, 1.0, "fp16"))
    path = tmp_path / "eval.jsonl"
    path.write_text(json.dumps(result.to_json()) + "\n")
    name, sharders = _load_plans(f"S={path}", ["S"], {"S": [Task(tuple(t.index for t in TASK))]})
    assert name == "S" and sharders["fixed"].shard(TASK, Topology(3, 1.0)) == plan
    assert isinstance(sharders["fixed"], Sharder)


def test_gen_hot_tasks_puts_the_hot_table_first(data, tmp_path):
    from tests.helpers import load_tool

    path, tables = data
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("1,2,3\n4,5,0 8,16,8\n")
    out = tmp_path / "hot" / "test.txt"
    tool = load_tool("gen_hot_tasks")
    tool.main(["--data-dir", path, "--tasks", str(tasks), "--out", str(out), "--min-rows", "10", "--hot-dim", "64"])
    hot = max([t for t in tables if t.row > 10], key=lambda t: (t.pooling_factor, t.row))
    lines = out.read_text().splitlines()
    assert len(lines) == 2
    for line in lines:
        ids, dims = line.split()
        assert ids.split(",")[0] == str(hot.index) and dims.split(",")[0] == "64" and len(ids.split(",")) == 3
    with pytest.raises(ShardError, match="multiple of 4"):
        tool.main(["--data-dir", path, "--tasks", str(tasks), "--out", str(out), "--hot-dim", "6"])
    with pytest.raises(ShardError, match="out of range"):
        tool.main(["--data-dir", path, "--tasks", str(tasks), "--out", str(out), "--hot-table", "99"])
