"""shardkit on the models users bring: tables too large for one device are split by cost. Each of the search's
moves between sharding types is taken where it lowers the model's cost and never leaves a plan above its start;
the split start chooses by cost; --shardkit-types is honoured exactly; the same task gives the same plan on a
busy machine; fp32 plans through plan.py and ShardkitPlanner alike."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shardcore.errors import InfeasibleError
from shardcore.plan import Plan, Sharding, column_wise, row_wise, table_wise
from shardcore.tables import TableConfig
from shardcore.types import Topology
from shardkit_planner import moves as M
from shardkit_planner.costmodel import emulated_model
from shardkit_planner.search import SearchStats, State, WorkBudget, local_search
from shardkit_planner.sharder import ShardkitSharder
from shardkit_planner.starts import PlanningTask, SplitGreedy

ROOT = Path(__file__).resolve().parent.parent
B = 65536


@pytest.fixture(scope="module")
def model():
    import os as _os

    return emulated_model(_os.devnull, B)


def one_hot(index, rows, dim=128):
    """A one-hot id table of a public CTR model: few lookups per sample, many rows."""
    return TableConfig(index, rows, dim, 1.0)


def search_with(model, tables, shardings, n, cap, move, precision="fp16"):
    """``move`` alone from ``shardings``: (the state before, after, the moves taken)."""
    st = State(model, tables, shardings, Topology(n, cap, precision))
    before = st.copy()
    stats = SearchStats(accepted={})
    local_search(st, WorkBudget(10 ** 7), moves=[move], stats=stats)
    return before, st, stats


def check_taken(before, after, kind):
    assert after.score < before.score and after.cost < before.cost
    assert after.plan().feasible
    fresh = State(after.model, after.tables, after.shardings, after.topology)
    np.testing.assert_allclose(fresh.costs, after.costs, rtol=1e-9)   # the search's books are the model's


def test_row_to_column_is_taken_for_a_one_hot_table(model):
    """A row block sends its partial sums for the whole batch at full width, a column block its own columns."""
    tables = [one_hot(0, 30_000_000), one_hot(1, 1000)]
    before, after, stats = search_with(model, tables, [row_wise(range(4)), table_wise(1)], 4, 8.0, M.RowToColumn())
    assert stats.accepted.get("row-to-column") and after.shardings[0].type == "column_wise"
    check_taken(before, after, "row-to-column")


def test_resplit_recuts_a_column_wise_table_into_more_blocks(model):
    tables = [one_hot(0, 20_000_000), one_hot(1, 20_000_000)]
    start = [column_wise([(0, 64), (1, 64)]), column_wise([(0, 64), (1, 64)])]   # devices 2, 3 idle
    before, after, stats = search_with(model, tables, start, 4, 8.0, M.Resplit())
    assert stats.accepted.get("resplit")
    assert {d for s in after.shardings for d in s.devices} == {0, 1, 2, 3}   # the idle devices took blocks
    check_taken(before, after, "resplit")
    # every count a dim allows, blocks as equal as multiples of 4 make them
    assert M.block_widths(128, 3) == [44, 44, 40] and M.block_widths(8, 3) is None
    assert M.split_counts(128, 8) == list(range(2, 9)) and M.split_counts(8, 8) == [2]


def test_shift_columns_makes_uneven_blocks_where_they_balance(model):
    tables = [one_hot(0, 10_000_000), one_hot(1, 10_000_000, 64)]
    start = [column_wise([(0, 64), (1, 64)]), table_wise(0)]   # device 0 carries a second table
    before, after, stats = search_with(model, tables, start, 2, 8.0, M.ShiftColumns())
    assert stats.accepted.get("shift")
    dims = dict(zip(after.shardings[0].devices, after.shardings[0].dims))
    assert dims[0] < 64 < dims[1]
    check_taken(before, after, "shift")


def test_move_block_moves_a_column_block_off_the_slowest_device(model):
    tables = [one_hot(0, 10_000_000), one_hot(1, 10_000_000), one_hot(2, 1000, 16), one_hot(3, 1000, 16)]
    start = [column_wise([(0, 64), (1, 64)]), column_wise([(0, 64), (1, 64)]), table_wise(2), table_wise(3)]
    before, after, stats = search_with(model, tables, start, 4, 8.0, M.MoveBlock())
    assert stats.accepted.get("move")
    assert {d for s in after.shardings[:2] for d in s.devices} & {2, 3}   # a block went to a light device
    check_taken(before, after, "move")


def test_respread_and_replicate_group_are_taken_where_they_pay(model):
    tables = [TableConfig(0, 4_000_000, 64, 40.0), TableConfig(1, 100, 64, 1.0)]
    before, after, stats = search_with(model, tables, [row_wise([0, 1]), table_wise(3)], 4, 8.0, M.Respread())
    assert stats.accepted.get("re-spread") and len(after.shardings[0].devices) > 2
    check_taken(before, after, "re-spread")
    # eight tiny tables: the first replica pays the replicas' kernel on every device, eight together pay off
    tiny = [one_hot(i, 50) for i in range(8)] + [one_hot(8, 20_000_000)]
    start = [table_wise(i % 4) for i in range(8)] + [column_wise([(d, 32) for d in range(4)])]
    before, after, stats = search_with(model, tiny, start, 4, 8.0, M.ReplicateGroup())
    assert stats.accepted.get("replicate-group")
    assert sum(s.type == "data_parallel" for s in after.shardings) >= 2
    check_taken(before, after, "replicate-group")


def test_no_move_ever_leaves_a_plan_above_its_start(model):
    rng = np.random.default_rng(3)
    for trial in range(12):
        n = int(rng.choice([2, 4, 8]))
        tables = [TableConfig(i, int(10 ** rng.uniform(2, 7.6)), int(rng.choice([16, 32, 64, 128])),
                              float(rng.choice([1.0, 3.0, 20.0, 80.0]))) for i in range(int(rng.integers(3, 12)))]
        cap = 1.3 * sum(t.memory_gb() for t in tables) / n + 0.01
        task = PlanningTask(tables, Topology(n, cap), model, M.ALL_TYPES)
        try:
            start = SplitGreedy().propose(task)
        except InfeasibleError:
            continue
        for move in M.FIRST_MOVES + M.SPLIT_MOVES:
            st = State(model, tables, list(start.shardings), Topology(n, cap, "fp16"))
            first = st.score
            local_search(st, WorkBudget(3000), moves=[move])
            assert st.score <= first
            assert st.plan().feasible


def mlperf():
    from shardcore.data.user_tables import read_tables

    tables, names = read_tables(ROOT / "examples" / "models" / "mlperf_dlrm_criteo1tb.csv")
    return [t.__class__(k, t.row, t.dim, t.pooling_factor, t.bins) for k, t in enumerate(tables)], names


def test_split_start_chooses_the_split_by_cost_for_tables_no_device_holds(model):
    tables, _ = mlperf()
    task = PlanningTask(tables, Topology(8, 8.0), model, M.ALL_TYPES)
    plan = SplitGreedy().propose(task)
    assert plan.feasible
    types = plan.sharding_types
    big = [i for i, t in enumerate(tables) if t.memory_gb() > 8.0]
    assert big and all(types[i] in ("column_wise", "row_wise") for i in big)
    # no other shape it tries for those tables prices lower: column-wise in any count or row-wise for all
    cost = model.plan_cost(plan)
    rowwise = PlanningTask(tables, Topology(8, 8.0), model, ("table_wise", "row_wise"))
    assert cost <= model.plan_cost(SplitGreedy().propose(rowwise)) + 1e-9
    # nothing to split: the start says so and is skipped
    with pytest.raises(InfeasibleError, match="every table fits"):
        SplitGreedy().propose(PlanningTask([one_hot(0, 100)], Topology(2, 8.0), model, M.ALL_TYPES))


def test_shardkit_types_are_honoured_exactly_and_a_needed_type_is_named(model):
    tables, _ = mlperf()
    for types in (("table_wise", "column_wise", "data_parallel"), ("table_wise", "row_wise")):
        sk = ShardkitSharder(name="shardkit", model=model, types=types, work=3000, robust=False)
        plan = sk.shard(tables, Topology(8, 8.0))
        assert set(plan.sharding_types) <= set(types)
    tw = ShardkitSharder(name="shardkit-tw", model=model, types=("table_wise",), work=3000)
    with pytest.raises(InfeasibleError, match=r"table 19 \(task position 19, 9\.532 GiB in fp16\) fits on no device "
                                              r"of 8 GiB and must be split; allow cw or rw in --shardkit-types") as exc:
        tw.shard(tables, Topology(8, 8.0))
    assert "\n" not in str(exc.value)


def _plan_cmd(out, precision="fp16", cap="8"):
    return [sys.executable, str(ROOT / "plan.py"), "--tables", str(ROOT / "examples/models/mlperf_dlrm_criteo1tb.csv"),
            "--ndevices", "8", "--max-memory", cap, "--alg", "shardkit", "--weights-precision", precision,
            "--oracle", "emulated:h200", "--shardkit-work", "4000", "--out", str(out)]


def test_the_same_task_gives_the_same_plan_on_a_busy_machine(tmp_path):
    """The search's budget is counted in work, not time: two CPU-bound processes beside the second run
    change nothing."""
    quiet = subprocess.run(_plan_cmd(tmp_path / "quiet.json"), capture_output=True, text=True, cwd=ROOT)
    assert quiet.returncode == 0, quiet.stderr
    burn = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        busy = subprocess.run(_plan_cmd(tmp_path / "busy.json"), capture_output=True, text=True, cwd=ROOT)
    finally:
        for p in burn:
            p.kill()
    assert busy.returncode == 0, busy.stderr
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("quiet.json", "busy.json"))
    assert [t["sharding"] for t in a["tables"]] == [t["sharding"] for t in b["tables"]]
    assert a["cost_ms"] == b["cost_ms"]


def test_fp32_plans_priced_by_bytes_and_said_so(tmp_path):
    out = tmp_path / "fp32.json"
    proc = subprocess.run(_plan_cmd(out, "fp32", "16"), capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "fp32 compute derived from fp16 measurements by bytes moved" in proc.stdout
    plan = json.loads(out.read_text())
    tables, _ = mlperf()
    p = Plan(tables, [Sharding.from_json(t["sharding"]) for t in plan["tables"]], Topology(8, 16.0, "fp32"))
    fp32 = p.device_memory_gb()
    assert max(fp32) <= 16.0 + 1e-9 and fp32 == [2 * m for m in p.device_memory_gb("fp16")] and p.feasible


def test_shardkit_planner_on_an_fp32_collection_plans_as_plan_py(tmp_path):
    """The MLPerf tables as an fp32 EmbeddingBagCollection through ShardkitPlanner give plan.py's plan for the
    same tables, precision, weights cap and batch (both kept to what TorchRec applies)."""
    pytest.importorskip("torchrec")
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig
    from torchrec.modules.embedding_configs import DataType

    from shardkit_torchrec import ShardkitPlanner

    tables, names = mlperf()
    world, batch = 8, 65536
    topo = TopologyFactory.create_topology(TrainerConfig(world_size=world, local_world_size=world,
                                                         hbm_cap_bytes=20 << 30), kernel_config=KernelConfig("cuda"))
    model = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=n, embedding_dim=t.dim, num_embeddings=t.row,
                                                              feature_names=[f"f_{n}"], data_type=DataType.FP32)
                                           for t, n in zip(tables, names)], device=torch.device("meta"))
    cons = {n: ParameterConstraints(pooling_factors=[t.pooling_factor]) for t, n in zip(tables, names)}
    planner = ShardkitPlanner(topo, batch_size=batch // world, constraints=cons)
    planner.plan_json(model, [EmbeddingBagCollectionSharder()])
    cap = planner.last_info["weights_cap_gb"]   # the weights' cap the memory account left (plan.py's --max-memory)
    out = tmp_path / "plan.json"
    proc = subprocess.run([sys.executable, str(ROOT / "plan.py"), "--tables", str(ROOT / "examples/models/mlperf_dlrm_criteo1tb.csv"),
                           "--ndevices", str(world), "--max-memory", repr(cap), "--weights-precision", "fp32",
                           "--alg", "shardkit", "--out", str(out), "--torchrec"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    theirs = json.loads(out.read_text())
    assert planner.last_info["precision"] == "fp32" and "fp32 compute derived from fp16" in planner.last_info["precision_note"]
    assert planner.last_plan.shardings_json() == [t["sharding"] for t in theirs["tables"]]
