import pytest

from shardcore.baselines import BASELINES, greedy_plan, lookup_key, make_baseline, size_lookup_key
from shardcore.errors import InfeasibleError, ShardError
from shardcore.tables import TableConfig
from shardcore.types import Topology

BIG = 100.0


def T(index, row, dim, pf=1.0):
    return TableConfig(index, row, dim, pf)


def test_ties_on_key_go_larger_size_then_larger_index_first():
    # All dims equal: order by size (idx 1 and 2 tie on size -> larger index 2 first), then 0, then 3.
    tables = [T(0, 100, 16), T(1, 200, 16), T(2, 200, 16), T(3, 50, 16)]
    plan = make_baseline("dim_greedy").shard(tables, Topology(2, BIG))
    # idx2 -> d0, idx1 -> d1, idx0 -> tie (keys 16/16, memory 200*16 each) -> lower id d0, idx3 -> d1.
    assert plan.allocation == (0, 1, 0, 1)


def test_device_ties_go_to_smaller_memory_then_lower_id():
    # lookup keys: X 10 (big), Y 10 (small), Z 5.  X -> d0, Y -> d1; Z: keys tie 10/10 -> smaller memory d1.
    x, y, z = T(0, 100_000, 10, 1.0), T(1, 10, 10, 1.0), T(2, 10, 5, 1.0)
    plan = make_baseline("lookup_greedy").shard([x, y, z], Topology(2, BIG))
    assert plan.allocation == (0, 1, 1)
    # Same memory everywhere: lower device id wins.
    same = [T(i, 10, 8, 1.0) for i in range(3)]
    assert make_baseline("lookup_greedy").shard(same, Topology(3, BIG)).allocation == (2, 1, 0)


def test_keys():
    t = T(0, 1000, 8, 2.5)
    assert lookup_key(t) == 20.0
    assert size_lookup_key(t) == pytest.approx(60.0)
    # size_greedy balances memory: two big tables never share a device.
    tables = [T(0, 1 << 20, 64), T(1, 1 << 20, 64), T(2, 10, 4), T(3, 10, 4)]
    plan = make_baseline("size_greedy").shard(tables, Topology(2, BIG))
    assert plan.allocation[0] != plan.allocation[1]


def test_memory_cap_respected_and_infeasible_reported():
    gb = 1 << 29  # rows of a dim-1 fp16 table of exactly 1 GB
    tables = [T(0, gb, 1, 100.0), T(1, gb, 1, 1.0), T(2, gb, 1, 1.0)]
    for name in BASELINES:
        plan = make_baseline(name).shard(tables, Topology(2, 2.0))
        assert max(plan.device_memory_gb()) <= 2.0
    # lookup_greedy would put table 2 beside table 1 (smaller accumulated key), but the cap forbids it.
    small_hot = [T(0, gb // 10, 1, 100.0), T(1, gb, 1, 1.0), T(2, gb, 1, 1.0)]
    assert make_baseline("lookup_greedy").shard(small_hot, Topology(2, 10.0)).allocation == (0, 1, 1)
    assert make_baseline("lookup_greedy").shard(small_hot, Topology(2, 1.5)).allocation == (0, 0, 1)
    for name in BASELINES:
        with pytest.raises(InfeasibleError, match="fits on no device"):
            make_baseline(name).shard(tables, Topology(2, 1.5))  # 3 GB on 2 x 1.5 GB: some table fits nowhere
        with pytest.raises(InfeasibleError):
            make_baseline(name).shard([T(0, 3 * gb, 1)], Topology(4, 2.0))  # one table above the cap


def test_random_is_seeded_and_naive_round_robin():
    tables = [T(i, 10, 4) for i in range(20)]
    a = make_baseline("random", seed=3).shard(tables, Topology(4, BIG))
    b = make_baseline("random", seed=3).shard(tables, Topology(4, BIG))
    c = make_baseline("random", seed=4).shard(tables, Topology(4, BIG))
    assert a == b and a != c
    assert make_baseline("naive").shard(tables[:6], Topology(4, BIG)).allocation == (0, 1, 2, 3, 0, 1)
    # naive skips a full device
    gb = 1 << 29
    plan = make_baseline("naive").shard([T(0, gb, 1), T(1, 10, 1), T(2, gb, 1)], Topology(2, 1.5))
    assert plan.allocation == (0, 1, 1)


def test_unknown_baseline():
    with pytest.raises(ShardError, match="unknown algorithm"):
        make_baseline("best_greedy")


def test_greedy_custom_key_matches_named():
    tables = [T(i, 10 * (i + 1), 4 * (i % 3 + 1), float(i % 5)) for i in range(30)]
    assert greedy_plan(tables, Topology(4, BIG), lookup_key) == make_baseline("lookup_greedy").shard(tables, Topology(4, BIG))


def test_shard_takes_a_topology():
    """One planner signature: ``shard(tables, topology)``; precision comes from the topology."""
    import inspect

    from shardcore.types import Sharder

    assert list(inspect.signature(Sharder.shard).parameters) == ["self", "tables", "topology"]
    assert {n for n in vars(Sharder) if n.startswith("shard")} == {"shard"}   # the one planner entry point
    tables = [T(i, 1 << 27, 1) for i in range(4)]   # 0.25 GB each in fp16, 0.5 GB in fp32
    for name in BASELINES:
        assert make_baseline(name).shard(tables, Topology(2, 0.6)).feasible
        with pytest.raises(InfeasibleError):
            make_baseline(name).shard(tables, Topology(2, 0.6, "fp32"))
