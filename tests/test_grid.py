"""Grid sharding (TorchRec's grid_shard): column blocks, each row-wise over its own devices. Its pieces
are row-wise pieces of the block's dim, so every oracle, cost model and the measured path price and
run them as they do row-wise pieces."""

from __future__ import annotations

import json
import os

import pytest
import torch

from shardcore.dataset import load_dataset
from shardcore.errors import ShardError
from shardcore.oracles.measured.benchmark import build_operator, shard_lookups
from shardcore.oracles.measured.shardings import TYPE_ABBREV, comm_layout, piece_lookups
from shardcore.plan import (GRID, SHARDING_TYPES, Plan, ShardPiece, Sharding, column_wise, grid, row_blocks,
                            row_wise, table_wise)
from shardcore.tables import TableConfig
from tests.helpers import make_dataset
from helpers import BIG_CAP
from shardcore.topology import Topology

T = TableConfig(0, 1000, 16, 5.0)
TASK = [T, TableConfig(1, 10, 8, 2.0), TableConfig(2, 7, 32, 1.0), TableConfig(3, 300, 12, 3.0)]


def test_grid_pieces_are_each_blocks_row_wise_pieces_at_the_blocks_dim():
    s = grid([([0, 1], 4), ([3, 2], 12)])
    assert GRID in SHARDING_TYPES and s == Sharding(GRID, (0, 1, 3, 2), (4, 12)) and s.legacy(16) is None
    pieces = s.pieces(T, 4)
    assert [(d, p.row, p.dim, p.row_start, p.kind) for d, p in pieces] == [
        (0, 500, 4, 0, "row_wise"), (1, 500, 4, 500, "row_wise"),
        (3, 500, 12, 0, "row_wise"), (2, 500, 12, 500, "row_wise")]
    assert all(isinstance(p, ShardPiece) and p.full_row == 1000 and p.pooling_factor == 2.5 for _, p in pieces)
    # each block's pieces are exactly a row-wise sharding's over its devices, with the block's dim
    for j, (devs, w) in enumerate([([0, 1], 4), ([3, 2], 12)]):
        rw = [(d, ShardPiece(p.index, p.row, w, p.pooling_factor, p.bins, kind=p.kind, row_start=p.row_start,
                             full_row=p.full_row)) for d, p in row_wise(devs).pieces(T, 4)]
        assert pieces[2 * j:2 * j + 2] == rw
    # one block: row-wise
    one = Plan([T], [grid([([2, 0, 1], 16)])], Topology(3, BIG_CAP))
    assert [p for _, p in one.pieces] == [p for _, p in Plan([T], [row_wise([2, 0, 1])], Topology(3, BIG_CAP)).pieces]
    assert one.allocation == (2, 0, 1) and one.general
    # blocks of one device each: column-wise's pieces and memory, as row blocks of all the rows
    g1 = Plan([T], [grid([([1], 8), ([0], 4), ([2], 4)])], Topology(3, BIG_CAP))
    cw = Plan([T], [column_wise([(1, 8), (0, 4), (2, 4)])], Topology(3, BIG_CAP))
    assert [(p.row, p.dim) for p in [p for _, p in g1.pieces]] == [(p.row, p.dim) for p in [p for _, p in cw.pieces]]
    assert g1.allocation == cw.allocation and g1.device_memory_gb() == cw.device_memory_gb()
    assert {p.kind for p in [p for _, p in g1.pieces]} == {"row_wise"}


def test_grid_memory_and_empty_row_blocks():
    per_elem = 2 / float(1 << 30)   # fp16
    plan = Plan(TASK, [grid([([0, 1], 8), ([2, 3], 8)]), table_wise(0),
                                      grid([([3, 2, 1, 0], 32)]), row_wise([2, 3])], Topology(4, BIG_CAP))
    # table 2 (7 rows) over 4 devices: 2, 2, 2, 1
    expect = [500 * 8 + 10 * 8 + 1 * 32, 500 * 8 + 2 * 32, 500 * 8 + 2 * 32 + 150 * 12, 500 * 8 + 2 * 32 + 150 * 12]
    assert plan.device_memory_gb() == pytest.approx([e * per_elem for e in expect])
    small = Plan([TASK[2]], [grid([([0, 1, 2, 3], 16), ([4, 5, 6, 7], 16)])], Topology(8, BIG_CAP))
    assert row_blocks(3, 4) == [1, 1, 1, 0]
    assert len(Plan([TableConfig(2, 3, 32, 1.0)], [grid([([0, 1, 2, 3], 16), ([4, 5, 6, 7], 16)])], Topology(8, BIG_CAP)).allocation) == 6   # trailing empty blocks hold nothing
    assert small.allocation == (0, 1, 2, 3, 4, 5, 6, 7)


def test_grid_json_round_trip():
    shardings = [grid([([0, 1], 8), ([2, 3], 8)]), table_wise(1), grid([([1], 8), ([0], 24)]), row_wise([2, 3])]
    plan = Plan(TASK, shardings, Topology(4, BIG_CAP))
    obj = json.loads(json.dumps(plan.shardings_json()))
    assert obj[0] == {"type": "grid", "devices": [0, 1, 2, 3], "dims": [8, 8], "rows": [500, 500]}
    assert obj[2] == {"type": "grid", "devices": [1, 0], "dims": [8, 24], "rows": [7]}
    assert Plan.from_json(TASK, obj, Topology(4, BIG_CAP)) == plan and list(plan.shardings) == shardings
    del obj[0]["rows"]
    assert Plan.from_json(TASK, obj, Topology(4, BIG_CAP)) == plan
    assert TYPE_ABBREV["grid"] == TYPE_ABBREV["grid_shard"] == "GRID"


@pytest.mark.parametrize("obj, match", [
    ({"type": "grid", "devices": [0, 1, 2], "dims": [8, 8]}, "as many devices in every block"),
    ({"type": "grid", "devices": [0, 1]}, "one dim per column block"),
    ({"type": "grid", "devices": [0, 1], "dims": [8, 4]}, "add up to 12"),
    ({"type": "grid", "devices": [0, 1], "dims": [6, 10]}, "multiples of 4"),
    ({"type": "grid", "devices": [0, 1, 1, 2], "dims": [8, 8]}, "each device once"),
    ({"type": "grid", "devices": [0, 5], "dims": [8, 8]}, "device 5"),
    ({"type": "grid", "devices": [0, 1, 2, 3], "dims": [8, 8], "rows": [600, 400]}, "equal blocks"),
    ({"type": "grid", "devices": [0, 1], "dims": "8"}, "list of whole numbers"),
])
def test_bad_grids_are_one_line_errors(obj, match):
    with pytest.raises(ShardError, match=match) as exc:
        Plan.from_json([T], [obj], Topology(4, BIG_CAP))
    assert "\n" not in str(exc.value)
    with pytest.raises(ShardError, match="only column_wise and grid shardings have dims"):
        Sharding("row_wise", (0, 1), (8, 8))


def test_the_emulated_judge_prices_a_grid_as_its_pieces():
    """The plan cost of a grid plan is the cost of the same pieces given as shards by hand; one block
    costs what row-wise does; the comm model sees each piece's pooled width and ids."""
    from shardcore.oracles.commmodel import id_width, pooled_width
    from shardcore.oracles.emulated.emulator import MEASUREMENTS_DIR
    from shardcore.oracles.emulated.oracle import EmulatedOracle
    from shardcore.dataset import load_table_configs

    data_dir = os.path.join(MEASUREMENTS_DIR, "dlrm_b65536")
    tables = load_table_configs(os.path.join(data_dir, "table_configs.json"))
    task = [tables[i] for i in (3, 17, 40, 77, 120, 300)]
    big = task[0]
    half = big.dim // 2
    shardings = [grid([([0, 1], half), ([2, 3], half)])] + [table_wise(d) for d in (0, 1, 2, 3, 1)]
    plan = Plan(task, shardings, Topology(4, BIG_CAP))
    by_hand = [[] for _ in range(4)]
    for j, devs in enumerate(([0, 1], [2, 3])):
        start = 0
        for d, rows in zip(devs, row_blocks(big.row, 2)):
            by_hand[d].append(ShardPiece(big.index, rows, half, big.pooling_factor * rows / big.row, big.bins,
                                         kind="row_wise", row_start=start, full_row=big.row))
            start += rows
    for d, t in zip((0, 1, 2, 3, 1), task[1:]):
        by_hand[d].append(TableConfig(t.index, t.row, t.dim, t.pooling_factor, t.bins))
    assert plan.device_pieces == by_hand
    oracle = EmulatedOracle(data_dir, 4, batch_size=65536)
    r = oracle.evaluate(plan.device_pieces)
    assert r.device_costs_ms == oracle.evaluate(by_hand).device_costs_ms and r.cost_ms > 0
    # per piece: the block's dim goes out, the piece's ids (its pooling factor + a length) come in
    p = plan.device_pieces[0][0]
    assert pooled_width(p) == half and id_width(p) == pytest.approx(p.pooling_factor + 1)
    one = Plan(task, [grid([([0, 1, 2, 3], big.dim)])] + shardings[1:], Topology(4, BIG_CAP))
    rw = Plan(task, [row_wise([0, 1, 2, 3])] + shardings[1:], Topology(4, BIG_CAP))
    assert oracle.evaluate(one.device_pieces).device_costs_ms == oracle.evaluate(rw.device_pieces).device_costs_ms


B = 50


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("grid")
    tables = make_dataset(path, num_tables=6, batch_size=B, seed=3, dims=(8, 16))
    return str(path), tables


def _pooled(ds, tables, weights):
    idx, off = shard_lookups(ds, tables, B)
    op = build_operator(tables, precision="fp32")
    for w_dst, w in zip(op.split_embedding_weights(), weights):
        w_dst.copy_(w)
    return op(idx, off).detach()


def test_grid_pieces_look_up_their_rows_and_add_up_to_the_table(data):
    path, tables = data
    ds = load_dataset(path)
    t = max(tables, key=lambda x: x.pooling_factor * (x.row > 100)).with_dim(16)
    w = torch.randn(t.row, t.dim, generator=torch.Generator().manual_seed(0))
    tw = _pooled(ds, [t], [w])
    plan = Plan([t], [grid([([3, 0], 4), ([1, 2], 12)])], Topology(4, BIG_CAP))
    pieces = [p for _, p in plan.pieces]
    cols = [(0, 4), (0, 4), (4, 16), (4, 16)]
    outs = [_pooled(ds, [p], [w[p.row_start:p.row_start + p.row, c0:c1]]) for p, (c0, c1) in zip(pieces, cols)]
    # each block's row partial sums add up to the block's columns of the table-wise output
    torch.testing.assert_close(torch.cat([outs[0] + outs[1], outs[2] + outs[3]], dim=1), tw, rtol=1e-5, atol=1e-5)
    n = int(piece_lookups(ds, t, B)[0].numel())
    assert sum(int(piece_lookups(ds, p, B)[0].numel()) for p in pieces) == 2 * n   # every id once per block


def test_comm_layout_sums_each_grid_block_apart(data):
    path, tables = data
    ds = load_dataset(path)
    task = [t.with_dim(16) for t in tables if t.pooling_factor > 0][:2]
    plan = Plan(task, [grid([([0, 3], 8), ([1, 2], 8)]), row_wise([1, 2])], Topology(4, BIG_CAP))
    layout = comm_layout(ds, plan.device_pieces, B)
    # two blocks of one dim: a sum over each block's two row blocks (not one over four), and the
    # row-wise table's own
    assert sorted(len(g) for g in layout.rw_sums) == [2, 2, 2]
    grid_sums = [sorted(src for src, _c, dim in g) for g in layout.rw_sums if g[0][2] == 8]
    assert all(len(set(g)) == 2 for g in grid_sums) and sorted(s for g in grid_sums for s in g) == [0, 1, 2, 3]
    assert layout.dim_sums == [8, 8 + 16, 8 + 16, 8]
    n_ids = [int(piece_lookups(ds, t, B)[0].numel()) for t in task]
    # the grid's ids reach every block once (4 holders: 2 x the table's ids, one length per sample each)
    assert sum(map(sum, layout.ids_send)) == (2 * n_ids[0] + 4 * B) + (n_ids[1] + 2 * B)


def test_measure_plan_refuses_bad_plans_in_one_line(data, tmp_path):
    """tools/measure_plan.py (the torchrun measurement of docs/torchrun.md) checks the plan, and its
    TorchRec form, before any worker starts."""
    from tests.helpers import load_tool

    path, _tables = data
    tool = load_tool("measure_plan")
    plan = tmp_path / "p.json"
    cases = [({"tables": [0, 1], "shardings": [{"type": "grid", "devices": [0, 1, 2], "dims": [8, 8]},
                                                {"type": "table_wise", "devices": [0]}]}, [], "as many devices"),
             ({"tables": [0, 99], "shardings": []}, [], "table id 99"),
             ({"tables": [0], "shardings": [{"type": "grid", "devices": [1, 0, 2, 3], "dims": [4, 4]}]},
              ["--torchrec", str(tmp_path / "t.json"), "--devices-per-host", "2"], r"grid block on ranks \[1, 0\]"),
             ({"shardings": []}, [], '"tables" is a non-empty list')]
    for obj, extra, match in cases:
        plan.write_text(json.dumps(obj))
        with pytest.raises(ShardError, match=match) as exc:
            tool.main(["--data-dir", path, "--plan", str(plan)] + extra)
        assert "\n" not in str(exc.value)
    assert not (tmp_path / "t.json").exists()


def test_export_plans_lists_a_grid_torchrec_cannot_apply(tmp_path):
    from shardcore.interop.plan_export import export_plans

    good = Plan(TASK, [grid([([0, 1], 8), ([2, 3], 8)]), table_wise(1), table_wise(2),
                                      row_wise([2, 3])], Topology(4, BIG_CAP))
    bad = Plan(TASK, [grid([([1, 0], 8), ([2, 3], 8)]), table_wise(1), table_wise(2),
                                     table_wise(3)], Topology(4, BIG_CAP))
    export_plans(tmp_path, [(0, "a", good), (1, "a", bad)], 1.0)
    index = json.loads((tmp_path / "index.json").read_text())["plans"]
    assert index[0]["torchrec"] == "a/task_0000.torchrec.json"
    assert index[1]["torchrec"] is None and "grid block on ranks [1, 0]" in index[1]["torchrec_problem"]
    assert (tmp_path / "a" / "task_0001.json").is_file() and not (tmp_path / "a" / "task_0001.torchrec.json").exists()
    trec = json.loads((tmp_path / "a" / "task_0000.torchrec.json").read_text())
    assert [t["sharding_type"] for t in trec["tables"]] == ["grid_shard", "table_wise", "table_wise", "table_row_wise"]
