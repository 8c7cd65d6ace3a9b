"""What a planner is asked stays within bounds: tables larger than a device, shardkit's time budget, greedy
baselines at scale."""

from __future__ import annotations


import pytest

from shardcore.errors import ShardError
from shardcore.types import Topology
from helpers import build_planner, planning_ctx



def test_shardkit_falls_back_to_torchrec_where_greedy_cannot_place():
    """A table larger than one device's cap: no greedy start places it, TorchRec's row-wise split does;
    shardkit must not call the task infeasible."""
    from shardcore.cli import algorithms
    from shardcore.tables import TableConfig

    tables = [TableConfig(0, 4_000_000, 128, 2.0), TableConfig(1, 1000, 16, 1.0), TableConfig(2, 5000, 32, 3.0)]
    sharder = algorithms.build("shardkit", planning_ctx(4, 0.6))
    plan = sharder.shard(tables, Topology(4, 0.6, "fp16"))
    assert plan.feasible


def _tables(n, seed=0):
    import random

    from shardcore.tables import TableConfig

    rng = random.Random(seed)
    return [TableConfig(i, rng.choice([10, 1000, 10 ** 5, 10 ** 6]), rng.choice([4, 8, 16, 64]),
                        rng.choice([1.0, 2.5, 10.0])) for i in range(n)]


@pytest.mark.parametrize("cap", [0.05, 0.2, 10.0])   # tight caps: devices fill, the heap skips them
def test_greedy_in_log_devices_chooses_as_its_definition(cap):
    from shardcore.baselines import GREEDY_KEYS, greedy_plan
    from shardcore.errors import InfeasibleError
    from shardcore.topology import MEMORY_TOLERANCE_GB

    tables, n = _tables(300), 7
    topology = Topology(n, cap)
    for key in GREEDY_KEYS.values():
        keys = [float(key(t)) for t in tables]
        order = sorted(range(len(tables)), key=lambda i: (keys[i], tables[i].size, tables[i].index, i), reverse=True)
        acc_key, acc_mem, want = [0.0] * n, [0.0] * n, [-1] * len(tables)
        try:
            for i in order:    # the definition: the smallest (key, memory, device) among devices with room
                need = tables[i].memory_gb("fp16")
                legal = [d for d in range(n) if acc_mem[d] + need <= cap + MEMORY_TOLERANCE_GB]
                if not legal:
                    raise InfeasibleError("no room")
                d = min(legal, key=lambda d: (acc_key[d], acc_mem[d], d))
                want[i] = d
                acc_key[d] += keys[i]
                acc_mem[d] += need
        except InfeasibleError:
            with pytest.raises(InfeasibleError):
                greedy_plan(tables, topology, key)
            continue
        assert list(greedy_plan(tables, topology, key).allocation) == want


def test_a_time_cap_shorter_than_the_starts_still_searches_from_one_start():
    from shardkit_planner.starts import PlanningTask

    tables = _tables(40)
    sk = build_planner("shardkit", time=1e-6)
    model = sk.task_model(tables)
    starts = sk.start_plans(PlanningTask(tables, Topology(4, 10.0), model, sk.types))
    # every start is made (their work is bounded, not timed): model_, hybrid_, replicate_greedy, four greedy
    # (split_greedy has nothing to split here)
    assert len(starts) == 7
    sk.shard(tables, Topology(4, 10.0))
    assert sk.last_info["shardkit_stopped"] == "time cap" and sk.last_info["shardkit_searched"]


def test_a_topology_is_bounded_and_checks_memory_before_any_planner():
    """At most MAX_DEVICES devices; tables needing more memory together than all devices hold are
    infeasible for every plan, found by the one check before a planner is called (compare.plan_task)."""
    from shardcore.argtypes import MAX_DEVICES
    from shardcore.errors import InfeasibleError
    from shardcore.evaluation.compare import plan_task
    from shardcore.tables import TableConfig
    from shardcore.types import Sharder

    with pytest.raises(ShardError, match=rf"at most {MAX_DEVICES}, got ndevices={MAX_DEVICES + 1}"):
        Topology(MAX_DEVICES + 1, 1.0)
    tables = [TableConfig(i, 3_000_000, 64, 1.0) for i in range(3)]     # 0.36 GB each in fp16
    with pytest.raises(InfeasibleError, match=r"need 1\.07\d* GB together \(fp16\), more than 2 devices of 0\.5 GB"):
        Topology(2, 0.5).check_fits(tables)
    Topology(3, 0.5).check_fits(tables)     # they fit, one per device
    Topology(2, 0.5, "fp16").check_fits(tables[:2])

    class Never(Sharder):
        def shard(self, tables, topology):
            raise AssertionError("the planner was called")

    result, plan = plan_task(0, "never", Never("never"), tables, Topology(2, 0.5))
    assert plan is None and not result.feasible and "need 1.07" in result.error
