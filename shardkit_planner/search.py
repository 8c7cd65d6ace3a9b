"""Local search over the whole plan space, guided by a :class:`~shardkit_planner.costmodel.CostModel`.

**State**: one :class:`~shardcore.plan.Sharding` per task table; each device's pieces, memory,
compute cost, pooled width, input-id width and extra collective bytes are kept up to date.

**Objective**: the plan's cost (the most expensive device) -- or, when the model knows its own error
(:meth:`~shardkit_planner.costmodel.CostModel.error_draws`), the *expected* most expensive device with
every device's compute off by an independent draw of that error (fixed draws, so the objective is
deterministic): a plan balanced to the model's last digit gains nothing there, since the machine will
not follow the model that closely -- ties broken by the sum of squared device
costs (so a move that relieves a device tied for the maximum, or evens out the others, still counts).
A move is taken only when it lowers this pair lexicographically, so the result is never worse than
the start under the model, and the search cannot cycle.

**Moves** (:mod:`shardkit_planner.moves`, one class per kind, :data:`~shardkit_planner.moves.DEFAULT_MOVES`
by default): every candidate change from the most expensive device -- whole tables and column blocks moved
or swapped, tables cut column-wise into ``k`` blocks or re-cut, columns shifted between blocks, row-wise
tables made column-wise and back, row-wise spreads over other device sets, grids across hosts, replicas,
and gathers back to one device.

A local optimum of these moves is left by a *kick* and a new search from there -- an iterated local
search, run by the sharder while its budget lasts, keeping the best plan found. A kick is either a few
random moves taken whatever they cost (:func:`kick`) or a *ruin and recreate* (:func:`recreate`): a
random share of the whole tables taken off their devices and put back, heaviest first, each where the
load is least by then -- a rebalancing of many tables at once, which single moves from the slowest
device cannot make once replicas fill every device.

Each round scores the candidate moves in chunks (one batched compute prediction for every changed
device shard of a chunk, remembered by shard contents; the exchanges of every candidate in one
array operation) and takes the best. The search stops at a local optimum, after ``max_rounds`` or
when its :class:`WorkBudget` is spent (counted in candidates priced, checked between chunks; a
wall-clock cap only as an outer bound).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from shardcore.plan import DATA_PARALLEL, TABLE_WISE, Plan, Sharding, data_parallel, piece_key, pieces_of, table_wise
from shardcore.tables import GB, TableConfig, bytes_per_element
from shardcore.topology import Topology

from .costmodel import CostModel
from .moves import ALL_TYPES, DEFAULT_MOVES, Move, candidate_moves  # noqa: F401  (ALL_TYPES, candidate_moves: re-exported)

EPS = 1e-9


@dataclass
class SearchStats:
    rounds: int = 0
    candidates: int = 0
    accepted: dict | None = None
    stopped: str = ""


class State:
    """A plan under search: shardings plus per-device bookkeeping."""

    def __init__(self, model: CostModel, tables: Sequence[TableConfig], shardings: Sequence[Sharding],
                 topology: Topology):
        self.model, self.tables, self.topology = model, list(tables), topology
        # the topology's numbers, read in the inner loops
        self.n, self.cap, self.precision = topology.ndevices, topology.max_memory_gb, topology.precision
        self.limit = topology.limit_gb
        self.bpe = bytes_per_element(self.precision) / GB
        self._comp_cache: dict[tuple, float] = {}
        self._exch_cache: dict[tuple, tuple[float, float, float]] = {}
        self._mem_cache: dict[tuple, dict] = {}
        self.last_built = 0
        self.built_total = 0    # pieces every changed_shards call built (a kick's work, charged by the caller)
        self.shardings = list(shardings)
        self.pieces: list[list[tuple[int, TableConfig]]] = [[] for _ in range(self.n)]
        self.pos_devices: list[set[int]] = [set() for _ in self.tables]
        for pos, (t, s) in enumerate(zip(self.tables, self.shardings)):
            for d, p in pieces_of(s, t, self.n):
                self.pieces[d].append((pos, p))
                self.pos_devices[pos].add(d)
        self.mem = np.array([sum(self.piece_mem(p) for _, p in ps) for ps in self.pieces])
        self.comp = self.compute_many([[p for _, p in ps] for ps in self.pieces])
        self.dims = np.array([sum(model.pooled_dim(p) for _, p in ps) for ps in self.pieces], dtype=float)
        self.extra = np.array([sum(model.extra_bytes(p, self.n) for _, p in ps) for ps in self.pieces])
        self.ids = np.array([sum(model.id_width(p) for _, p in ps) for ps in self.pieces], dtype=float)
        self.costs = self.comp + model.comm_costs(self.dims, self.extra, self.ids)
        self.draws = model.error_draws(self.n)      # [layer, draw, device] or None
        if self.draws is not None:                  # slowest's index of each draw and device in a layer
            self._draw_at = (np.arange(self.draws.shape[1])[:, None], np.arange(self.n))
        self.kinds = np.array([model.device_kind_index([p for _, p in ps]) for ps in self.pieces], dtype=int)

    def slowest(self, comp: np.ndarray, costs: np.ndarray, kinds: np.ndarray | None = None) -> np.ndarray:
        """The objective's first term for plans with device compute ``comp``, total ``costs`` and error
        layers ``kinds`` (``CostModel.device_kind_index``; default this state's; devices on the last
        axis): the slowest device, or, when the model knows its error, the expected slowest device with
        each device's compute off by a draw of its kind's error (the same draws for every plan)."""
        if self.draws is None:
            return costs.max(axis=-1)
        kinds = self.kinds if kinds is None else kinds
        factors = self.draws[(kinds[..., None, :],) + self._draw_at]
        comm = costs - comp
        return (comp[..., None, :] * factors + comm[..., None, :]).max(axis=-1).mean(axis=-1)

    def slowest_per_draw(self) -> np.ndarray:
        """The slowest device of each draw of the model's error (the objective is their mean); the plain
        slowest device, once, where the model knows no error."""
        if self.draws is None:
            return np.array([self.cost])
        factors = self.draws[(self.kinds[None, :],) + self._draw_at]
        return (self.comp[None, :] * factors + (self.costs - self.comp)[None, :]).max(axis=-1)

    def copy(self) -> "State":
        """An independent copy (the model, its error draws and the remembered shard costs shared)."""
        new = object.__new__(State)
        new.__dict__.update(self.__dict__)
        new.shardings = list(self.shardings)
        new.pieces = [list(ps) for ps in self.pieces]
        new.pos_devices = [set(ds) for ds in self.pos_devices]
        for name in ("mem", "comp", "dims", "extra", "ids", "costs", "kinds"):
            setattr(new, name, getattr(self, name).copy())
        return new

    def exchange_sums(self, ps: Sequence[TableConfig]) -> tuple[float, float, float]:
        """A device's pooled width, extra collective bytes and input-id width for pieces ``ps``, each
        piece's remembered by its key (the search asks for every piece of every candidate device)."""
        memo = self._exch_cache
        dim = extra = ids = 0.0
        for p in ps:
            k = piece_key(p)
            v = memo.get(k)
            if v is None:
                v = memo[k] = (self.model.pooled_dim(p), self.model.extra_bytes(p, self.n), self.model.id_width(p))
            dim += v[0]
            extra += v[1]
            ids += v[2]
        return dim, extra, ids

    def piece_mem(self, p: TableConfig) -> float:
        return p.row * p.dim * self.bpe

    def compute_many(self, shards: list[list[TableConfig]]) -> np.ndarray:
        """The model's compute of each shard, remembered by the shard's contents."""
        keys = [tuple(sorted(piece_key(p) for p in ps)) for ps in shards]
        todo = [i for i, k in enumerate(keys) if k not in self._comp_cache]
        if todo:
            uniq: dict[tuple, int] = {}
            for i in todo:
                uniq.setdefault(keys[i], i)
            vals = self.model.shard_compute([shards[i] for i in uniq.values()])
            for k, v in zip(uniq, vals):
                self._comp_cache[k] = float(v)
        return np.array([self._comp_cache[k] for k in keys])

    @property
    def cost(self) -> float:
        return float(self.costs.max())

    @property
    def score(self) -> tuple[float, float]:
        return float(self.slowest(self.comp, self.costs)), float((self.costs ** 2).sum())

    @classmethod
    def of(cls, model: CostModel, plan: Plan) -> "State":
        """The state of ``plan`` under ``model``."""
        return cls(model, plan.tables, plan.shardings, plan.topology)

    def plan(self) -> Plan:
        return Plan(self.tables, self.shardings, self.topology)

    # -- a candidate: new shardings for some table positions -------------------------------------
    def table_memory(self, pos: int, s: Sharding) -> dict[int, float]:
        """``{device: memory}`` of table ``pos`` sharded by ``s``, remembered."""
        key = (pos, s)
        got = self._mem_cache.get(key)
        if got is None:
            got = {}
            for d, p in pieces_of(s, self.tables[pos], self.n):
                got[d] = got.get(d, 0.0) + self.piece_mem(p)
            self._mem_cache[key] = got
        return got

    def changed_shards(self, change: dict[int, Sharding]) -> dict[int, list[TableConfig]] | None:
        """The new piece lists of the devices a change touches; None if a device would overflow (checked
        first, from the tables' memory per device). ``last_built``: the pieces the change gave its devices
        (the work of the call, overflowing or not)."""
        removed: dict[int, float] = {}
        added: dict[int, float] = {}
        for pos, s in change.items():
            for d, m in self.table_memory(pos, self.shardings[pos]).items():
                removed[d] = removed.get(d, 0.0) + m
            for d, m in self.table_memory(pos, s).items():
                added[d] = added.get(d, 0.0) + m
        self.last_built = len(added)
        for d, m in added.items():
            if self.mem[d] - removed.get(d, 0.0) + m > self.limit:
                return None
        new_on: dict[int, list[TableConfig]] = {}
        for pos, s in change.items():
            for d, p in pieces_of(s, self.tables[pos], self.n):
                new_on.setdefault(d, []).append(p)
        out = {}
        for d in dict.fromkeys(list(removed) + list(new_on)):
            out[d] = [p for pos, p in self.pieces[d] if pos not in change] + new_on.get(d, [])
        self.last_built = sum(len(ps) for ps in out.values())
        self.built_total += self.last_built
        return out

    def make(self, change: dict[int, Sharding]) -> bool:
        """Apply ``change`` with the model's compute of every device it touches; False (nothing
        changed) where a device would overflow its memory."""
        shards = self.changed_shards(change)
        if shards is None:
            return False
        comp = self.compute_many(list(shards.values()))
        self.apply(change, shards, {d: float(v) for d, v in zip(shards, comp)})
        return True

    def apply(self, change: dict[int, Sharding], shards: dict[int, list[TableConfig]], comp: dict[int, float]) -> None:
        for pos, s in change.items():
            self.shardings[pos] = s
            self.pos_devices[pos] = {d for d, _ in pieces_of(s, self.tables[pos], self.n)}
        for d in shards:
            self.pieces[d] = [(pos, p) for pos, p in self.pieces[d] if pos not in change]
        for pos, s in change.items():
            for d, p in pieces_of(s, self.tables[pos], self.n):
                self.pieces[d].append((pos, p))
        for d, ps in shards.items():
            self.mem[d] = sum(self.piece_mem(p) for p in ps)
            self.comp[d] = comp[d]
            self.dims[d] = sum(self.model.pooled_dim(p) for p in ps)
            self.extra[d] = sum(self.model.extra_bytes(p, self.n) for p in ps)
            self.ids[d] = sum(self.model.id_width(p) for p in ps)
            self.kinds[d] = self.model.device_kind_index(ps)
        self.costs = self.comp + self.model.comm_costs(self.dims, self.extra, self.ids)


class WorkBudget:
    """The search's budget, counted in work so that the same inputs give the same plan on an idle or a
    busy machine: every candidate move priced costs one unit, plus one per :data:`PIECES_PER_UNIT` pieces
    on the devices it changes (the model's features of those devices) and one per :data:`DEVICES_PER_UNIT`
    devices it changes (their bookkeeping), and one more per :data:`DEVICES_PER_CANDIDATE` devices of the
    plan (its arrays), so that a unit takes about as long on 4 devices as on 128. Wall-clock time
    is only an outer cap (``time_cap_s``); when it ends a search, :attr:`cut_by_time` says so (that
    plan then depends on the machine's speed)."""

    def __init__(self, work: float, time_cap_s: float | None = None):
        self.work = float(work)
        self.time_cap_s = time_cap_s
        self.used = 0.0
        self.cut_by_time = False
        self._deadline = None if time_cap_s is None else time.perf_counter() + float(time_cap_s)

    def spend(self, candidates: int, pieces: int, devices: int = 0) -> None:
        self.used += candidates + pieces / PIECES_PER_UNIT + devices / DEVICES_PER_UNIT

    @property
    def left(self) -> float:
        return self.work - self.used

    @property
    def exhausted(self) -> bool:
        if self.used >= self.work:
            return True
        if self._deadline is not None and time.perf_counter() > self._deadline:
            self.cut_by_time = True
            return True
        return False


PIECES_PER_UNIT = 32
DEVICES_PER_UNIT = 8     # a changed device costs its own bookkeeping besides its pieces' (128 devices: most of it)
DEVICES_PER_CANDIDATE = 64   # a candidate's arrays span every device: one more unit per 64 devices of the plan


def kick(st: State, rng: np.random.Generator, k: int, dp_max_gb: float = 0.05,
         types: Sequence[str] = ALL_TYPES) -> int:
    """Apply ``k`` random feasible changes to ``st`` (the perturbation of an iterated local search:
    the search's moves only ever improve, so it stops in the first local optimum it reaches): a
    table of the most expensive device (half the draws) or of any device is put table-wise on another
    device, or, where data-parallel is allowed and the table is small, made data-parallel; a row-wise,
    column-wise or data-parallel table is gathered table-wise. Returns how many were applied."""
    applied = 0
    if st.n < 2:   # one device: nothing to move
        return 0
    dp = DATA_PARALLEL in types
    for _ in range(8 * k):
        if applied >= k:
            break
        m = int(np.argmax(st.costs))
        if rng.random() < 0.5 and st.pieces[m]:
            pos = st.pieces[m][int(rng.integers(len(st.pieces[m])))][0]
        else:
            pos = int(rng.integers(len(st.tables)))
        s, t = st.shardings[pos], st.tables[pos]
        if s.type == TABLE_WISE and dp and t.memory_gb(st.precision) <= dp_max_gb and rng.random() < 0.3:
            new = data_parallel(st.n)
        elif s.type == TABLE_WISE:
            e = int(rng.integers(st.n - 1))
            new = table_wise(e + (e >= s.devices[0]))
        else:
            new = table_wise(int(rng.integers(st.n)))
        if st.make({pos: new}):
            applied += 1
    return applied


def recreate(st: State, rng: np.random.Generator, share: float = 0.3) -> int:
    """Ruin and recreate ``st`` in place: ``share`` of its table-wise tables (at least two), drawn at
    random, taken off their devices and put back table-wise, heaviest first (the model's cost of the
    table alone on a device), each on the device whose load is least by then, the loads being the
    devices' costs less the taken tables' standalone costs. Nothing changes (0) where fewer than two
    tables are table-wise, on one device, or where the result would overflow a device's memory.
    Returns how many tables were put back."""
    whole = [pos for pos, s in enumerate(st.shardings) if s.type == TABLE_WISE]
    if len(whole) < 2 or st.n < 2:
        return 0
    taken = [whole[i] for i in rng.choice(len(whole), size=min(len(whole), max(2, int(share * len(whole)))),
                                          replace=False)]
    alone = st.model.shard_costs([[st.tables[pos]] for pos in taken])
    load = st.costs.copy()
    for pos, c in zip(taken, alone):
        load[st.shardings[pos].devices[0]] -= c
    change = {}
    for j in np.argsort(-alone, kind="stable"):
        d = int(np.argmin(load))
        change[taken[int(j)]] = table_wise(d)
        load[d] += alone[int(j)]
    return len(change) if st.make(change) else 0


@dataclass
class LocalSearch:
    """The search stage: ``improve(state, budget, types=, stats=)`` runs :func:`local_search` with these
    moves and widths (one object, passed to the sharder, so a test can give it other moves)."""

    moves: tuple = DEFAULT_MOVES
    fanout: int = 6
    hot: int = 3
    dp_max_gb: float = 0.05

    def improve(self, st: "State", budget: "WorkBudget", *, types: Sequence[str] = ALL_TYPES,
                stats: SearchStats | None = None) -> "State":
        return local_search(st, budget, fanout=self.fanout, hot=self.hot, dp_max_gb=self.dp_max_gb, types=types,
                            stats=stats, moves=self.moves)


CHUNK_PIECES = 20000   # candidates scored together hold about this many pieces per touched device, at most


def local_search(st: State, budget: WorkBudget, *, fanout: int = 6, hot: int = 3, max_rounds: int = 100000,
                 dp_max_gb: float = 0.05, types: Sequence[str] = ALL_TYPES, chunk: int = 64,
                 stats: SearchStats | None = None, moves: Sequence = DEFAULT_MOVES) -> State:
    """Improve ``st`` in place, one best move per round (see the module notes), until a local optimum,
    ``max_rounds`` or the ``budget`` (:class:`WorkBudget`, checked between chunks of candidates).
    ``moves``: a sequence of neighbourhoods (each a sequence of :class:`~shardkit_planner.moves.Move`),
    tried in turn each round, a later one only where the earlier have no improving move (a plain list of
    moves is one neighbourhood)."""
    stats = stats or SearchStats()
    stats.accepted = stats.accepted or {}
    tiers = [tuple(t) for t in moves] if moves and not isinstance(moves[0], Move) else [tuple(moves)]
    # a chunk's cost grows with the pieces per device: fewer candidates per chunk on large tasks
    chunk = max(1, min(chunk, CHUNK_PIECES // max(1, len(st.tables) // st.n)))
    for _ in range(max_rounds):
        if budget.exhausted:
            stats.stopped = "time cap" if budget.cut_by_time else "work budget"
            return st
        m = int(np.argmax(st.costs))
        stats.rounds += 1
        cur_mx, cur_sq = st.score
        taken = False
        for tier in tiers:
            cands = candidate_moves(st, m, fanout, hot, dp_max_gb, types, moves=tier)
            best, cut = _best_candidate(st, cands, budget, chunk, stats)
            if best is not None:
                bmx, bsq, kind, change, shards, comp_row = best
                if bmx < cur_mx - EPS * max(1.0, cur_mx) or (bmx <= cur_mx + EPS and bsq < cur_sq * (1 - 1e-9)):
                    st.apply(change, shards, {d: float(comp_row[d]) for d in shards})
                    stats.accepted[kind] = stats.accepted.get(kind, 0) + 1
                    taken = True
                    break
            if cut:
                stats.stopped = "time cap" if budget.cut_by_time else "work budget"
                return st
        if not taken:
            stats.stopped = "local optimum"
            return st
    stats.stopped = "round limit"
    return st


def _best_candidate(st: State, cands, budget: WorkBudget, chunk: int, stats: SearchStats):
    """The candidate of ``cands`` with the lowest objective (and, among equals, the lowest sum of squared
    device costs), priced in chunks while the budget lasts: ``(best or None, cut short)``, the best as
    ``(objective, squares, kind, change, new shards, compute row)``."""
    model = st.model
    best = None
    evaluated, cut = 0, False
    for lo in range(0, len(cands), chunk):
        if evaluated and budget.exhausted:
            cut = True   # the budget ran out inside the round: decide among those scored
            break
        kept, changed = [], []
        built = 0
        for kind, change in cands[lo:lo + chunk]:
            shards = st.changed_shards(change)
            built += st.last_built
            if shards is not None:
                kept.append((kind, change))
                changed.append(shards)
        if not kept:
            budget.spend(len(cands[lo:lo + chunk]) * (1 + st.n / DEVICES_PER_CANDIDATE), built)
            continue
        evaluated += len(kept)
        flat, owner = [], []
        for c, shards in enumerate(changed):
            for d, ps in shards.items():
                flat.append(ps)
                owner.append((c, d))
        budget.spend(len(cands[lo:lo + chunk]) * (1 + st.n / DEVICES_PER_CANDIDATE), built, len(flat))
        comp = st.compute_many(flat)
        C = len(kept)
        comp_m = np.tile(st.comp, (C, 1))
        dims_m = np.tile(st.dims, (C, 1))
        extra_m = np.tile(st.extra, (C, 1))
        ids_m = np.tile(st.ids, (C, 1))
        kinds_m = np.tile(st.kinds, (C, 1))
        for (c, d), ps, v in zip(owner, flat, comp):
            comp_m[c, d] = v
            dims_m[c, d], extra_m[c, d], ids_m[c, d] = st.exchange_sums(ps)
            kinds_m[c, d] = model.device_kind_index(ps)
        costs = comp_m + model.comm_costs(dims_m, extra_m, ids_m)
        mx = st.slowest(comp_m, costs, kinds_m)
        sq = (costs ** 2).sum(axis=1)
        i = int(np.lexsort((sq, mx))[0])
        if best is None or (mx[i], sq[i]) < (best[0], best[1]):
            best = (float(mx[i]), float(sq[i]), kept[i][0], kept[i][1], changed[i], comp_m[i].copy())
    stats.candidates += evaluated
    if not evaluated and budget.exhausted:
        cut = True
    return best, cut
