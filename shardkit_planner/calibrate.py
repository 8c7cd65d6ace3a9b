"""shardkit calibrating itself on a measured oracle: when no fitted cost model exists for this machine and
the measurement cache holds too little to fit one, measure what the fit needs, through the oracle (and so
through its cache, where the next run finds it), within a time budget, never on the tables to avoid.

What is measured: table-wise plans of the oracle's device count, at several sizes (:func:`plan_sizes`: from
1 table per device to as many as the largest task puts on a device, so that the exchange is fitted over the
sizes it will price rather than extrapolated to them), drawn from the tables outside the tasks to avoid
(each plan gives the compute of every device's shard and, where the oracle measures the exchange, one
exchange per device at that size), then single
shards shaped like the plans' ones (1 to twice the tasks' tables per device, about a third of the tables
as column pieces of half or a quarter of their dim) until the cache holds ``TARGET_SHARDS`` usable ones
or the budget is spent. A cache that already holds ``ENOUGH_SHARDS`` usable shards and, where the oracle
measures the exchange, ``ENOUGH_PLANS`` plans of its device count outside the tasks, the largest of them
holding at least half the largest calibration size per device, is fitted without measuring; one that
lacks only the plans gets the plans (the exchange is fitted per device count: another count's plans do
not stand in, and small plans alone would leave the tasks' exchanges to extrapolation). The model is then fitted as
:func:`shardkit_planner.costmodel.fit_cost_model` fits it from any cache; where the oracle models the
exchange (more plan devices than measuring devices) the fit takes the oracle's own exchange model.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from shardcore.oracles.cache import measurement_store
from shardcore.oracles.commmodel import CommModel
from shardcore.errors import ShardError

from .costmodel import CostModel, fit_cost_model

MIN_SHARDS = 24        # shards the fit gets at least (fit_cost_model's floor is 20)
TARGET_SHARDS = 160    # shards calibration measures up to, within its budget (the CPU family has 21 features)
ENOUGH_SHARDS = TARGET_SHARDS // 2   # a cache holding this many usable shards is fitted without measuring
PLAN_SIZES = 6         # calibration plans, at sizes from 1 table per device to the largest task's (plan_sizes)
ENOUGH_PLANS = PLAN_SIZES // 2   # plans of the oracle's device count outside the tasks that a cache needs
SPLIT_SHARE = 0.3      # share of a calibration shard's tables given as a column piece (dim / 2 or / 4)


def excluded_tables(task_files: Sequence[str] | None, num_tables: int) -> set[int]:
    """The tables of ``task_files`` (files that do not exist are skipped)."""
    return _task_tables(task_files, num_tables)[0]


def plan_sizes(ndevices: int, pool: int, largest_task: int | None) -> list[int]:
    """Tables per device of the calibration plans: ``PLAN_SIZES`` sizes spread geometrically from 1 to
    as many as the largest task puts on a device (at least ``PLAN_SIZES``; 1..``PLAN_SIZES`` without
    tasks), none needing more than the ``pool`` tables there are to draw from. Why up to the tasks' size:
    with plans of 1..6 tables only, a CPU's 4-device tasks' exchanges carried 1-7 MB a device where the
    calibration plans reached 1.2 MB, and the fitted latency and bandwidth, extrapolated, moved 2x between
    two calibrations."""
    top = max(PLAN_SIZES, math.ceil(largest_task / ndevices)) if largest_task else PLAN_SIZES
    top = max(1, min(top, pool // max(1, ndevices)))
    if top <= PLAN_SIZES:
        return list(range(1, top + 1))
    return sorted({int(round(x)) for x in np.geomspace(1, top, PLAN_SIZES)})


def _task_tables(task_files: Sequence[str] | None, num_tables: int) -> tuple[set[int], list[int]]:
    """The tables of ``task_files`` and the size of every task."""
    from shardcore.tasks import load_tasks

    out: set[int] = set()
    sizes: list[int] = []
    for f in task_files or ():
        if f and Path(f).is_file():
            for task in load_tasks(f, num_tables=num_tables):
                out.update(task.table_ids)
                sizes.append(len(task))
    return out, sizes


def _usable(oracle, dataset, exclude) -> int:
    from .costmodel import usable_shards

    ctx = oracle.context
    return len(usable_shards(measurement_store(oracle), dataset, int(ctx.batch_size), hardware=ctx.hardware,
                             precision=ctx.precision, optimizer=ctx.optimizer, exclude_tables=exclude)[0])


def _plans(oracle, dataset, exclude) -> tuple[int, int]:
    """Measured plans of the oracle's device count in its cache that the exchange fit may use, and the
    most tables any of their devices holds."""
    from .costmodel import exchange_plans

    ctx, n = oracle.context, int(oracle.ndevices)
    sizes = [max(map(len, pieces)) for _p, pieces in
             exchange_plans(measurement_store(oracle), dataset, int(ctx.batch_size), hardware=ctx.hardware,
                            precision=ctx.precision, optimizer=ctx.optimizer, exclude_tables=exclude)
             if len(pieces) == n]
    return len(sizes), max(sizes, default=0)


def _fit(oracle, dataset, data_dir, exclude) -> CostModel:
    ctx = oracle.context
    fallback = None if getattr(oracle, "comm_measured", False) else (getattr(oracle, "comm_model", None) or CommModel())
    return fit_cost_model(measurement_store(oracle), dataset, int(ctx.batch_size), hardware=ctx.hardware, precision=ctx.precision,
                          optimizer=ctx.optimizer, data_dir=data_dir, exclude_tables=exclude,
                          comm_fallback=fallback, min_shards=MIN_SHARDS)


def check_calibration(oracle, data_dir, exclude_task_files: Sequence[str] | None):
    """What calibration needs, checked before the oracle's workers start (nothing is measured): the
    cache, and enough tables outside the tasks for one per device unless the cache already holds enough
    usable shards. Returns (dataset, excluded tables, the tasks' sizes, usable shards stored)."""
    from shardcore.dataset import load_dataset

    if measurement_store(oracle) is None:
        raise ShardError("shardkit calibrates through the measurement cache, and this oracle has none (--no-cache?): "
                         "fit a model with tools/fit_shardkit_model.py and give it with --shardkit-model")
    dataset = load_dataset(data_dir)   # memory-mapped; the cache keys its measurements by this digest
    exclude, task_sizes = _task_tables(exclude_task_files, dataset.num_tables)
    have = _usable(oracle, dataset, exclude)
    outside, n = dataset.num_tables - len(exclude & set(range(dataset.num_tables))), int(oracle.ndevices)
    if have < ENOUGH_SHARDS and outside < n:
        raise ShardError(f"shardkit cannot calibrate: only {outside} tables of {data_dir} lie outside the tasks it "
                         f"plans ({', '.join(map(str, exclude_task_files or []))}), fewer than the {n} devices; "
                         "generate tasks over part of the tables (tools/gen_tasks.py) or give --shardkit-model")
    return dataset, exclude, task_sizes, have


def calibrated_model(oracle, data_dir, exclude_task_files: Sequence[str] | None, budget_s: float,
                     seed: int = 0, progress: bool = True) -> CostModel:
    """The measured landscape's model of ``oracle``'s machine: fitted on its cache when that holds enough,
    else after measuring plans and shards of the tables outside ``exclude_task_files`` for at most
    ``budget_s`` seconds (a one-line :class:`ShardError` when that is not enough)."""
    from tqdm import tqdm

    dataset, exclude, task_sizes, have = check_calibration(oracle, data_dir, exclude_task_files)
    pool = [i for i in range(dataset.num_tables) if i not in exclude]
    n = int(oracle.ndevices)
    sizes = plan_sizes(n, len(pool), max(task_sizes, default=None))
    enough_plans = True   # an oracle that models the exchange needs no plans for it
    if getattr(oracle, "comm_measured", False):
        plans, most = _plans(oracle, dataset, exclude)
        enough_plans = plans >= ENOUGH_PLANS and most >= (sizes[-1] + 1) // 2
    if have >= ENOUGH_SHARDS and enough_plans:   # calibrated before (or measured by other runs)
        return _fit(oracle, dataset, data_dir, exclude)
    rng = np.random.default_rng(seed)
    tables = dataset.tables
    # shards shaped like the plans' ones: up to twice the tasks' tables per device, some column pieces
    task_size = float(np.mean(task_sizes)) if task_sizes else None
    kmax = max(4, min(len(pool), int(round(2 * task_size / n)) if task_size else 4))
    t0 = time.perf_counter()
    if enough_plans:
        sizes = []
    measured = 0
    seen: set = set()
    want = TARGET_SHARDS - have if have < ENOUGH_SHARDS else 0

    def piece(i: int):
        t = tables[int(i)]
        for s in (4, 2):
            if rng.random() < SPLIT_SHARE / 2 and t.dim % s == 0 and t.dim // s >= 4:
                return t.with_dim(t.dim // s)
        return t

    with tqdm(total=len(sizes) + want, desc="shardkit calibrating on this machine", unit="measurement",
              disable=None if progress else True, leave=False) as bar:
        for k in sizes:                       # plans at several sizes: the exchange, and n shards each
            ids = rng.choice(pool, size=k * n, replace=False)
            seen.update(frozenset(int(i) for i in ids[d * k:(d + 1) * k]) for d in range(n))
            oracle.evaluate([[tables[int(i)] for i in ids[d * k:(d + 1) * k]] for d in range(n)])
            measured += 1
            bar.update(1)
            if time.perf_counter() - t0 > budget_s:
                break
        tries = 0
        while len(seen) < want and tries < 50 * want and time.perf_counter() - t0 <= budget_s:
            tries += 1   # single shards up to the target, each one not measured before
            ids = rng.choice(pool, size=int(rng.integers(1, kmax + 1)), replace=False)
            shard = [piece(i) for i in ids]
            key = frozenset((t.index, t.dim) for t in shard)
            if key in seen:
                continue
            seen.add(key)
            oracle.measure_devices([shard])
            measured += 1
            bar.update(1)
    try:
        model = _fit(oracle, dataset, data_dir, exclude)
    except ShardError as exc:
        raise ShardError(f"shardkit's calibration ran {time.perf_counter() - t0:.0f} s ({measured} measurements, "
                         f"budget {budget_s:g} s) and still cannot fit ({exc}); raise --shardkit-calibrate") from None
    print(f"shardkit calibrated on this machine in {time.perf_counter() - t0:.1f} s: {measured} measurements of "
          f"tables outside the evaluated tasks (stored in the cache); {model.source}", flush=True)
    return model
