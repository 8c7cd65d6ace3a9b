"""Task generation: disjoint train/test table pools, DreamShard-style and NeuroShard-style tasks.

The dataset's tables are shuffled once (seeded) and split into two disjoint pools, so test tasks
contain only tables never seen in training. Each task draws its tables without replacement from its
pool. NeuroShard style also draws one dim per table from a list (``--dims`` or ``--max-dim``
halving down to 4) and keeps only tasks whose total weight memory fits ``ndevices x max_mem``
(each table also fitting one device), so the cap is tight for some tasks and loose for others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from shardcore.errors import ShardError
from shardcore.tables import GB, TableConfig, bytes_per_element
from shardcore.tasks import Task

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
    total_mem_gb: float | None = None    # NeuroShard's --max_mem: the whole task's weights fit this
    train_pool: tuple[int, ...] | None = None   # the training tables, given (train_fraction unused); the test pool the rest


def _fits(tables: Sequence[TableConfig], ids: Sequence[int], dims: Sequence[int], spec: TaskSpec) -> bool:
    bpe = bytes_per_element(spec.precision)
    mems = [tables[i].row * d * bpe / GB for i, d in zip(ids, dims)]
    if spec.max_mem_gb is not None and (max(mems) > spec.max_mem_gb or sum(mems) > spec.max_mem_gb * spec.ndevices):
        return False
    return spec.total_mem_gb is None or sum(mems) <= spec.total_mem_gb


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

    def draw() -> Task | None:
        t = int(rng.integers(spec.t_min, spec.t_max + 1))
        ids = tuple(sorted(int(i) for i in rng.choice(pool, size=t, replace=False)))
        if spec.dims is None:
            return Task(ids)
        dims = tuple(int(d) for d in rng.choice(spec.dims, size=t))
        return Task(ids, dims) if _fits(tables, ids, dims, spec) else None

    return _sample(n, draw, spec, f"{which} tasks", "--T / --max-dim")


def _sample(n: int, draw: Callable[[], "Task | None"], spec: TaskSpec, what: str, knobs: str) -> list[Task]:
    """``n`` tasks from ``draw`` (None: a draw over the memory cap, rejected), or a one-line error
    after :data:`MAX_TRIES_PER_TASK` draws per task."""
    tasks: list[Task] = []
    for _ in range(MAX_TRIES_PER_TASK * n):
        if len(tasks) == n:
            break
        task = draw()
        if task is not None:
            tasks.append(task)
    if len(tasks) < n:
        raise ShardError(f"could not draw {n} {what} under the memory cap ({_cap_text(spec)}): "
                         f"raise it or lower {knobs}")
    return tasks


def _cap_text(spec: TaskSpec) -> str:
    caps = []
    if spec.max_mem_gb is not None:
        caps.append(f"--max-mem {spec.max_mem_gb:g} GiB x {spec.ndevices} devices")
    if spec.total_mem_gb is not None:
        caps.append(f"--max_mem {spec.total_mem_gb:g} GB per task")
    return ", ".join(caps) + f", {spec.precision}"


def generate_single_pool_tasks(tables: Sequence[TableConfig], num_tasks: int, spec: TaskSpec) -> list[Task]:
    """NeuroShard's task file (its ``tools/gen_tasks.py --data_size N``): ``num_tasks`` tasks over
    *all* tables, table ids drawn with replacement (a table may appear twice in a task: two tables),
    a dim per table from ``spec.dims``; a task is kept when it fits the caps of ``spec``."""
    if not 1 <= spec.t_min <= spec.t_max:
        raise ShardError(f"table counts must satisfy 1 <= min <= max, got {spec.t_min},{spec.t_max}")
    if not spec.dims:
        raise ShardError("single-pool tasks with a dim per table need dims (--max_dim or --dims)")
    rng = np.random.default_rng(spec.seed)

    def draw() -> Task | None:
        t = int(rng.integers(spec.t_min, spec.t_max + 1))
        ids = tuple(int(i) for i in rng.integers(0, len(tables), size=t))
        dims = tuple(int(d) for d in rng.choice(spec.dims, size=t))
        return Task(ids, dims) if _fits(tables, ids, dims, spec) else None

    return _sample(num_tasks, draw, spec, "tasks", "--T_range / --max_dim")


def generate_tasks(tables: Sequence[TableConfig], spec: TaskSpec) -> tuple[list[Task], list[Task]]:
    """Train and test tasks over disjoint table pools, reproducible with ``spec.seed``."""
    if not 1 <= spec.t_min <= spec.t_max:
        raise ShardError(f"table counts must satisfy 1 <= min <= max, got {spec.t_min},{spec.t_max}")
    rng = np.random.default_rng(spec.seed)
    if spec.train_pool is not None:
        given = set(int(i) for i in spec.train_pool)
        if not given <= set(range(len(tables))):
            raise ShardError(f"the training pool names tables outside 0..{len(tables) - 1}")
        train_pool, test_pool = sorted(given), [i for i in range(len(tables)) if i not in given]
    else:
        if not 0.0 < spec.train_fraction < 1.0:
            raise ShardError(f"--train-fraction must be between 0 and 1, got {spec.train_fraction}")
        train_pool, test_pool = split_pools(len(tables), spec.train_fraction, rng)
    train = _draw_tasks(train_pool, tables, spec.num_train, spec, rng, "train")
    test = _draw_tasks(test_pool, tables, spec.num_test, spec, rng, "test")
    return train, test


def generate_transfer_tasks(num_tables: int, t_min: int, t_max: int, num_train: int = 1, num_test: int = 1,
                             transfer: bool = False, transfer_ratio: float = 1.0, test_as_train: bool = False,
                             seed: int = 0) -> tuple[list[Task], list[Task]]:
    """Tasks as AutoShard's ``gen_dlrm_data.py`` wrote them next to the dataset. Without ``transfer``
    train and test tasks draw from *all* tables (test tables are seen in training). With ``transfer``
    training draws from the first half of the tables and testing from a mix: the first
    ``(1 - transfer_ratio)`` share of the first half plus the first ``transfer_ratio`` share of the
    second half (1.0: only unseen tables). ``test_as_train`` makes the test task the (single) training task.
    Ids within a task are distinct; ``t_min..t_max`` is inclusive."""
    if not 1 <= t_min <= t_max:
        raise ShardError(f"table counts must satisfy 1 <= min <= max, got {t_min},{t_max}")
    if not 0.0 <= transfer_ratio <= 1.0:
        raise ShardError(f"--transfer-ratio must be in [0, 1], got {transfer_ratio}")
    if num_train < 0 or num_test < 0:
        raise ShardError("--num-train and --num-test must be >= 0")
    if test_as_train and (num_train != 1 or num_test != 1):
        raise ShardError("--test-as-train takes one training and one test task (--num-train 1 --num-test 1)")
    half = num_tables // 2
    everything = list(range(num_tables))
    train_pool = list(range(half)) if transfer else everything
    test_pool = (list(range(int(half * (1.0 - transfer_ratio))))
                 + list(range(half, half + int((num_tables - half) * transfer_ratio)))) if transfer else everything
    rng = np.random.default_rng(seed)

    def draw(pool: Sequence[int], n: int, which: str) -> list[Task]:
        out = []
        for _ in range(n):
            t = int(rng.integers(t_min, t_max + 1))
            if t > len(pool):
                raise ShardError(f"the {which} tables number {len(pool)}, fewer than the {t} a task needs: "
                                 "lower --T-range" + (" or change --transfer-ratio" if transfer else ""))
            out.append(Task(tuple(int(i) for i in rng.choice(pool, size=t, replace=False))))
        return out

    train = draw(train_pool, num_train, "training")
    test = list(train) if test_as_train else draw(test_pool, num_test, "test")
    return train, test
