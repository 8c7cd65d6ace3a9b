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

**Moves** (every one from the most expensive device ``m``, to one of the ``fanout`` cheapest devices
``e`` with room):

* *move*: a table-wise table, or one column block of a column-wise table, from ``m`` to ``e`` (a block
  landing where the same table already has a block merges with it: *merge splits back*; a table whose
  blocks all end up on one device becomes table-wise again);
* *swap*: a table-wise table of ``m`` with one of ``e``;
* *split*: a table-wise table (or a block) of ``m`` cut column-wise into two halves, one moved to ``e``
  (dims stay multiples of 4);
* *row-wise*: a hot table of ``m`` spread row-wise over every device, or over ``m`` and the cheapest ones,
  or (with hosts) over ``m``'s host: table-row-wise;
* *grid* (with hosts): a hot table of ``m`` cut into two column blocks, each row-wise over a whole host,
  ``m``'s and the least loaded other;
* *replicate*: a small hot table of ``m`` made data-parallel (a replica on every device);
* *gather*: a row-wise, grid or data-parallel table touching ``m`` made table-wise on ``e``.

A local optimum of these moves is left by a *kick* and a new search from there -- an iterated local
search, run by the sharder while its budget lasts, keeping the best plan found. A kick is either a few
random moves taken whatever they cost (:func:`kick`) or a *ruin and recreate* (:func:`recreate`): a
random share of the whole tables taken off their devices and put back, heaviest first, each where the
load is least by then -- a rebalancing of many tables at once, which single moves from the slowest
device cannot make once replicas fill every device.

Each round scores the candidate moves in chunks (one batched compute prediction for every changed
device shard of a chunk, remembered by shard contents; the exchanges of every candidate in one
array operation) and takes the best. The search stops at a local optimum, after ``max_rounds`` or
when ``deadline`` (``time.perf_counter()``) passes, checked between chunks: a chunk is begun only if it
would end by then at the last chunk's pace.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from shardcore.plan import (COLUMN_WISE, DATA_PARALLEL, GRID, ROW_WISE, TABLE_WISE, Plan, Sharding, column_wise, grid,
                            data_parallel, row_wise, table_wise)
from shardcore.plan import piece_key
from shardcore.tables import DIM_MULTIPLE, GB, TableConfig, bytes_per_element

from .costmodel import CostModel

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
                 ndevices: int, max_memory_gb: float, precision: str):
        self.model, self.tables, self.n = model, list(tables), int(ndevices)
        self.cap, self.precision = float(max_memory_gb), precision
        self.bpe = bytes_per_element(precision) / GB
        self._comp_cache: dict[tuple, float] = {}
        self._exch_cache: dict[tuple, tuple[float, float, float]] = {}
        self.shardings = list(shardings)
        self.pieces: list[list[tuple[int, TableConfig]]] = [[] for _ in range(self.n)]
        self.pos_devices: list[set[int]] = [set() for _ in self.tables]
        for pos, (t, s) in enumerate(zip(self.tables, self.shardings)):
            for d, p in s.pieces(t, self.n):
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

    def plan(self) -> Plan:
        return Plan.from_shardings(self.tables, self.shardings, self.n)

    # -- a candidate: new shardings for some table positions -------------------------------------
    def changed_shards(self, change: dict[int, Sharding]) -> dict[int, list[TableConfig]] | None:
        """The new piece lists of the devices a change touches; None if a device would overflow."""
        touched: dict[int, None] = {}
        new_on: dict[int, list[TableConfig]] = {}
        for pos, s in change.items():
            for d in self.pos_devices[pos]:
                touched.setdefault(d, None)
            for d, p in s.pieces(self.tables[pos], self.n):
                touched.setdefault(d, None)
                new_on.setdefault(d, []).append(p)
        out = {}
        for d in touched:
            kept = [p for pos, p in self.pieces[d] if pos not in change]
            added = new_on.get(d, [])
            if added:
                removed = self.mem[d] - sum(self.piece_mem(p) for p in kept)
                if self.mem[d] - removed + sum(self.piece_mem(p) for p in added) > self.cap + 1e-12:
                    return None
            out[d] = kept + added
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
            self.pos_devices[pos] = {d for d, _ in s.pieces(self.tables[pos], self.n)}
        for d in shards:
            self.pieces[d] = [(pos, p) for pos, p in self.pieces[d] if pos not in change]
        for pos, s in change.items():
            for d, p in s.pieces(self.tables[pos], self.n):
                self.pieces[d].append((pos, p))
        for d, ps in shards.items():
            self.mem[d] = sum(self.piece_mem(p) for p in ps)
            self.comp[d] = comp[d]
            self.dims[d] = sum(self.model.pooled_dim(p) for p in ps)
            self.extra[d] = sum(self.model.extra_bytes(p, self.n) for p in ps)
            self.ids[d] = sum(self.model.id_width(p) for p in ps)
            self.kinds[d] = self.model.device_kind_index(ps)
        self.costs = self.comp + self.model.comm_costs(self.dims, self.extra, self.ids)


def _merge_blocks(blocks: list[tuple[int, int]]) -> Sharding:
    """Column blocks in order, consecutive ... blocks on one device joined; one block: table-wise."""
    by_dev: dict[int, int] = {}
    order: list[int] = []
    for d, w in blocks:
        if d not in by_dev:
            order.append(d)
            by_dev[d] = 0
        by_dev[d] += w
    if len(order) == 1:
        return table_wise(order[0])
    return column_wise([(d, by_dev[d]) for d in order])


ALL_TYPES = (TABLE_WISE, COLUMN_WISE, ROW_WISE, DATA_PARALLEL, GRID)


def candidate_moves(st: State, m: int, fanout: int, hot: int, dp_max_gb: float,
                    types: Sequence[str] = ALL_TYPES, max_pieces: int = 16) -> list[tuple[str, dict[int, Sharding]]]:
    """The moves from the most expensive device ``m`` (see the module notes); only moves whose new
    sharding is of one of ``types`` (table-wise is always allowed). On a device with many pieces only
    its ``max_pieces`` heaviest are moved, split or swapped (bounded rounds on large tasks)."""
    cw, rw, dp, gr = COLUMN_WISE in types, ROW_WISE in types, DATA_PARALLEL in types, GRID in types
    n = st.n
    order = [int(d) for d in np.argsort(st.costs, kind="stable") if int(d) != m]
    dests = order[:fanout]
    out: list[tuple[str, dict[int, Sharding]]] = []
    on_m = sorted({pos for pos, _ in st.pieces[m]})
    # the heaviest tables of m by the model's standalone cost of their piece there, for the costly moves
    weight = {}
    for pos, p in st.pieces[m]:
        weight[pos] = weight.get(pos, 0.0) + p.dim * max(p.pooling_factor, 1e-3)
    ranked = sorted(on_m, key=lambda pos: -weight[pos])
    heavy = ranked[:hot]
    on_m = sorted(ranked[:max_pieces])
    for pos in on_m:
        s, t = st.shardings[pos], st.tables[pos]
        if s.type == TABLE_WISE:
            for e in dests:
                out.append(("move", {pos: table_wise(e)}))
            if cw and t.dim % (2 * DIM_MULTIPLE) == 0:
                half = t.dim // 2
                for e in dests[: max(1, fanout // 2)]:
                    out.append(("split", {pos: column_wise([(m, half), (e, half)])}))
        elif s.type == COLUMN_WISE:
            blocks = list(zip(s.devices, s.dims))
            for j, (d, w) in enumerate(blocks):
                if d != m:
                    continue
                for e in dests:
                    nb = blocks[:j] + [(e, w)] + blocks[j + 1:]
                    out.append(("move" if e not in s.devices else "merge", {pos: _merge_blocks(nb)}))
                if cw and w % (2 * DIM_MULTIPLE) == 0:
                    for e in dests[: max(1, fanout // 2)]:
                        nb = blocks[:j] + [(m, w // 2), (e, w // 2)] + blocks[j + 1:]
                        out.append(("split", {pos: _merge_blocks(nb)}))
        else:   # row-wise / data-parallel touching m: gather it on one device
            for e in dests[:2]:
                out.append(("gather", {pos: table_wise(e)}))
    # swaps of a table-wise table of m with a lighter one of its cheapest peers
    def w_of(pos):
        return st.tables[pos].dim * max(st.tables[pos].pooling_factor, 1e-3)

    tw_m = [pos for pos in ranked[: max(hot, max_pieces // 2)] if st.shardings[pos].type == TABLE_WISE]
    for e in dests[: max(1, fanout // 3)]:
        tw_e = sorted((pos for pos, _ in st.pieces[e] if st.shardings[pos].type == TABLE_WISE), key=w_of,
                      reverse=True)
        for a in tw_m:
            wa = weight[a]
            lighter = [b for b in tw_e if w_of(b) < wa][:max_pieces // 2]
            for b in lighter:
                out.append(("swap", {a: table_wise(e), b: table_wise(m)}))
    g = getattr(st.model.comm, "devices_per_host", 0)   # hosts of g devices (0: one host)
    if n >= 2:
        for pos in heavy:
            s, t = st.shardings[pos], st.tables[pos]
            if s.type in (ROW_WISE, DATA_PARALLEL, GRID):
                continue
            if rw:
                out.append(("row-wise", {pos: row_wise(range(n))}))
                for k in (2, 4):
                    if k < n:
                        out.append(("row-wise", {pos: row_wise([m] + order[: k - 1])}))
                if g and n > g:   # table-row-wise: over m's host, its ids and outputs stay off the network
                    host = list(range(m - m % g, min(n, m - m % g + g)))
                    if len(host) > 1:
                        out.append(("row-wise", {pos: row_wise(host)}))
            if gr and g and n >= 2 * g and n % g == 0 and t.dim % (2 * DIM_MULTIPLE) == 0:
                # grid: the columns in two blocks, each row-wise over a whole host, m's and the cheapest other
                load = st.costs.reshape(n // g, g).sum(axis=1)
                mine = m // g
                other = min((h for h in range(n // g) if h != mine), key=lambda h: (load[h], h))
                out.append(("grid", {pos: grid([(range(mine * g, mine * g + g), t.dim // 2),
                                                 (range(other * g, other * g + g), t.dim // 2)])}))
            if dp and t.memory_gb(st.precision) <= dp_max_gb:
                out.append(("replicate", {pos: data_parallel(n)}))
        if dp:
            # small tables of m (not only its heaviest): a replica's lookups spread over every device and
            # its pooled outputs leave the all-to-all, for an all-reduce of its small weights (measured on
            # an H200: TorchRec's plans gain most of their lead this way); one at a time, and all at once
            small = [pos for pos in ranked if st.shardings[pos].type == TABLE_WISE and pos not in heavy
                     and st.tables[pos].memory_gb(st.precision) <= dp_max_gb]
            for pos in small[:max_pieces]:
                out.append(("replicate", {pos: data_parallel(n)}))
            if len(small) > 1:
                out.append(("replicate", {pos: data_parallel(n) for pos in small}))
    return out


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


CHUNK_PIECES = 20000   # candidates scored together hold about this many pieces per touched device, at most


def local_search(st: State, deadline: float, *, fanout: int = 6, hot: int = 3, max_rounds: int = 100000,
                 dp_max_gb: float = 0.05, types: Sequence[str] = ALL_TYPES, chunk: int = 64,
                 stats: SearchStats | None = None) -> State:
    """Improve ``st`` in place until a local optimum, ``max_rounds`` or ``deadline``."""
    stats = stats or SearchStats()
    stats.accepted = stats.accepted or {}
    model = st.model
    # a chunk's cost grows with the pieces per device: fewer candidates per chunk on large tasks, so
    # the deadline is looked at every few hundredths of a second at 100k tables too
    chunk = max(1, min(chunk, CHUNK_PIECES // max(1, len(st.tables) // st.n)))
    last = 0.0   # the last chunk's time: one is begun only if it ends by the deadline
    for _ in range(max_rounds):
        if time.perf_counter() + last > deadline:
            stats.stopped = "time budget"
            return st
        m = int(np.argmax(st.costs))
        cands = candidate_moves(st, m, fanout, hot, dp_max_gb, types)
        stats.rounds += 1
        best = None   # (max, sq, kind, change, shards, comp row)
        evaluated, cut = 0, False
        for lo in range(0, len(cands), chunk):
            if evaluated and time.perf_counter() + last > deadline:
                cut = True   # the budget ran out inside the round: decide among those scored
                break
            t_chunk = time.perf_counter()
            kept, changed = [], []
            for kind, change in cands[lo:lo + chunk]:
                shards = st.changed_shards(change)
                if shards is not None:
                    kept.append((kind, change))
                    changed.append(shards)
            if not kept:
                continue
            evaluated += len(kept)
            flat, owner = [], []
            for c, shards in enumerate(changed):
                for d, ps in shards.items():
                    flat.append(ps)
                    owner.append((c, d))
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
            last = time.perf_counter() - t_chunk
        stats.candidates += evaluated
        if best is None:
            stats.stopped = "no feasible move"
            return st
        cur_mx, cur_sq = st.score
        bmx, bsq, kind, change, shards, comp_row = best
        if bmx < cur_mx - EPS * max(1.0, cur_mx) or (bmx <= cur_mx + EPS and bsq < cur_sq * (1 - 1e-9)):
            st.apply(change, shards, {d: float(comp_row[d]) for d in shards})
            stats.accepted[kind] = stats.accepted.get(kind, 0) + 1
        else:
            stats.stopped = "time budget" if cut else "local optimum"
            return st
    stats.stopped = "round limit"
    return st
