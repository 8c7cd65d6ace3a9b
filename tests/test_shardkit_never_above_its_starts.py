"""shardkit's search never returns a plan its own model prices above any of its starts: on many random tasks
(1 to 8 devices, binding caps, fp16 and fp32) and budgets down to a single unit of work, the plan kept is at
most the cheapest start under the task's model (the point objective: the slowest device), and within the cap.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shardcore.errors import InfeasibleError
from shardcore.topology import Topology
from shardkit_planner.costmodel import emulated_model
from shardkit_planner.search import State
from shardkit_planner.sharder import ShardkitSharder
from shardkit_planner.starts import PlanningTask

from helpers import make_dataset

B = 4096
TRIALS = 24
WORK = (1, 5, 20, 100, 500)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("starts") / "ds"
    tables = make_dataset(path, num_tables=36, batch_size=64, seed=21, dims=(4, 8, 16, 32, 64, 128))
    return tables, emulated_model(str(path), B)


def random_task(rng, tables):
    n = int(rng.integers(1, 9))
    precision = str(rng.choice(["fp16", "fp32"]))
    task = [tables[i] for i in sorted(rng.choice(len(tables), size=int(rng.integers(3, 15)), replace=False))]
    mem = [t.memory_gb(precision) for t in task]
    cap = max(max(mem) * float(rng.uniform(0.7, 1.1)), sum(mem) / n * float(rng.uniform(1.02, 1.4)))
    return task, Topology(n, cap, precision)


def test_the_plan_kept_is_never_above_any_start_under_the_tasks_model(world):
    tables, model = world
    rng = np.random.default_rng(5)
    planned = 0
    for trial in range(TRIALS):
        task, topology = random_task(rng, tables)
        work = WORK[trial % len(WORK)]
        sk = ShardkitSharder(name="shardkit", model=model, work=work, robust=False, seed=trial)
        try:
            plan = sk.shard(task, topology)
        except InfeasibleError:
            continue
        planned += 1
        task_model = sk.for_precision(sk.task_model(task, topology), topology.precision)
        starts = sk.start_plans(PlanningTask(task, topology, task_model, sk.types))
        kept = State.of(task_model, plan).cost
        cheapest = min(State.of(task_model, p).cost for _, p in starts)
        assert kept <= cheapest * (1 + 1e-12), (trial, work, kept, cheapest)
        assert plan.feasible and plan.topology == topology
    assert planned >= TRIALS * 3 // 4
