"""Where a plan runs: its devices, their hosts, the memory cap and the weights' precision -- and the one
check of a device's memory against the cap.

A :class:`Topology` travels as one object from the command line through
:func:`shardcore.evaluation.compare.evaluate` into every planner and each of its stages; nothing
unpacks it into loose arguments to pack it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from shardcore.argtypes import MAX_DEVICES
from shardcore.errors import InfeasibleError, ShardError
from shardcore.tables import PRECISION_BYTES, TableConfig

#: ``--max-memory``'s default: GiB of embedding weights per device
DEFAULT_MAX_MEMORY_GB = 5.0
#: the slack of the cap check: sums of per-table GiB differ from the cap in the last bits
MEMORY_TOLERANCE_GB = 1e-12


@dataclass(frozen=True)
class Topology:
    """``ndevices`` devices, each holding at most ``max_memory_gb`` GiB of weights counted at
    ``precision`` (``fp16``: 2 bytes per weight, ``fp32``: 4); ``devices_per_host`` > 0 groups them in
    hosts of that many (device ``d`` on host ``d // devices_per_host``; 0: one host), which planners that
    model the exchange on two levels plan for."""

    ndevices: int
    max_memory_gb: float
    precision: str = "fp16"
    devices_per_host: int = 0

    def __post_init__(self):
        n = self.ndevices
        if isinstance(n, bool) or int(n) != n or not 1 <= n <= MAX_DEVICES:
            raise ShardError(f"a topology needs at least one device and at most {MAX_DEVICES}, got ndevices={n!r}")
        if not float(self.max_memory_gb) > 0:
            raise ShardError(f"the memory cap must be positive, got {self.max_memory_gb!r} GiB")
        if self.precision not in PRECISION_BYTES:
            raise ShardError(f"unknown precision {self.precision!r}: choose one of {', '.join(sorted(PRECISION_BYTES))}")
        g = self.devices_per_host
        if isinstance(g, bool) or int(g or 0) != (g or 0) or int(g or 0) < 0:
            raise ShardError(f"devices per host must be a whole number >= 0, got {g!r}")
        object.__setattr__(self, "ndevices", int(self.ndevices))
        object.__setattr__(self, "max_memory_gb", float(self.max_memory_gb))
        object.__setattr__(self, "devices_per_host", int(g or 0))

    @property
    def limit_gb(self) -> float:
        """The most a device may hold: the cap and the check's slack (vectorised checks compare to it)."""
        return self.max_memory_gb + MEMORY_TOLERANCE_GB

    def holds(self, memory_gb: float) -> bool:
        """Whether a device with ``memory_gb`` GiB of weights is within the cap: the one memory check."""
        return memory_gb <= self.limit_gb

    def check_fits(self, tables: Sequence[TableConfig]) -> None:
        """Before any planner runs: tables that need more memory together than all the devices hold are
        infeasible for every plan (any sharding holds each weight at least once): one line."""
        need = sum(t.memory_gb(self.precision) for t in tables)
        if need > self.ndevices * (self.max_memory_gb + MEMORY_TOLERANCE_GB):
            raise InfeasibleError(f"infeasible: the {len(tables)} tables need {need:.4g} GB together ({self.precision}), "
                                  f"more than {self.ndevices} devices of {self.max_memory_gb:g} GB hold; raise "
                                  "--max-memory or add devices")
