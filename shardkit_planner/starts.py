"""shardkit's starts: the plans its search begins from, one :class:`Proposer` each (``propose(task)``
returns a plan or raises :class:`~shardcore.errors.InfeasibleError`).

* :class:`ModelGreedy` -- largest modelled cost first, each table whole on the device whose summed
  standalone costs are lowest among those with room;
* :class:`HybridGreedy` -- the shape of TorchRec's plans chosen by the model: the heaviest tables
  row-wise over every device, a share of the small ones data-parallel, the rest by ModelGreedy;
* :class:`ReplicateGreedy` -- HybridGreedy without row-wise tables;
* :class:`SplitGreedy` -- for the tables that fit on no device (and, in a second family of variants,
  those larger than half a device): every split shape the allowed types give (column-wise in ``k``
  blocks for every ``k``, row-wise over every device, a grid across hosts) tried for all of them at
  once, their pieces and the other tables placed by load with memory kept, the variant the model
  prices lowest kept -- the split is chosen by cost, not by fallback;
* :class:`BaselineStart` -- a greedy baseline (:data:`shardcore.baselines.GREEDY_KEYS`);
* :class:`PlannerStart` -- another planner (``torchrec``, ``neuroshard``, a checkpoint), resolved
  through the registry (:func:`shardcore.cli.algorithms.build`).

Every start is deterministic and bounded in work (no clock), so the same task gives the same starts
on any machine. :data:`OWN_STARTS` maps the names ``--shardkit-starts`` takes to these classes.
"""

from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from shardcore.baselines import GREEDY_KEYS, greedy_plan
from shardcore.errors import InfeasibleError, ShardError
from shardcore.plan import (COLUMN_WISE, DATA_PARALLEL, GRID, ROW_WISE, Plan, Sharding, column_wise,
                            data_parallel, grid, pieces_of, row_wise, table_wise)
from shardcore.tables import TableConfig
from shardcore.topology import MEMORY_TOLERANCE_GB as MEM_EPS
from shardcore.topology import Topology

from .costmodel import CostModel
from .moves import block_widths, split_counts

REPLICATE_MAX_GB = 0.05   # the search's own bound on a replicated table (search.local_search's dp_max_gb)
SPREAD_COUNTS = (0, 1, 2, 3, 4, 6, 8)   # hybrid_greedy: how many of the heaviest tables it tries row-wise
# hybrid_greedy's variants together hold at most this many device pieces (a replica is a piece on every
# device): at 100k tables one variant is that large, and a budget counted in pieces keeps the start's
# work, and so its plan, the same on every machine
HYBRID_PIECES = 200_000
# split_greedy's variants together hold at most this many device pieces (a replica or a split table is a
# piece on many devices): a deterministic bound on its work (a task of 26 tables on 8 devices tries every
# variant, one of 856 tables on 128 devices a few)
SPLIT_PIECES = 30_000


@dataclass
class PlanningTask:
    """What every stage of one shardkit run reads: the task's tables, the topology (devices, memory
    cap, precision), the cost model it is planned with and the sharding types it may use."""

    tables: list
    topology: Topology
    model: CostModel
    types: tuple

    @property
    def n(self) -> int:
        return self.topology.ndevices

    @property
    def cap(self) -> float:
        return self.topology.max_memory_gb

    @property
    def precision(self) -> str:
        return self.topology.precision

    def memory(self, t: TableConfig) -> float:
        return t.memory_gb(self.precision)


class Proposer(Protocol):
    """A start: ``propose(task) -> Plan`` (or :class:`InfeasibleError`)."""

    name: str

    def propose(self, task: PlanningTask) -> Plan: ...


# -- the table-wise greedy of the model -------------------------------------------------------------
def model_greedy(model: CostModel, tables: Sequence[TableConfig], topology: Topology,
                 alone: Sequence[float] | None = None) -> Plan:
    """Tables by standalone modelled cost (``alone``, computed when not given), largest first, each on
    the device with the lowest load (summed standalone costs) among those with room; table-wise."""
    if alone is None:
        alone = model.shard_compute([[t] for t in tables])
    order = sorted(range(len(tables)), key=lambda i: (-alone[i], -tables[i].size, i))
    ndevices, precision = topology.ndevices, topology.precision
    load = [0.0] * ndevices
    mem = [0.0] * ndevices
    alloc = [0] * len(tables)
    heap = [(0.0, d) for d in range(ndevices)]   # (load, device): the first with room is chosen
    for i in order:
        need = tables[i].memory_gb(precision)
        full = []
        while heap and not topology.holds(mem[heap[0][1]] + need):
            full.append(heapq.heappop(heap))
        if not heap:
            raise InfeasibleError(f"infeasible: table {tables[i].index} (task position {i}) fits on no device")
        d = heapq.heappop(heap)[1]
        alloc[i] = d
        load[d] += float(alone[i])
        mem[d] += need
        heapq.heappush(heap, (load[d], d))
        for entry in full:
            heapq.heappush(heap, entry)
    return Plan.table_wise(tables, alloc, topology)


class ModelGreedy:
    name = "model_greedy"

    def propose(self, task: PlanningTask) -> Plan:
        return model_greedy(task.model, task.tables, task.topology)


def hybrid_greedy(model: CostModel, tables: Sequence[TableConfig], topology: Topology,
                  spread: Sequence[int] = SPREAD_COUNTS, replicate: bool = True,
                  max_pieces: int = HYBRID_PIECES) -> Plan:
    """The shape of TorchRec's plans on an H200, chosen by the model: a share of the small tables (of
    at most :data:`REPLICATE_MAX_GB`, fewest rows per lookup first: none, one eighth, ... all)
    data-parallel when ``replicate``; of the others the ``k`` heaviest by standalone modelled cost
    (``k`` in ``spread``) row-wise over every device; the rest by :func:`model_greedy`; the variant
    the model prices lowest (none replicated and none spread is model_greedy, a start of its own, not
    tried). A row-wise table spreads its lookups over every device; a replica spreads them too and
    leaves the all-to-all for an all-reduce of its small weights. Variants are made cheapest first
    while their device pieces add up to at most ``max_pieces`` (a replica is a piece on every device)."""
    alone = [float(v) for v in model.shard_compute([[t] for t in tables])]
    ndevices, max_memory_gb, precision = topology.ndevices, topology.max_memory_gb, topology.precision
    # replicas first where they cost least for what they spread: rows (the all-reduce) per lookup
    small = sorted((i for i, t in enumerate(tables) if t.memory_gb(precision) <= REPLICATE_MAX_GB),
                   key=lambda i: (tables[i].row / max(tables[i].pooling_factor, 0.01), i))
    shares = sorted({j * len(small) // 8 for j in range(9)}) if replicate else [0]
    best: tuple[float, Plan] | None = None
    spent = 0
    for k in sorted({min(int(k), len(tables)) for k in spread} if ndevices > 1 else {0}):
        for share in shares:   # the cheaper variants (fewer replicas, so fewer pieces) first
            if k == 0 and share == 0:   # model_greedy itself, a start of its own
                continue
            rep = set(small[:share])
            heavy = set(sorted((i for i in range(len(tables)) if i not in rep), key=lambda i: (-alone[i], i))[:k])
            pieces = len(tables) + (len(rep) + len(heavy)) * (ndevices - 1)
            if spent + pieces > max_pieces and spent:
                break   # a larger share with this spread holds more pieces still
            spent += pieces
            rest = [i for i in range(len(tables)) if i not in rep and i not in heavy]
            fixed_gb = (sum(tables[i].memory_gb(precision) for i in rep)
                        + sum(tables[i].memory_gb(precision) for i in heavy) / ndevices)
            if not rest or fixed_gb >= max_memory_gb:   # a cap left of 0 holds no table
                continue
            try:   # the rest by the model, in what the fixed tables leave of each device
                part = model_greedy(model, [tables[i] for i in rest],
                                    dataclasses.replace(topology, max_memory_gb=max_memory_gb - fixed_gb),
                                    [alone[i] for i in rest])
            except InfeasibleError:
                continue
            shardings = [data_parallel(ndevices) if i in rep else row_wise(range(ndevices))
                         for i in range(len(tables))]
            for i, sh in zip(rest, part.shardings):
                shardings[i] = sh
            plan = Plan(tables, shardings, topology)
            if not plan.feasible:   # row blocks round up
                continue
            cost = float(model.device_costs(plan).max())
            if best is None or cost < best[0]:
                best = (cost, plan)
    if best is None:
        raise InfeasibleError("infeasible: no spread or replicated share leaves room for the rest")
    return best[1]


class HybridGreedy:
    name = "hybrid_greedy"

    def propose(self, task: PlanningTask) -> Plan:
        if ROW_WISE not in task.types or task.n < 2:
            raise InfeasibleError("hybrid_greedy needs row-wise tables and two devices")
        return hybrid_greedy(task.model, task.tables, task.topology, replicate=DATA_PARALLEL in task.types)


def replicate_greedy(model: CostModel, tables: Sequence[TableConfig], topology: Topology) -> Plan:
    """:func:`hybrid_greedy` without row-wise tables: a share of the small tables (at least one eighth,
    fewest rows per lookup first) data-parallel, the rest by :func:`model_greedy`."""
    if not any(t.memory_gb(topology.precision) <= REPLICATE_MAX_GB for t in tables):
        raise InfeasibleError("infeasible: no small table to replicate")
    return hybrid_greedy(model, tables, topology, spread=(0,))


class ReplicateGreedy:
    name = "replicate_greedy"

    def propose(self, task: PlanningTask) -> Plan:
        if DATA_PARALLEL not in task.types or task.n < 2:
            raise InfeasibleError("replicate_greedy needs data-parallel tables and two devices")
        return replicate_greedy(task.model, task.tables, task.topology)


# -- splits chosen by cost ----------------------------------------------------------------------------
def piece_loads(model: CostModel, pieces: Sequence[TableConfig], ndevices: int) -> np.ndarray:
    """Each piece's load for a greedy placement: its standalone modelled compute plus what its pooled
    outputs and ids add to its device's exchange (the exchange model's cost per byte at the task's
    batch, both phases)."""
    if not pieces:
        return np.zeros(0)
    comp = np.asarray(model.shard_compute([[p] for p in pieces]), dtype=float)
    comm = model.comm_for(ndevices)
    if ndevices < 2:
        return comp
    per_byte_ms = 1e3 / (comm.bandwidth_gbps * 1e9)
    share = model.batch_size * (ndevices - 1) / ndevices
    pooled = np.array([model.pooled_dim(p) for p in pieces], dtype=float) * 4.0 * share * 2.0
    ids = np.array([model.id_width(p) for p in pieces], dtype=float) * 8.0 * share
    return comp + (pooled + ids) * per_byte_ms


def place(task: PlanningTask, fixed: dict[int, Sharding], blocks: dict[int, list[int]]) -> Plan | None:
    """A plan with the shardings of ``fixed`` (row-wise, grid, replicas: their devices given), the
    column blocks of ``blocks`` (table position -> widths, each block on a device of its own) and every
    other table whole, pieces placed largest load first on the least loaded device with room (a block
    never beside another block of its table); where that fails, again largest memory first on the
    device with the most room. None when neither places everything. (A heap of the devices: a device
    skipped for one piece goes back for the next, so a piece costs O(log devices) while devices have room.)"""
    n, tables = task.n, task.tables
    mem0 = np.zeros(n)
    load0 = np.zeros(n)
    fixed_pieces = [(d, p) for pos, s in fixed.items() for d, p in pieces_of(s, tables[pos], n)]
    if fixed_pieces:
        loads = piece_loads(task.model, [p for _, p in fixed_pieces], n)
        for (d, p), c in zip(fixed_pieces, loads):
            mem0[d] += task.memory(p)
            load0[d] += c
    items: list[tuple[int, int, TableConfig]] = []   # (position, block number, piece)
    for pos, t in enumerate(tables):
        if pos in fixed:
            continue
        widths = blocks.get(pos)
        if widths:
            items.extend((pos, j, t.with_dim(w)) for j, w in enumerate(widths))
        else:
            items.append((pos, 0, t))
    loads = piece_loads(task.model, [p for _, _, p in items], n)
    mems = np.array([task.memory(p) for _, _, p in items])
    for by_memory in (False, True):
        mem, load = mem0.copy(), load0.copy()
        where: dict[tuple[int, int], int] = {}
        used: dict[int, set] = {}
        order = (sorted(range(len(items)), key=lambda i: (-mems[i], -loads[i], i)) if by_memory
                 else sorted(range(len(items)), key=lambda i: (-loads[i], -mems[i], i)))
        heap = [((mem[d] - task.cap, d) if by_memory else (load[d], d)) for d in range(n)]
        heapq.heapify(heap)
        ok = True
        for i in order:
            pos, j, p = items[i]
            taken = used.setdefault(pos, set())
            skipped = []
            while heap and (heap[0][1] in taken or mem[heap[0][1]] + mems[i] > task.cap + MEM_EPS):
                skipped.append(heapq.heappop(heap))
            if not heap:
                ok = False
                break
            d = heapq.heappop(heap)[1]
            where[(pos, j)] = d
            taken.add(d)
            mem[d] += mems[i]
            load[d] += loads[i]
            heapq.heappush(heap, (mem[d] - task.cap, d) if by_memory else (load[d], d))
            for e in skipped:
                heapq.heappush(heap, e)
        if ok:
            shardings = []
            for pos, t in enumerate(tables):
                if pos in fixed:
                    shardings.append(fixed[pos])
                elif blocks.get(pos):
                    shardings.append(column_wise([(where[(pos, j)], w) for j, w in enumerate(blocks[pos])]))
                else:
                    shardings.append(table_wise(where[(pos, 0)]))
            plan = Plan(tables, shardings, task.topology)
            if plan.feasible:
                return plan
    return None


def fewest_blocks(task: PlanningTask, t: TableConfig) -> int | None:
    """The fewest column blocks of ``t`` whose widest fits one device (None: even the narrowest does not)."""
    return next((k for k in [1] + split_counts(t.dim, task.n)
                 if task.memory(t.with_dim(block_widths(t.dim, k)[0])) <= task.cap + MEM_EPS), None)


def split_shapes(task: PlanningTask, t: TableConfig) -> list[tuple[str, Any]]:
    """The split shapes :class:`SplitGreedy` tries for ``t``: ``("cw", k)`` for every block count that
    fits, ``("rw", None)`` over every device, ``("grid", None)`` across hosts."""
    out: list[tuple[str, Any]] = []
    if COLUMN_WISE in task.types:
        k0 = fewest_blocks(task, t)
        if k0 is not None:
            ks = [k for k in split_counts(t.dim, task.n) if k >= k0]
            if len(ks) > 8:   # many devices: the fewest, their doublings and the most
                ks = sorted({k for k in ks if k == ks[0] or k == ks[-1] or (k % ks[0] == 0 and (k // ks[0]) & (k // ks[0] - 1) == 0)})
            out.extend(("cw", k) for k in ks)
    if ROW_WISE in task.types and task.n >= 2:
        out.append(("rw", None))
    g = getattr(task.model.comm, "devices_per_host", 0)
    if GRID in task.types and g and task.n >= 2 * g and task.n % g == 0 and t.dim % 8 == 0:
        out.append(("grid", None))
    return out


def _apply_shape(task: PlanningTask, t: TableConfig, shape: tuple[str, Any], fixed: dict, blocks: dict, pos: int
                 ) -> bool:
    kind, k = shape
    n = task.n
    if kind == "cw":
        k = max(int(k), fewest_blocks(task, t) or k)
        widths = block_widths(t.dim, k)
        if widths is None:
            return False
        blocks[pos] = widths
    elif kind == "rw":
        fixed[pos] = row_wise(range(n))
    else:
        g = task.model.comm.devices_per_host
        hosts = n // g
        widths = block_widths(t.dim, hosts) or block_widths(t.dim, 2)
        fixed[pos] = grid([(range((h % hosts) * g, (h % hosts) * g + g), w) for h, w in enumerate(widths)])
    return True


class SplitGreedy:
    """Splits chosen by cost (see the module notes). The tables split are those that fit on no device;
    a second family also splits those above half a device (a device holding one is left little room
    to balance). Each family tries every shape one of its tables allows, given to all of them (a
    column count below a table's fewest blocks is raised to it), each with the replicated shares of
    :func:`hybrid_greedy` (where data-parallel is allowed: a replica's outputs leave the exchange, which
    the split tables' widths fill); the search then re-cuts each table on its own
    (:class:`~shardkit_planner.moves.Resplit`, :class:`~shardkit_planner.moves.RowToColumn`)."""

    name = "split_greedy"

    def propose(self, task: PlanningTask) -> Plan:
        mem = [task.memory(t) for t in task.tables]
        families = []
        nowhere = [i for i, m in enumerate(mem) if m > task.cap + MEM_EPS]
        large = [i for i, m in enumerate(mem) if m > task.cap / 2]
        for fam in (nowhere, large):
            if fam and fam not in families:
                families.append(fam)
        if not families:
            raise InfeasibleError("split_greedy: every table fits on a device with room to spare")
        # replicas as hybrid_greedy makes them: none, or a share of the small tables, fewest rows per lookup first
        small = sorted((i for i, m in enumerate(mem) if m <= REPLICATE_MAX_GB),
                       key=lambda i: (task.tables[i].row / max(task.tables[i].pooling_factor, 0.01), i))
        shares = sorted({j * len(small) // 8 for j in range(9)}) if DATA_PARALLEL in task.types and task.n > 1 else [0]
        best: tuple[float, Plan] | None = None
        why = "no split shape allowed"
        spent = 0   # pieces placed so far: variants are made, cheapest shapes first, within SPLIT_PIECES
        for fam in families:
            shapes = list(dict.fromkeys(s for pos in fam for s in split_shapes(task, task.tables[pos])))
            for shape in shapes:
                for share in shares:
                    pieces = len(task.tables) + share * (task.n - 1) + len(fam) * (task.n - 1)
                    if spent and spent + pieces > SPLIT_PIECES:
                        break
                    spent += pieces
                    fixed: dict[int, Sharding] = {i: data_parallel(task.n) for i in small[:share] if i not in fam}
                    blocks: dict[int, list[int]] = {}
                    if not all(_apply_shape(task, task.tables[pos], shape, fixed, blocks, pos) for pos in fam):
                        break
                    plan = place(task, fixed, blocks)
                    if plan is None:
                        why = "no split leaves room for every table"
                        continue
                    cost = float(task.model.device_costs(plan).max())
                    if best is None or cost < best[0]:
                        best = (cost, plan)
        if best is None:
            big = max(range(len(mem)), key=lambda i: mem[i])
            raise InfeasibleError(f"split_greedy: {why} (largest table {task.tables[big].index}: "
                                  f"{mem[big]:.3f} GiB, cap {task.cap:g} GiB)")
        return best[1]


# -- other planners as starts -------------------------------------------------------------------------
@dataclass
class BaselineStart:
    """A greedy baseline of the core (:data:`~shardcore.baselines.GREEDY_KEYS`), table-wise."""

    name: str

    def propose(self, task: PlanningTask) -> Plan:
        return greedy_plan(task.tables, task.topology, GREEDY_KEYS[self.name])


@dataclass
class PlannerStart:
    """Another planner's plan (any ``--alg`` name or checkpoint), built by ``planners`` (the registry's
    :func:`shardcore.cli.algorithms.build` in shardkit's own planning context: the same topology, batch
    and landscape, that planner's own settings)."""

    name: str
    planners: Callable[[str], Any] | None = None
    _sharder: Any = field(default=None, repr=False)

    def sharder(self):
        if self._sharder is None:
            if self.planners is None:
                raise ShardError(f"shardkit's start {self.name!r} is another planner, and nothing builds one here")
            self._sharder = self.planners(self.name)
        return self._sharder

    def propose(self, task: PlanningTask) -> Plan:
        return self.sharder().shard(task.tables, task.topology)


OWN_STARTS = {"model_greedy": ModelGreedy, "hybrid_greedy": HybridGreedy, "replicate_greedy": ReplicateGreedy,
              "split_greedy": SplitGreedy}


def make_start(name: str, planners: Callable[[str], Any] | None = None) -> Proposer:
    """The start ``--shardkit-starts`` names: one of :data:`OWN_STARTS`, a greedy baseline, or another
    planner (built by ``planners`` on first use)."""
    if name in OWN_STARTS:
        return OWN_STARTS[name]()
    if name in GREEDY_KEYS:
        return BaselineStart(name)
    return PlannerStart(name, planners)
