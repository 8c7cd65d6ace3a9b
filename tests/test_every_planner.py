"""Every ``--alg`` of the registry on random tasks: whatever a planner returns is a plan that holds.

The tasks are drawn at random (1 to 8 devices, a memory cap that binds, fp16 and fp32 weights, now and then
a table larger than a device); the planners are every baseline, TorchRec's (where it is installed), shardkit
and shardkit-tw (small work budgets) and the three learned methods from tiny untrained checkpoints, each
built by the registry in one planning context. Each plan is checked against the tables and the topology
from its own JSON form, with arithmetic written here (not the plan's methods): every table placed exactly
once, column blocks tiling the table's dim, row blocks tiling its rows, every piece on a device of the
topology, and every device's weights within the cap. A planner that cannot place a task must say so
(:class:`~shardcore.errors.InfeasibleError`); it must never return a plan over the cap.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from shardcore.cli import algorithms
from shardcore.errors import InfeasibleError
from shardcore.planning import Landscape, PlanningContext
from shardcore.tables import PRECISION_BYTES, TableConfig
from shardcore.topology import Topology

from helpers import make_dataset

B = 4096
TASKS = 6
LEARNED = ("autoshard", "dreamshard", "neuroshard")


def random_tasks(tables, seed=0):
    """``TASKS`` (tables, topology) pairs: 1-8 devices, fp16 or fp32, a cap between the largest table and
    a few percent above the mean load per device (binding); the last task has a table larger than a device
    (only a planner that splits tables places it)."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(TASKS):
        n = 1 if k == 0 else int(rng.integers(2, 9))
        precision = ("fp16", "fp32")[k % 2]
        idx = sorted(rng.choice(len(tables), size=int(rng.integers(4, 13)), replace=False).tolist())
        task = [tables[i] for i in idx]
        if k == TASKS - 1:
            n = 8
            task.append(TableConfig(999, 4_000_000, 64, 2.0))
        mem = [t.memory_gb(precision) for t in task]
        if k == TASKS - 1:
            cap = max(mem) * 0.6
            assert sum(mem) < n * cap
        else:
            cap = max(max(mem), sum(mem) / n * float(rng.uniform(1.02, 1.3)))
        out.append((task, Topology(n, cap, precision)))
    return out


def check_plan(tables, topology, plan, alg):
    """The plan's JSON form against the tables and topology, recomputed here."""
    where = f"{alg} on {topology}"
    n, bpe = topology.ndevices, PRECISION_BYTES[topology.precision]
    shardings = plan.shardings_json()
    assert len(shardings) == len(tables), f"{where}: {len(shardings)} shardings for {len(tables)} tables"
    memory = [0.0] * n
    for t, s in zip(tables, shardings):
        devices = s["devices"]
        assert devices and all(0 <= d < n for d in devices), f"{where}: table {t.index} on devices {devices}"
        kind = s["type"]
        if kind == "table_wise":
            assert len(devices) == 1
            memory[devices[0]] += t.row * t.dim
        elif kind == "data_parallel":
            assert sorted(devices) == list(range(n)), f"{where}: a replica on {devices}"
            for d in devices:
                memory[d] += t.row * t.dim
        elif kind == "column_wise":
            dims = s["dims"]
            assert len(dims) == len(devices) and sum(dims) == t.dim and all(w > 0 and w % 4 == 0 for w in dims), \
                f"{where}: column blocks {dims} of a dim-{t.dim} table"
            for d, w in zip(devices, dims):
                memory[d] += t.row * w
        elif kind in ("row_wise", "grid"):
            dims = s.get("dims") or [t.dim]
            per_block = len(devices) // len(dims)
            assert per_block * len(dims) == len(devices) and sum(dims) == t.dim, f"{where}: grid of {s}"
            assert len(set(devices)) == len(devices), f"{where}: a device twice in {s}"
            rows = s["rows"]
            step = math.ceil(t.row / per_block)
            # equal blocks of ceil(rows / k), the last ones shorter, covering every row once
            assert len(rows) == per_block and sum(rows) == t.row and all(0 <= r <= step for r in rows), \
                f"{where}: row blocks {rows} of a {t.row}-row table"
            assert rows == sorted(rows, reverse=True)
            for j, w in enumerate(dims):
                for d, r in zip(devices[j * per_block:(j + 1) * per_block], rows):
                    memory[d] += r * w
        else:
            raise AssertionError(f"{where}: unknown sharding type {kind}")
    gib = [m * bpe / float(1 << 30) for m in memory]
    assert max(gib) <= topology.max_memory_gb * (1 + 1e-9), \
        f"{where}: a device holds {max(gib):.6f} GiB over the {topology.max_memory_gb:g} GiB cap"
    # what the plan says of itself agrees with the arithmetic above
    assert plan.device_memory_gb() == pytest.approx(gib, rel=1e-9, abs=1e-12)
    return gib


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A dataset, tiny untrained checkpoints of the learned methods, the registry's planners."""
    from autoshard.config import AutoShardConfig
    from autoshard.sharder import AutoShardModel
    from dreamshard.config import DreamShardConfig
    from dreamshard.sharder import DreamShardModel
    from neuroshard.checkpoints import save_bundle
    from shardcore.data.features import FeatureScaler

    from test_neuroshard_helpers import train_simulator

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("planners")
    tables = make_dataset(root / "ds", num_tables=40, batch_size=64, seed=11, dims=(4, 8, 16, 32, 64))
    scaler = FeatureScaler.fit(tables)
    ckpts = {"autoshard": root / "autoshard.pt", "dreamshard": root / "dreamshard.pt",
             "neuroshard": root / "neuroshard.pt"}
    AutoShardModel.new(AutoShardConfig(table_hidden=8, embed=8, lstm_hidden=8, cost_hidden=8), scaler) \
        .save(ckpts["autoshard"])
    DreamShardModel.new(DreamShardConfig(hidden=8, embed=8, head_hidden=8), scaler).save(ckpts["dreamshard"])
    sim = train_simulator(compute_samples=40, comm_samples=20, epochs=1)
    save_bundle(ckpts["neuroshard"], sim.compute, sim.fw_comm, sim.bw_comm, {"max_length": 2, "search_steps": 3})
    return str(root / "ds"), tables, ckpts


def planners_of(table, ckpts):
    """Every name of the registry to test: a learned method by its checkpoint, TorchRec's where installed."""
    try:
        import torchrec  # noqa: F401
        have_torchrec = True
    except Exception:  # noqa: BLE001 - a broken install is as good as none here
        have_torchrec = False
    out = []
    for name, entry in table.items():
        if entry.trained:
            out.append((name, str(ckpts[name])))
        elif name.startswith("torchrec") and not have_torchrec:
            continue
        else:
            out.append((name, name))
    return out


def test_every_planner_places_every_table_once_within_the_cap(world):
    data_dir, tables, ckpts = world
    table = algorithms.planners()
    assert set(LEARNED) <= {n for n, e in table.items() if e.trained}
    configs = {"shardkit": algorithms.config_class("shardkit")(work=300, kicks=0)}
    if algorithms.config_class("torchrec") is not None:   # TorchRec counts the weights against the cap, as the cap does
        configs["torchrec"] = algorithms.config_class("torchrec")(memory="weights")
    seen: dict[str, int] = {}
    split: set[str] = set()   # the planners that placed the task whose largest table fits no device
    for k, (task, topology) in enumerate(random_tasks(tables)):
        ctx = PlanningContext(topology, B, Landscape("emulated:h200", fit="full", data_dir=data_dir))
        for name, alg in planners_of(table, ckpts):
            sharder = algorithms.build(alg, ctx, configs)
            try:
                plan = sharder.shard(task, topology)
            except InfeasibleError:
                continue
            assert plan.topology == topology and list(plan.tables) == list(task), name
            check_plan(task, topology, plan, name)
            seen[name] = seen.get(name, 0) + 1
            if k == TASKS - 1:
                split.add(name)
    # the check ran on every planner (a greedy may find no room under a binding cap and say so); the task
    # whose largest table fits no device whole is placed only by planners that split tables (shardkit always,
    # TorchRec's and NeuroShard's where they find a split)
    for name, _ in planners_of(table, ckpts):
        assert seen.get(name, 0) >= TASKS // 2, (name, seen)
    assert seen["shardkit"] == TASKS
    whole_tables = {n for n, _ in planners_of(table, ckpts)} - {"shardkit", "torchrec", "torchrec-emu", "neuroshard"}
    assert "shardkit" in split and not split & whole_tables, split


def test_the_independent_check_catches_an_overfilled_device():
    """The check above is not a copy of the plan's own arithmetic: a plan over the cap, a dim not tiled and
    a table placed twice are each caught."""
    from shardcore.plan import Plan, column_wise, table_wise

    tables = [TableConfig(0, 1 << 20, 16, 1.0), TableConfig(1, 1 << 20, 16, 1.0)]   # 1/32 GiB each, fp16
    tight = Topology(2, 1 / 32)
    check_plan(tables, tight, Plan.table_wise(tables, (0, 1), tight), "two devices")
    with pytest.raises(AssertionError, match="over the"):
        check_plan(tables, tight, Plan.table_wise(tables, (0, 0), tight), "one device")

    class Twice:   # a plan whose JSON form names a table on two devices as table-wise
        def shardings_json(self):
            return [{"type": "table_wise", "devices": [0, 1]}, table_wise(1).to_json()]
    with pytest.raises(AssertionError):
        check_plan(tables, tight, Twice(), "twice")

    class Gap:
        def shardings_json(self):
            return [column_wise([(0, 4), (1, 8)]).to_json(), table_wise(1).to_json()]
    with pytest.raises(AssertionError, match="column blocks"):
        check_plan(tables, tight, Gap(), "gap")
