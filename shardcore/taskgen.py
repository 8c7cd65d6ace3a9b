"""Task generation: disjoint train/test table pools, DreamShard-style and NeuroShard-style tasks.

The dataset's tables are shuffled once (seeded) and split into two disjoint pools, so test tasks
contain only tables never seen in training. Each task draws its tables without replacement from its
pool. NeuroShard style also draws one dim per table from a list (``--dims`` or ``--max-dim``
halving down to 4) and keeps only tasks whose total weight memory fits ``ndevices x max_mem``
(each table also fitting one device), so the cap is tight for some tasks and loose for others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .errors import ShardError
from .tables import GB, TableConfig, bytes_per_element
from .tasks import Task

MAX_TRIES_PER_TASK = 10_000


@dataclass(frozen=True)
class TaskSpec:
    t_min: int
    t_max: int
    num_train: int = 50
    num_test: int = 50
    train_fraction: float = 0.5
    seed: int = 0
    dims: tuple[int, ...] | None = None  # NeuroShard style when set
    max_mem_gb: float | None = None
    ndevices: int = 4
    precision: str = "fp16"


def halving_dims(max_dim: int, min_dim: int = 4) -> tuple[int, ...]:
    """``max_dim, max_dim/2, ... , 4`` (e.g. 128 → 128,64,32,16,8,4)."""
    if max_dim < min_dim or max_dim % min_dim:
        raise ShardError(f"--max-dim must be a multiple of {min_dim} and at least {min_dim}, got {max_dim}")
    dims = []
    d = max_dim
    while d >= min_dim and d % min_dim == 0:
        dims.append(d)
        d //= 2
    return tuple(dims)


def split_pools(num_tables: int, train_fraction: float, rng: np.random.Generator) -> tuple[list[int], list[int]]:
    perm = rng.permutation(num_tables).tolist()
    n_train = int(round(num_tables * train_fraction))
    return sorted(perm[:n_train]), sorted(perm[n_train:])


def _draw_tasks(pool: Sequence[int], tables: Sequence[TableConfig], n: int, spec: TaskSpec,
                rng: np.random.Generator, which: str) -> list[Task]:
    if n == 0:
        return []
    if spec.t_max > len(pool):
        raise ShardError(f"{which} pool has {len(pool)} tables, fewer than T={spec.t_max}: "
                         "lower --T / --T-range or use a larger dataset")
    bpe = bytes_per_element(spec.precision)
    tasks = []
    tries = 0
    while len(tasks) < n:
        tries += 1
        if tries > MAX_TRIES_PER_TASK * n:
            raise ShardError(f"could not draw {n} {which} tasks under --max-mem {spec.max_mem_gb} GB x "
                             f"{spec.ndevices} devices: raise --max-mem or lower --T / --max-dim")
        t = int(rng.integers(spec.t_min, spec.t_max + 1))
        ids = sorted(int(i) for i in rng.choice(pool, size=t, replace=False))
        if spec.dims is None:
            tasks.append(Task(tuple(ids)))
            continue
        dims = tuple(int(d) for d in rng.choice(spec.dims, size=t))
        if spec.max_mem_gb is not None:
            mems = [tables[i].row * d * bpe / GB for i, d in zip(ids, dims)]
            if max(mems) > spec.max_mem_gb or sum(mems) > spec.max_mem_gb * spec.ndevices:
                continue
        tasks.append(Task(tuple(ids), dims))
    return tasks


def generate_tasks(tables: Sequence[TableConfig], spec: TaskSpec) -> tuple[list[Task], list[Task]]:
    """Train and test tasks over disjoint table pools, reproducible with ``spec.seed``."""
    if not 1 <= spec.t_min <= spec.t_max:
        raise ShardError(f"table counts must satisfy 1 <= min <= max, got {spec.t_min},{spec.t_max}")
    if not 0.0 < spec.train_fraction < 1.0:
        raise ShardError(f"--train-fraction must be between 0 and 1, got {spec.train_fraction}")
    rng = np.random.default_rng(spec.seed)
    train_pool, test_pool = split_pools(len(tables), spec.train_fraction, rng)
    train = _draw_tasks(train_pool, tables, spec.num_train, spec, rng, "train")
    test = _draw_tasks(test_pool, tables, spec.num_test, spec, rng, "test")
    return train, test
