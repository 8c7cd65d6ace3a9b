"""The sharding plan: a device per table, equivalently a list of tables per device.

A plan may split tables column-wise first (NeuroShard): ``splits[i] = k`` cuts the task's table
``i`` into ``k`` column shards of ``dim / k`` each (same rows, same lookups). The allocation then
covers the *expanded* table list, in which table ``i`` appears as ``k`` consecutive shards
(:meth:`Plan.expand`). Without ``splits`` every table is whole and the allocation is per table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .errors import ShardError
from .tables import TableConfig


def split_tables(tables: Sequence[TableConfig], splits: Sequence[int] | None) -> list[TableConfig]:
    """The expanded table list: table ``i`` becomes ``splits[i]`` column shards of ``dim / splits[i]``."""
    if splits is None:
        return list(tables)
    if len(splits) != len(tables):
        raise ShardError(f"plan splits {len(splits)} tables but the task has {len(tables)}")
    out = []
    for t, k in zip(tables, splits):
        if k < 1 or t.dim % k:
            raise ShardError(f"table {t.index} (dim {t.dim}) cannot be split into {k} column shards")
        out.extend([t.with_dim(t.dim // k)] * k)
    return out


@dataclass(frozen=True)
class Plan:
    """``allocation[i] = d``: the (expanded) task's i-th table goes to device ``d``."""

    allocation: tuple[int, ...]
    ndevices: int
    splits: tuple[int, ...] | None = None   # column shards per task table; None: no table is split

    def __post_init__(self):
        if self.ndevices < 1:
            raise ShardError(f"a plan needs at least one device, got {self.ndevices}")
        bad = [d for d in self.allocation if not 0 <= d < self.ndevices]
        if bad:
            raise ShardError(f"plan puts a table on device {bad[0]}, but there are {self.ndevices} devices")
        if self.splits is not None and sum(self.splits) != len(self.allocation):
            raise ShardError(f"plan splits tables into {sum(self.splits)} shards but allocates {len(self.allocation)}")

    @classmethod
    def from_shards(cls, shards: Sequence[Sequence[int]], num_tables: int | None = None,
                    splits: Sequence[int] | None = None) -> "Plan":
        """Build from ``shards[d] = [table positions on device d]``; every table exactly once."""
        n = sum(len(s) for s in shards) if num_tables is None else num_tables
        alloc = [-1] * n
        for d, shard in enumerate(shards):
            for i in shard:
                if not 0 <= i < n or alloc[i] != -1:
                    raise ShardError(f"shards must name each of tables 0..{n - 1} exactly once (bad: {i})")
                alloc[i] = d
        if -1 in alloc:
            raise ShardError(f"table {alloc.index(-1)} is on no device")
        return cls(tuple(alloc), len(shards), tuple(splits) if splits is not None else None)

    @property
    def shards(self) -> list[list[int]]:
        """``shards[d]``: positions (in the expanded table list) of the tables on device ``d``."""
        out: list[list[int]] = [[] for _ in range(self.ndevices)]
        for i, d in enumerate(self.allocation):
            out[d].append(i)
        return out

    def expand(self, tables: Sequence[TableConfig]) -> list[TableConfig]:
        """The tables the allocation refers to: ``tables`` with the plan's column splits applied."""
        expanded = split_tables(tables, self.splits)
        if len(expanded) != len(self.allocation):
            raise ShardError(f"plan has {len(self.allocation)} tables but the task has {len(expanded)}")
        return expanded

    def shard_tables(self, tables: Sequence[TableConfig]) -> list[list[TableConfig]]:
        expanded = self.expand(tables)
        return [[expanded[i] for i in shard] for shard in self.shards]

    def device_memory_gb(self, tables: Sequence[TableConfig], precision: str = "fp16") -> list[float]:
        mem = [0.0] * self.ndevices
        for t, d in zip(self.expand(tables), self.allocation):
            mem[d] += t.memory_gb(precision)
        return mem

    def is_feasible(self, tables: Sequence[TableConfig], max_memory_gb: float, precision: str = "fp16") -> bool:
        return max(self.device_memory_gb(tables, precision)) <= max_memory_gb + 1e-12
