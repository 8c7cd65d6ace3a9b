"""The sharding plan: a device per table, equivalently a list of tables per device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .errors import ShardError
from .tables import TableConfig


@dataclass(frozen=True)
class Plan:
    """``allocation[i] = d``: the task's i-th table goes to device ``d`` (0 <= d < ndevices)."""

    allocation: tuple[int, ...]
    ndevices: int

    def __post_init__(self):
        if self.ndevices < 1:
            raise ShardError(f"a plan needs at least one device, got {self.ndevices}")
        bad = [d for d in self.allocation if not 0 <= d < self.ndevices]
        if bad:
            raise ShardError(f"plan puts a table on device {bad[0]}, but there are {self.ndevices} devices")

    @classmethod
    def from_shards(cls, shards: Sequence[Sequence[int]], num_tables: int | None = None) -> "Plan":
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
        return cls(tuple(alloc), len(shards))

    @property
    def shards(self) -> list[list[int]]:
        """``shards[d]``: positions of the tables on device ``d``, in task order."""
        out: list[list[int]] = [[] for _ in range(self.ndevices)]
        for i, d in enumerate(self.allocation):
            out[d].append(i)
        return out

    def shard_tables(self, tables: Sequence[TableConfig]) -> list[list[TableConfig]]:
        self._check_len(tables)
        return [[tables[i] for i in shard] for shard in self.shards]

    def device_memory_gb(self, tables: Sequence[TableConfig], precision: str = "fp16") -> list[float]:
        self._check_len(tables)
        mem = [0.0] * self.ndevices
        for t, d in zip(tables, self.allocation):
            mem[d] += t.memory_gb(precision)
        return mem

    def is_feasible(self, tables: Sequence[TableConfig], max_memory_gb: float, precision: str = "fp16") -> bool:
        return max(self.device_memory_gb(tables, precision)) <= max_memory_gb + 1e-12

    def _check_len(self, tables: Sequence[TableConfig]) -> None:
        if len(tables) != len(self.allocation):
            raise ShardError(f"plan has {len(self.allocation)} tables but the task has {len(tables)}")
