"""The human-expert strategies (README, "Baselines"), all respecting the per-device memory cap.

Greedy: sort the tables by a cost key, largest first (ties: larger size, then larger table index);
put each on the device with the smallest accumulated key among the devices that still have room
(ties: smaller accumulated memory, then lower device id). Keys:

=====================  ==========================================
``dim_greedy``         dim
``size_greedy``        table memory in GiB
``lookup_greedy``      dim x pooling_factor
``size_lookup_greedy`` dim x pooling_factor x log10(row)
=====================  ==========================================

``random`` draws a device uniformly among those with room (seeded); ``naive`` deals the tables
round robin in task order, skipping devices without room. When a table fits on no device the task
is infeasible: :class:`InfeasibleError` is raised, never an overfilled device.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from shardcore.errors import InfeasibleError, ShardError
from shardcore.plan import Plan
from shardcore.tables import TableConfig
from shardcore.topology import Topology
from shardcore.types import Sharder  # noqa: F401  (defined with the data model; imported from here too)

def _no_room(t: TableConfig, pos: int, mem: Sequence[float], topology: Topology) -> InfeasibleError:
    need = t.memory_gb(topology.precision)
    cap = topology.max_memory_gb
    return InfeasibleError(
        f"infeasible: table {t.index} (task position {pos}, {need:.3f} GiB) fits on no device "
        f"(cap {cap:g} GiB, most free {cap - min(mem):.3f} GiB)")


def greedy_plan(tables: Sequence[TableConfig], topology: Topology, key: Callable[[TableConfig], float]) -> Plan:
    """The greedy of README "Baselines" with an arbitrary cost key: largest key first, each table on the
    device with the smallest accumulated key among those with room."""
    ndevices, precision = topology.ndevices, topology.precision
    keys = [float(key(t)) for t in tables]
    order = sorted(range(len(tables)),
                   key=lambda i: (keys[i], tables[i].size, tables[i].index, i), reverse=True)
    acc_key = [0.0] * ndevices
    acc_mem = [0.0] * ndevices
    alloc = [-1] * len(tables)
    # one (key, memory, device) entry per device: the first with room is the device chosen, in
    # O(log devices) per table while devices have room (100k tables stay fast)
    heap = [(0.0, 0.0, d) for d in range(ndevices)]
    for i in order:
        need = tables[i].memory_gb(precision)
        full = []
        while heap and not topology.holds(heap[0][1] + need):
            full.append(heapq.heappop(heap))
        if not heap:
            raise _no_room(tables[i], i, acc_mem, topology)
        d = heapq.heappop(heap)[2]
        alloc[i] = d
        acc_key[d] += keys[i]
        acc_mem[d] += need
        heapq.heappush(heap, (acc_key[d], acc_mem[d], d))
        for entry in full:
            heapq.heappush(heap, entry)
    return Plan.table_wise(tables, alloc, topology)


def dim_key(t: TableConfig) -> float:
    return float(t.dim)


def size_key(t: TableConfig) -> float:
    return t.memory_gb("fp16")


def lookup_key(t: TableConfig) -> float:
    return t.dim * t.pooling_factor


def size_lookup_key(t: TableConfig) -> float:
    return t.dim * t.pooling_factor * math.log10(t.row) if t.row > 0 else 0.0


GREEDY_KEYS: dict[str, Callable[[TableConfig], float]] = {
    "dim_greedy": dim_key,
    "size_greedy": size_key,
    "lookup_greedy": lookup_key,
    "size_lookup_greedy": size_lookup_key,
}


@dataclass
class GreedySharder(Sharder):
    def shard(self, tables, topology):
        return greedy_plan(tables, topology, GREEDY_KEYS[self.name])


@dataclass
class RandomSharder(Sharder):
    seed: int = 0
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self):
        self.rng = np.random.default_rng(self.seed)

    def shard(self, tables, topology):
        mem = [0.0] * topology.ndevices
        alloc = []
        for i, t in enumerate(tables):
            need = t.memory_gb(topology.precision)
            legal = [d for d in range(topology.ndevices) if topology.holds(mem[d] + need)]
            if not legal:
                raise _no_room(t, i, mem, topology)
            d = legal[int(self.rng.integers(len(legal)))]
            alloc.append(d)
            mem[d] += need
        return Plan.table_wise(tables, alloc, topology)


@dataclass
class NaiveSharder(Sharder):
    def shard(self, tables, topology):
        ndevices = topology.ndevices
        mem = [0.0] * ndevices
        alloc = []
        for i, t in enumerate(tables):
            need = t.memory_gb(topology.precision)
            for step in range(ndevices):
                d = (i + step) % ndevices
                if topology.holds(mem[d] + need):
                    break
            else:
                raise _no_room(t, i, mem, topology)
            alloc.append(d)
            mem[d] += need
        return Plan.table_wise(tables, alloc, topology)


BASELINES = ("random", "naive") + tuple(GREEDY_KEYS)


def make_baseline(name: str, seed: int = 0) -> Sharder:
    if name == "random":
        return RandomSharder(name, seed=seed)
    if name == "naive":
        return NaiveSharder(name)
    if name in GREEDY_KEYS:
        return GreedySharder(name)
    raise ShardError(f"unknown algorithm {name!r}: choose from {', '.join(BASELINES)} or a model checkpoint (.pt)")
