"""NeuroShard's online search over the simulator (README, "NeuroShard").

**Table-wise search** (:meth:`TaskSearch.table_wise`). Tables go in order of their predicted
single-table compute cost, largest first (ties: larger memory, larger dataset index, later task
position). Each goes to the device whose shard has the smallest predicted compute cost *with the
tables placed so far* (the compute model's joint prediction, not a sum of single costs), among the
devices with room for it under the memory cap and under a **dim-sum cap** of ``scale x`` the mean
dim sum per device (ties, i.e. empty devices: the lowest device id). The cap keeps the
communication balanced, which the compute-driven greedy would ignore. The greedy runs for every
scale of a grid (``search_steps`` values from ``cap_start`` to ``cap_end``, 1.0 .. 1.5 in 11
steps by default) plus once without a dim cap; every resulting plan is scored by the simulator and
the best one is kept. The grid's greedies run in lockstep (one NumPy step per table for all
scales). If none of them finds room for every table, the greedy is retried with the tables in
order of memory (largest first), still without a dim cap; the memory cap is never exceeded.

**Column-wise beam search** (:meth:`TaskSearch.beam`). A state is the number of column shards of
every task table (``splits``, as in :class:`~shardcore.plan.Plan`). A step takes one of a state's
candidate tables, the ``n`` with the largest column shards (memory) and the ``n`` with the most
costly ones (predicted compute), and halves its column shards' dim (``k`` shards become ``2k`` of
half the dim; only while the half stays a multiple of 4), then re-runs the table-wise search on the
new table list. Of all new states of a step the ``k`` best by simulated cost form the next beam
(states that no search could place rank by their largest column shard, so that splitting can make
an over-full task feasible). At most ``max_length`` steps; the result is the best plan seen,
including the table-wise start, so the beam search never returns a plan worse (in simulation) than
the table-wise search alone.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from shardcore.plan import Plan
from shardcore.tables import TableConfig
from shardcore.topology import Topology

from .config import SearchConfig
from .simulator import Simulator

INF = math.inf


@dataclass
class Candidate:
    """The table-wise search's best plan for one set of column splits."""

    splits: tuple[int, ...]
    cost: float                              # simulated plan cost (ms); inf when nothing fits
    allocation: tuple[int, ...] | None       # over the expanded table list
    device_costs: np.ndarray | None = None   # [D, 4]
    scale: float | None = None               # the dim-sum cap's scale that produced it (inf: no cap)
    max_shard_mem: float = 0.0               # largest column shard (GiB), ranks infeasible states

    @property
    def feasible(self) -> bool:
        return self.allocation is not None


@dataclass
class SearchResult:
    plan: Plan | None
    cost: float
    device_costs: np.ndarray | None
    table_wise_cost: float
    splits: tuple[int, ...]
    seconds: float
    evaluated: int                            # table-wise searches run
    steps: int                                # beam steps taken
    history: list = field(default_factory=list)   # best cost after each beam step


class TaskSearch:
    """Search state for one task: its tables, devices, memory cap and the simulator."""

    def __init__(self, sim: Simulator, tables: Sequence[TableConfig], topology: Topology,
                 cfg: SearchConfig | None = None):
        self.sim = sim
        self.tables = list(tables)
        self.topology = topology
        self.ndevices = topology.ndevices
        self.cfg = cfg or SearchConfig()
        self.num_tables = len(self.tables)
        self.mem = np.array([t.memory_gb(topology.precision) for t in self.tables], dtype=np.float64)
        self.dim = np.array([t.dim for t in self.tables], dtype=np.int64)
        self._shard_info: dict[tuple[int, int], tuple[np.ndarray, float]] = {}   # (pos, k) -> (emb, cost)
        self._cache: dict[tuple[int, ...], Candidate] = {}
        self._fill_shard_info([(p, 1) for p in range(self.num_tables)])
        steps = max(1, int(self.cfg.search_steps))
        if steps == 1:
            scales = [float(self.cfg.cap_start)]
        else:
            scales = list(np.linspace(self.cfg.cap_start, self.cfg.cap_end, steps))
        self.scales = np.array(scales + [INF], dtype=np.float64)
        self.evaluated = 0

    # -- per column shard: representation and predicted single cost --------------------------
    def _fill_shard_info(self, keys: Sequence[tuple[int, int]]) -> None:
        todo = [key for key in keys if key not in self._shard_info]
        if not todo:
            return
        shards = [self.tables[p].with_dim(self.tables[p].dim // k) for p, k in todo]
        emb = self.sim.compute.table_embeddings(shards)
        single = self.sim.compute.head(emb).sum(-1)
        for key, e, c in zip(todo, emb, single):
            self._shard_info[key] = (e, float(c))

    def expanded(self, splits: Sequence[int]):
        """The expanded table list of ``splits`` (Plan.expand's order): owner positions, embeddings,
        single costs, memory, dims and dataset indices, one entry per column shard."""
        keys = [(p, k) for p, k in enumerate(splits) for _ in range(k)]
        self._fill_shard_info(list({(p, k) for p, k in enumerate(splits)}))
        owner = np.array([p for p, _ in keys], dtype=np.int64)
        ks = np.array([k for _, k in keys], dtype=np.int64)
        emb = np.stack([self._shard_info[key][0] for key in keys]) if keys else np.zeros((0, 1))
        single = np.array([self._shard_info[key][1] for key in keys], dtype=np.float64)
        return owner, emb, single, self.mem[owner] / ks, self.dim[owner] // ks

    # -- table-wise search -------------------------------------------------------------------
    def _greedy(self, order: np.ndarray, emb: np.ndarray, mem: np.ndarray, dim: np.ndarray,
                caps: np.ndarray):
        """Greedy placements for every dim cap in ``caps`` at once. Returns ``(alloc [G, M],
        alive [G], compute [G, D, 2], dim_sums [G, D])``."""
        g, d, m = len(caps), self.ndevices, len(order)
        e = emb.shape[1] if emb.ndim == 2 else 1
        sums = np.zeros((g, d, e))
        comp = np.zeros((g, d, 2))
        cost = np.zeros((g, d))
        used = np.zeros((g, d))
        dsum = np.zeros((g, d))
        alive = np.ones(g, dtype=bool)
        alloc = np.full((g, m), -1, dtype=np.int64)
        cap_mem = self.topology.limit_gb
        cap_dim = caps[:, None] + 1e-9
        head = self.sim.compute.head
        rows = np.arange(g)
        for i in order:
            legal = (used <= cap_mem - mem[i]) & (dsum <= cap_dim - dim[i])
            alive &= legal.any(1)
            if not alive.any():
                break
            # smallest predicted shard cost; ties (in practice: empty devices, which also have the
            # same memory used) go to the lowest device id
            dev = np.where(legal, cost, INF).argmin(1)
            gi = rows[alive]
            dv = dev[gi]
            sums[gi, dv] += emb[i]
            used[gi, dv] += mem[i]
            dsum[gi, dv] += dim[i]
            pred = head(sums[gi, dv])
            comp[gi, dv] = pred
            cost[gi, dv] = pred.sum(-1)
            alloc[gi, i] = dv
        return alloc, alive, comp, dsum

    def table_wise(self, splits: Sequence[int] | None = None) -> Candidate:
        """The best table-wise plan for the tables with ``splits`` applied (cached per splits)."""
        splits = tuple(int(k) for k in (splits if splits is not None else [1] * self.num_tables))
        hit = self._cache.get(splits)
        if hit is not None:
            return hit
        self.evaluated += 1
        owner, emb, single, mem, dim = self.expanded(splits)
        max_shard = float(mem.max()) if len(mem) else 0.0
        if len(owner) == 0:
            cand = Candidate(splits, 0.0, (), np.zeros((self.ndevices, 4)), None, 0.0)
            self._cache[splits] = cand
            return cand
        index = np.array([self.tables[p].index for p in owner], dtype=np.int64)
        positions = np.arange(len(owner))
        # largest predicted single cost first; ties: larger memory, larger dataset index, later position
        order = np.lexsort((positions, index, mem, single))[::-1]
        mean_dim = float(dim.sum()) / self.ndevices
        caps = self.scales * mean_dim
        alloc, alive, comp, dsum = self._greedy(order, emb, mem, dim, caps)
        scales = self.scales
        if not alive.any():   # no room under the caps: fill by memory, largest first
            order = np.lexsort((positions, index, single, mem))[::-1]
            alloc, alive, comp, dsum = self._greedy(order, emb, mem, dim, np.array([INF]))
            scales = np.array([INF])
        if not alive.any():
            cand = Candidate(splits, INF, None, None, None, max_shard)
        else:
            costs = self.sim.score(comp[alive], dsum[alive])
            totals = costs.sum(-1).max(-1)
            best = int(np.argmin(totals))
            g = np.flatnonzero(alive)[best]
            cand = Candidate(splits, float(totals[best]), tuple(int(x) for x in alloc[g]), costs[best],
                             float(scales[g]), max_shard)
        self._cache[splits] = cand
        return cand

    # -- column-wise beam search -------------------------------------------------------------
    def split_candidates(self, splits: Sequence[int]) -> list[int]:
        """Task positions whose column shards may be halved: among those whose half dim stays a
        multiple of ``min_dim``, the ``n`` with the largest shards and the ``n`` most costly."""
        step = 2 * self.cfg.min_dim
        ok = [p for p, k in enumerate(splits) if (self.dim[p] // k) % step == 0 and self.dim[p] % k == 0]
        if not ok:
            return []
        self._fill_shard_info([(p, splits[p]) for p in ok])
        n = max(0, int(self.cfg.n))
        by_mem = sorted(ok, key=lambda p: (self.mem[p] / splits[p], p), reverse=True)[:n]
        by_cost = sorted(ok, key=lambda p: (self._shard_info[(p, splits[p])][1], p), reverse=True)[:n]
        return sorted(set(by_mem) | set(by_cost))

    @staticmethod
    def _rank(c: Candidate) -> tuple:
        return (c.cost, c.max_shard_mem, c.splits)

    def beam(self) -> SearchResult:
        t0 = time.perf_counter()
        start = self.table_wise()
        best = start
        history = []
        steps = 0
        if self.cfg.column_wise and self.cfg.max_length > 0 and self.cfg.k > 0:
            beam = [start]
            seen = {start.splits}
            for _ in range(int(self.cfg.max_length)):
                new = []
                for state in beam:
                    for p in self.split_candidates(state.splits):
                        splits = list(state.splits)
                        splits[p] *= 2
                        splits = tuple(splits)
                        if splits in seen:
                            continue
                        seen.add(splits)
                        cand = self.table_wise(splits)
                        new.append(cand)
                        if self._rank(cand) < self._rank(best):
                            best = cand
                if not new:
                    break
                steps += 1
                new.sort(key=self._rank)
                beam = new[: int(self.cfg.k)]
                history.append(best.cost)
        plan = None
        if best.feasible:
            plan = Plan.from_allocation(self.tables, best.allocation, self.topology, best.splits)
        return SearchResult(plan, best.cost, best.device_costs, start.cost, best.splits,
                            time.perf_counter() - t0, self.evaluated, steps, history)


def search(sim: Simulator, tables: Sequence[TableConfig], topology: Topology,
           cfg: SearchConfig | None = None) -> SearchResult:
    """Table-wise search, then (unless ``cfg.column_wise`` is off) the column-wise beam search."""
    return TaskSearch(sim, tables, topology, cfg).beam()
