"""Learning happens: DreamShard's trained policy (a fixed seed; its training is synchronous) and
AutoShard's (judged over several seeds, one actor each: its actor-learner is asynchronous) place the
tables of their training tasks better than random placement, on a cheap additive oracle.

The oracle stands in for the hardware as the cost oracle both trainers take (``tests.helpers.FnOracle``): a table
costs ``dim x pooling factor / 100`` ms (40 % forward, 60 % backward compute, no communication), a
device the sum of its tables, a plan its most loaded device. Random placement is the mean over 200
uniform placements; longest-processing-time-first (LPT) is printed beside it, for scale.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from autoshard.config import AutoShardConfig
from autoshard.sharder import AutoShardModel
from autoshard.trainer import AutoShardTrainer
from dreamshard.config import DreamShardConfig
from dreamshard.trainer import DreamShardTrainer
from helpers import FnOracle
from shardcore.tables import TableConfig
from shardcore.tasks import Task
from shardcore.topology import Topology

NDEVICES, CAP_GB = 4, 100.0   # every placement fits: the test is about balance, not memory


def table_cost(t: TableConfig) -> float:
    return t.dim * t.pooling_factor / 100.0


def device_costs(shards) -> list[list[float]]:
    """Per device ``[fw compute, fw comm, bw comm, bw compute]`` (ms) under the additive oracle."""
    return [[0.4 * sum(map(table_cost, s)), 0.0, 0.0, 0.6 * sum(map(table_cost, s))] for s in shards]


def plan_cost(tables, allocation) -> float:
    loads = [0.0] * NDEVICES
    for t, d in zip(tables, allocation):
        loads[int(d)] += table_cost(t)
    return max(loads)


@pytest.fixture(scope="module")
def problem():
    """40 tables of diverse dims and pooling factors; 8 training tasks of 12 tables each."""
    rng = np.random.default_rng(0)
    tables = [TableConfig(i, int(10 ** rng.uniform(3, 6)), int(rng.choice([16, 32, 64, 128])),
                          float(rng.uniform(2, 30))) for i in range(40)]
    pick = random.Random(1)
    tasks = [Task(tuple(sorted(pick.sample(range(40), 12)))) for _ in range(8)]
    task_tables = [t.tables(tables) for t in tasks]
    g = random.Random(2)
    rand = float(np.mean([np.mean([plan_cost(ts, [g.randrange(NDEVICES) for _ in ts]) for _ in range(200)])
                          for ts in task_tables]))
    lpt = []
    for ts in task_tables:
        loads = [0.0] * NDEVICES
        for t in sorted(ts, key=table_cost, reverse=True):
            loads[loads.index(min(loads))] += table_cost(t)
        lpt.append(max(loads))
    return tables, tasks, task_tables, rand, float(np.mean(lpt))


def check_learned(name, untrained, trained, rand, lpt):
    print(f"{name}: mean plan cost over the training tasks: untrained {untrained:.1f}, trained {trained:.1f}, "
          f"random {rand:.1f}, LPT {lpt:.1f} (oracle ms)")
    assert trained < 0.85 * rand, (trained, rand)
    assert trained < untrained, (trained, untrained)


def test_dreamshard_policy_beats_random(problem, tmp_path):
    tables, tasks, task_tables, rand, lpt = problem
    torch.set_num_threads(1)
    cfg = DreamShardConfig(hidden=32, embed=16, head_hidden=32, num_iterations=3, bench_steps=8,
                           bench_training_steps=100, rl_num_batches=15, rl_batch_size=8, seed=0)

    trainer = DreamShardTrainer(cfg, tables, tasks, Topology(NDEVICES, CAP_GB), FnOracle(device_costs), tmp_path,
                                log=lambda _: None)

    def greedy_cost():
        return float(np.mean([plan_cost(ts, trainer.model.place(ts, Topology(NDEVICES, CAP_GB))[0][0]) for ts in task_tables]))

    untrained = greedy_cost()
    trainer.run(cfg.num_iterations)
    check_learned("DreamShard", untrained, greedy_cost(), rand, lpt)


AUTOSHARD_SEEDS = (0, 1, 2)
AUTOSHARD_STEPS = 2400   # 1200 left the mean of the seeds at 51.2-51.5 ms against the 51.5 bound (a clean clone
                         # failed by 0.01 ms); 2400 gives 42-49 ms, for +3 s


def test_autoshard_policy_beats_random_over_seeds(problem, tmp_path):
    """One actor per run and fixed seeds; AutoShard's actor-learner is asynchronous even so (the actor rolls
    out with whichever weights the learner shared last), so one run is not reproducible to the bit.
    Learning is judged as CleanRL's users judge it, over several seeds: the mean over the seeds must beat
    random placement by the margin and the untrained policies, and a majority of the seeds must beat
    random and their own untrained policy."""
    tables, tasks, task_tables, rand, lpt = problem
    torch.set_num_threads(1)

    def mean_cost(model) -> float:
        return float(np.mean([plan_cost(ts, model.place(ts, Topology(NDEVICES, CAP_GB))[0]) for ts in task_tables]))

    runs = []
    for seed in AUTOSHARD_SEEDS:
        cfg = AutoShardConfig(unroll_length=12, batch_size=4, replay_ratio=4, learning_rate=3e-3, seed=seed,
                              decode_samples=0)   # the policy's own (argmax) plans are judged
        trainer = AutoShardTrainer(cfg, tables, tasks, Topology(NDEVICES, CAP_GB), FnOracle(device_costs),
                                   tmp_path / f"seed{seed}", log=lambda _: None)
        untrained = mean_cost(trainer.model)
        summary = trainer.run(AUTOSHARD_STEPS, num_actors=1)
        assert summary["steps"] >= AUTOSHARD_STEPS and not summary["interrupted"]
        runs.append((untrained, mean_cost(AutoShardModel.load(summary["checkpoint"]))))
        print(f"AutoShard seed {seed}: untrained {runs[-1][0]:.1f}, trained {runs[-1][1]:.1f}")
    untrained, trained = (float(np.mean(v)) for v in zip(*runs))
    check_learned(f"AutoShard (mean of {len(runs)} seeds)", untrained, trained, rand, lpt)
    # each seed on its own: below random and below its untrained policy (the 15% margin is the mean's:
    # single seeds land at 0.70-0.86 x random, so a per-seed margin fails one run in a few)
    learned = [t < rand and t < u for u, t in runs]
    assert sum(learned) * 2 > len(runs), (runs, rand)
