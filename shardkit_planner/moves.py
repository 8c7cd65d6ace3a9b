"""The search's moves: one class per kind of change, each testable alone.

A move proposes candidate changes from the plan's most expensive device ``m``: ``candidates(st, m, ctx)``
returns ``(kind, {table position: new Sharding})`` pairs; the search (:mod:`shardkit_planner.search`)
prices every candidate under the cost model and takes the best one that lowers the objective. A move
never checks memory itself beyond choosing where its blocks go: :meth:`State.changed_shards` refuses a
candidate that would overflow a device.

The moves between sharding types (a table may be whole, column-wise in ``k`` blocks of any widths that
are multiples of 4, row-wise over any set of devices, grid across hosts, or replicated):

========================  ==========================================================================
:class:`MoveWhole`        a table-wise table of ``m`` to one of the cheapest devices
:class:`MoveBlock`        one column block of ``m`` to another device (a block landing beside a block
                          of its own table merges with it: a table whose blocks all meet is whole again)
:class:`Swap`             a table-wise table of ``m`` with a lighter one of a cheap device
:class:`SplitHalf`        a whole table or block of ``m`` cut in two halves, one moved away
:class:`Resplit`          a whole or column-wise table touching ``m`` re-cut into ``k`` blocks (every
                          ``k`` its dim allows, near-equal widths), placed on the cheapest devices with room
:class:`ShiftColumns`     columns moved between two blocks of one table (uneven blocks where they balance)
:class:`RowToColumn`      a row-wise or grid table touching ``m`` made column-wise in ``k`` blocks
:class:`Spread`           a heavy table of ``m`` made row-wise: over every device, over ``m`` and the
                          cheapest, or over ``m``'s host (table-row-wise)
:class:`Respread`         a row-wise table touching ``m`` over another set of devices
:class:`Grid`             a heavy table cut in two column blocks, each row-wise over a whole host
:class:`Replicate`        a small table of ``m`` made data-parallel
:class:`ReplicateGroup`   the 2, 4, 8, ... tables cheapest to replicate made data-parallel together
:class:`Gather`           a row-wise, grid or data-parallel table touching ``m`` made whole on a cheap device
========================  ==========================================================================

:data:`DEFAULT_MOVES` are the neighbourhoods the search uses, in turn (:data:`FIRST_MOVES`, then
:data:`SPLIT_MOVES` where the first has no improving move); a caller (or a test) passes its own.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from shardcore.plan import (COLUMN_WISE, DATA_PARALLEL, GRID, ROW_WISE, TABLE_WISE, Sharding, column_wise,
                            data_parallel, grid, pieces_of, row_wise, table_wise)
from shardcore.tables import DIM_MULTIPLE
from shardcore.topology import MEMORY_TOLERANCE_GB

ALL_TYPES = (TABLE_WISE, COLUMN_WISE, ROW_WISE, DATA_PARALLEL, GRID)
Change = dict   # {table position: Sharding}


@dataclass(frozen=True)
class MoveContext:
    """What every move reads besides the state: the types it may create, how wide it looks (``fanout``
    cheapest devices as destinations, the ``hot`` heaviest tables of ``m`` for the costly moves, at most
    ``max_pieces`` of ``m``'s tables), the largest table it may replicate (``dp_max_gb``), and the
    devices ordered by cost with ``m`` left out (``order``), its first ``fanout`` the destinations."""

    types: tuple
    fanout: int
    hot: int
    max_pieces: int
    dp_max_gb: float
    order: tuple
    on_m: tuple          # positions of m's tables worth moving (at most max_pieces of the heaviest)
    heavy: tuple         # the hot heaviest of them
    weight: dict         # position -> its pieces' weight on m (lookups x dim)

    @property
    def dests(self) -> tuple:
        return self.order[:self.fanout]

    def allows(self, kind: str) -> bool:
        return kind in self.types


def move_context(st, m: int, fanout: int, hot: int, dp_max_gb: float, types: Sequence[str],
                 max_pieces: int = 16) -> MoveContext:
    order = tuple(int(d) for d in np.argsort(st.costs, kind="stable") if int(d) != m)
    weight: dict[int, float] = {}
    for pos, p in st.pieces[m]:
        weight[pos] = weight.get(pos, 0.0) + p.dim * max(p.pooling_factor, 1e-3)
    ranked = sorted(weight, key=lambda pos: -weight[pos])
    return MoveContext(tuple(types), int(fanout), int(hot), int(max_pieces), float(dp_max_gb), order,
                       tuple(sorted(ranked[:max_pieces])), tuple(ranked[:hot]), weight)


# -- helpers -------------------------------------------------------------------------------------
def merge_blocks(blocks: Sequence[tuple[int, int]]) -> Sharding:
    """Column blocks ``(device, dim)`` in column order, the blocks on one device joined (in the order
    of their first block); a single device left: table-wise."""
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


def block_widths(dim: int, k: int) -> list[int] | None:
    """``k`` column widths, multiples of 4, as equal as the dim allows (wider first); None when
    the dim has fewer than ``k`` units of 4."""
    units = int(dim) // DIM_MULTIPLE
    if k < 1 or units < k or dim % DIM_MULTIPLE:
        return None
    base, rem = divmod(units, k)
    return [(base + 1) * DIM_MULTIPLE] * rem + [base * DIM_MULTIPLE] * (k - rem)


def split_counts(dim: int, ndevices: int) -> list[int]:
    """Every ``k`` a table of ``dim`` can be cut into over ``ndevices`` devices, blocks on distinct devices."""
    return [k for k in range(2, min(int(ndevices), int(dim) // DIM_MULTIPLE) + 1)]


def free_memory(st, pos: int) -> np.ndarray:
    """Per device the memory (GiB) left if table ``pos`` were taken off every device."""
    free = st.cap - st.mem.copy()
    for d, p in pieces_of(st.shardings[pos], st.tables[pos], st.n):
        free[d] += st.piece_mem(p)
    return free


def place_blocks(st, pos: int, widths: Sequence[int], prefer: Sequence[int]) -> list[tuple[int, int]] | None:
    """Devices for column blocks of ``widths`` of table ``pos`` (its current pieces taken off first),
    distinct, widest block first, each on the first device of ``prefer`` (then of the others by cost)
    with room; None where some block fits nowhere. Returns ``(device, width)`` in column order."""
    t = st.tables[pos]
    free = free_memory(st, pos)
    rank = list(dict.fromkeys(list(prefer) + [int(d) for d in np.argsort(st.costs, kind="stable")]))
    taken: set[int] = set()
    out: list[tuple[int, int] | None] = [None] * len(widths)
    for j in sorted(range(len(widths)), key=lambda j: -widths[j]):
        need = t.row * widths[j] * st.bpe
        d = next((d for d in rank if d not in taken and free[d] + MEMORY_TOLERANCE_GB >= need), None)
        if d is None:
            return None
        taken.add(d)
        free[d] -= need
        out[j] = (d, int(widths[j]))
    return out   # type: ignore[return-value]


def cheapest_with_room(st, pos: int, need_gb: float, exclude: Sequence[int] = ()) -> int | None:
    """The cheapest device (by cost) outside ``exclude`` with ``need_gb`` free once table ``pos`` is off."""
    free = free_memory(st, pos)
    for d in np.argsort(st.costs, kind="stable"):
        if int(d) not in exclude and free[int(d)] + MEMORY_TOLERANCE_GB >= need_gb:
            return int(d)
    return None


class Move(abc.ABC):
    """One kind of change (see the module notes): its candidates for the slowest device ``m``."""

    name = ""

    @abc.abstractmethod
    def candidates(self, st, m: int, ctx: MoveContext) -> list[tuple[str, Change]]:
        """``(label, change)`` pairs, each a candidate plan change that may lower device ``m``'s cost."""


# -- moves of whole tables and blocks --------------------------------------------------------------
class MoveWhole(Move):
    name = "move"

    def candidates(self, st, m, ctx):
        return [("move", {pos: table_wise(e)}) for pos in ctx.on_m if st.shardings[pos].type == TABLE_WISE
                for e in ctx.dests]


class MoveBlock(Move):
    name = "move-block"

    def candidates(self, st, m, ctx):
        out = []
        for pos in ctx.on_m:
            s = st.shardings[pos]
            if s.type != COLUMN_WISE:
                continue
            blocks = list(zip(s.devices, s.dims))
            for j, (d, w) in enumerate(blocks):
                if d != m:
                    continue
                for e in ctx.dests:
                    nb = blocks[:j] + [(e, w)] + blocks[j + 1:]
                    out.append(("move" if e not in s.devices else "merge", {pos: merge_blocks(nb)}))
        return out


class Swap(Move):
    name = "swap"

    def candidates(self, st, m, ctx):
        def w_of(pos):
            return st.tables[pos].dim * max(st.tables[pos].pooling_factor, 1e-3)

        ranked = sorted(ctx.weight, key=lambda pos: -ctx.weight[pos])
        tw_m = [pos for pos in ranked[: max(ctx.hot, ctx.max_pieces // 2)] if st.shardings[pos].type == TABLE_WISE]
        out = []
        for e in ctx.dests[: max(1, ctx.fanout // 3)]:
            tw_e = sorted((pos for pos, _ in st.pieces[e] if st.shardings[pos].type == TABLE_WISE), key=w_of,
                          reverse=True)
            for a in tw_m:
                lighter = [b for b in tw_e if w_of(b) < ctx.weight[a]][:ctx.max_pieces // 2]
                out.extend(("swap", {a: table_wise(e), b: table_wise(m)}) for b in lighter)
        return out


class SplitHalf(Move):
    name = "split"

    def candidates(self, st, m, ctx):
        if not ctx.allows(COLUMN_WISE):
            return []
        out = []
        halves = ctx.dests[: max(1, ctx.fanout // 2)]
        for pos in ctx.on_m:
            s, t = st.shardings[pos], st.tables[pos]
            if s.type == TABLE_WISE and t.dim % (2 * DIM_MULTIPLE) == 0:
                out.extend(("split", {pos: column_wise([(m, t.dim // 2), (e, t.dim // 2)])}) for e in halves)
            elif s.type == COLUMN_WISE:
                blocks = list(zip(s.devices, s.dims))
                for j, (d, w) in enumerate(blocks):
                    if d == m and w % (2 * DIM_MULTIPLE) == 0:
                        out.extend(("split", {pos: merge_blocks(blocks[:j] + [(m, w // 2), (e, w // 2)] + blocks[j + 1:])})
                                   for e in halves)
        return out


def _touching_m(st, m: int, ctx: MoveContext, kinds: Sequence[str]) -> list[int]:
    """The tables of types ``kinds`` with a piece on ``m``, heaviest first (at most ``max_pieces``)."""
    return [pos for pos in sorted(ctx.weight, key=lambda pos: -ctx.weight[pos])
            if st.shardings[pos].type in kinds][:ctx.max_pieces]


def counts_to_try(st, pos: int, now: int) -> list[int]:
    """The block counts worth trying for table ``pos``, now in ``now`` blocks (1: whole; a row-wise
    table: its devices): one more and one fewer, half and double, 2, 4 and 8, as many as there are
    devices (or units of 4 columns), and the fewest whose widest block fits the device with the most
    room once the table is off every device."""
    t = st.tables[pos]
    ks = split_counts(t.dim, st.n)
    if not ks:
        return []
    room = float(free_memory(st, pos).max())
    fit = next((k for k in ks if t.row * block_widths(t.dim, k)[0] * st.bpe <= room + MEMORY_TOLERANCE_GB), None)
    want = {now - 1, now + 1, now // 2, 2 * now, 2, 4, 8, ks[-1]} | ({fit} if fit else set())
    return [k for k in ks if k in want and k != now]


class Resplit(Move):
    """A whole or column-wise table touching ``m`` re-cut into ``k`` near-equal blocks on distinct
    devices: its lookups (every block looks up every id) and outputs (a block's share of the columns)
    spread over ``k`` devices; ``k`` from :func:`counts_to_try`."""

    name = "resplit"

    def candidates(self, st, m, ctx):
        if not ctx.allows(COLUMN_WISE) or st.n < 2:
            return []
        out = []
        for pos in _touching_m(st, m, ctx, (TABLE_WISE, COLUMN_WISE))[:ctx.hot]:
            s, t = st.shardings[pos], st.tables[pos]
            now = 1 if s.type == TABLE_WISE else len(s.devices)
            for k in counts_to_try(st, pos, now):
                blocks = place_blocks(st, pos, block_widths(t.dim, k), ctx.dests)
                if blocks is not None:
                    out.append(("resplit", {pos: merge_blocks(blocks)}))
        return out


class ShiftColumns(Move):
    """Columns of a table moved from its block on ``m`` to its block on a cheaper device: the blocks
    become uneven, so a device's share of a wide table follows its load (half or a quarter of the
    block on ``m``, at least 4 columns)."""

    name = "shift"

    def candidates(self, st, m, ctx):
        if not ctx.allows(COLUMN_WISE):
            return []
        out = []
        for pos in _touching_m(st, m, ctx, (COLUMN_WISE,)):
            s = st.shardings[pos]
            blocks = list(zip(s.devices, s.dims))
            j = next(i for i, (d, _) in enumerate(blocks) if d == m)
            w = blocks[j][1]
            amounts = sorted({a for a in (w // 2, w // 4) if a >= DIM_MULTIPLE and a % DIM_MULTIPLE == 0 and a < w})
            others = sorted((i for i, (d, _) in enumerate(blocks) if d != m), key=lambda i: st.costs[blocks[i][0]])
            for i in others[:2]:
                for a in amounts:
                    nb = list(blocks)
                    nb[j] = (m, w - a)
                    nb[i] = (blocks[i][0], blocks[i][1] + a)
                    out.append(("shift", {pos: column_wise(nb)}))
        return out


class RowToColumn(Move):
    """A row-wise or grid table touching ``m`` made column-wise in ``k`` blocks (every count worth
    trying up to the devices, placed on the cheapest with room): a row block sends its partial sums for
    the whole batch at the table's full width, a column block only its own columns, so a table of few
    lookups per sample is far cheaper to exchange cut by columns."""

    name = "row-to-column"

    def candidates(self, st, m, ctx):
        if not ctx.allows(COLUMN_WISE) or st.n < 2:
            return []
        out = []
        for pos in _touching_m(st, m, ctx, (ROW_WISE, GRID))[:ctx.hot]:
            t = st.tables[pos]
            now = len(st.shardings[pos].devices)
            ks = counts_to_try(st, pos, 0)
            for k in ks + ([now] if now in split_counts(t.dim, st.n) and now not in ks else []):
                blocks = place_blocks(st, pos, block_widths(t.dim, k), ctx.dests)
                if blocks is not None:
                    out.append(("row-to-column", {pos: merge_blocks(blocks)}))
        return out


class Spread(Move):
    """A heavy whole or column-wise table of ``m`` made row-wise: over every device, over ``m`` and
    the 1 or 3 cheapest, or over ``m``'s host where there are hosts (table-row-wise)."""

    name = "row-wise"

    def candidates(self, st, m, ctx):
        if not ctx.allows(ROW_WISE) or st.n < 2:
            return []
        out = []
        g = getattr(st.model.comm, "devices_per_host", 0)
        for pos in ctx.heavy:
            if st.shardings[pos].type in (ROW_WISE, DATA_PARALLEL, GRID):
                continue
            out.append(("row-wise", {pos: row_wise(range(st.n))}))
            for k in (2, 4):
                if k < st.n:
                    out.append(("row-wise", {pos: row_wise([m] + list(ctx.order[: k - 1]))}))
            if g and st.n > g:   # table-row-wise: over m's host, its ids and outputs stay off the network
                host = list(range(m - m % g, min(st.n, m - m % g + g)))
                if len(host) > 1:
                    out.append(("row-wise", {pos: row_wise(host)}))
        return out


class Respread(Move):
    """A row-wise table touching ``m`` re-spread: over half as many devices without ``m``, over twice
    as many, or with ``m`` swapped for the cheapest device it leaves out."""

    name = "re-spread"

    def candidates(self, st, m, ctx):
        if not ctx.allows(ROW_WISE) or st.n < 2:
            return []
        out = []
        for pos in _touching_m(st, m, ctx, (ROW_WISE,))[:ctx.hot]:
            devs = list(st.shardings[pos].devices)
            outside = [d for d in ctx.order if d not in devs]
            options = []
            if len(devs) > 2:
                options.append([d for d in devs if d != m][: len(devs) // 2])
            if outside:
                options.append(list(devs) + outside[: len(devs)])
                options.append([outside[0] if d == m else d for d in devs])
            for new in options:
                if len(new) >= 2 and sorted(new) != sorted(devs):
                    out.append(("re-spread", {pos: row_wise(new)}))
        return out


class Grid(Move):
    name = "grid"

    def candidates(self, st, m, ctx):
        g = getattr(st.model.comm, "devices_per_host", 0)
        n = st.n
        if not ctx.allows(GRID) or not g or n < 2 * g or n % g:
            return []
        out = []
        load = st.costs.reshape(n // g, g).sum(axis=1)
        mine = m // g
        other = min((h for h in range(n // g) if h != mine), key=lambda h: (load[h], h))
        for pos in ctx.heavy:
            s, t = st.shardings[pos], st.tables[pos]
            if s.type in (ROW_WISE, DATA_PARALLEL, GRID) or t.dim % (2 * DIM_MULTIPLE):
                continue
            # the columns in two blocks, each row-wise over a whole host, m's and the cheapest other
            out.append(("grid", {pos: grid([(range(mine * g, mine * g + g), t.dim // 2),
                                             (range(other * g, other * g + g), t.dim // 2)])}))
        return out


class Replicate(Move):
    """A small table of ``m`` made data-parallel: its lookups spread over every device and its pooled
    outputs leave the all-to-all, for an all-reduce of its small weights; the heavy ones, every small
    one alone, and all of them at once."""

    name = "replicate"

    def candidates(self, st, m, ctx):
        if not ctx.allows(DATA_PARALLEL) or st.n < 2:
            return []
        out, dp = [], data_parallel(st.n)
        for pos in ctx.heavy:
            s, t = st.shardings[pos], st.tables[pos]
            if s.type not in (ROW_WISE, DATA_PARALLEL, GRID) and t.memory_gb(st.precision) <= ctx.dp_max_gb:
                out.append(("replicate", {pos: dp}))
        ranked = sorted(ctx.weight, key=lambda pos: -ctx.weight[pos])
        small = [pos for pos in ranked if st.shardings[pos].type == TABLE_WISE and pos not in ctx.heavy
                 and st.tables[pos].memory_gb(st.precision) <= ctx.dp_max_gb]
        out.extend(("replicate", {pos: dp}) for pos in small[:ctx.max_pieces])
        if len(small) > 1:
            out.append(("replicate", {pos: dp for pos in small}))
        return out


REPLICATE_GROUP_MAX = 64


class ReplicateGroup(Move):
    """The whole tables of any device that cost least to replicate (fewest rows per lookup: the
    all-reduce per lookup spread) made data-parallel together, 2, 4, 8, ... of them: the first replica
    pays the replicas' kernel on every device, so one at a time never pays off where several together
    do (a task whose split tables fill the exchange with their widths). At most
    :data:`REPLICATE_GROUP_MAX` at once (a group of hundreds changes every piece of every device)."""

    name = "replicate-group"

    def candidates(self, st, m, ctx):
        if not ctx.allows(DATA_PARALLEL) or st.n < 2:
            return []
        cheap = sorted((pos for pos, sh in enumerate(st.shardings) if sh.type == TABLE_WISE
                        and st.tables[pos].memory_gb(st.precision) <= ctx.dp_max_gb),
                       key=lambda pos: (st.tables[pos].row / max(st.tables[pos].pooling_factor, 0.01), pos))
        out, size, dp = [], 2, data_parallel(st.n)
        while size <= min(len(cheap), REPLICATE_GROUP_MAX):
            out.append(("replicate-group", {pos: dp for pos in cheap[:size]}))
            size *= 2
        return out


class Gather(Move):
    """A row-wise, grid or data-parallel table touching ``m`` made whole on one of the two cheapest
    devices with room for it."""

    name = "gather"

    def candidates(self, st, m, ctx):
        out = []
        for pos in ctx.on_m:
            if st.shardings[pos].type in (TABLE_WISE, COLUMN_WISE):
                continue
            out.extend(("gather", {pos: table_wise(e)}) for e in ctx.dests[:2])
        return out


# The search's neighbourhoods, tried in turn each round: the second only where the first has no move that
# lowers the objective (a variable neighbourhood descent). The first holds the moves of whole tables,
# halves, spreads and replicas; the second re-cuts tables into k blocks, makes row-wise tables
# column-wise, shifts columns between blocks, re-spreads row-wise tables and replicates groups of tables: moves with many variants per table, priced only at the
# first neighbourhood's local optima, so a task the first settles is searched as cheaply as without them.
FIRST_MOVES: tuple[Move, ...] = (MoveWhole(), MoveBlock(), SplitHalf(), Gather(), Swap(), Spread(), Grid(), Replicate())
SPLIT_MOVES: tuple[Move, ...] = (Resplit(), RowToColumn(), ShiftColumns(), Respread(), ReplicateGroup())
DEFAULT_MOVES: tuple[tuple[Move, ...], ...] = (FIRST_MOVES, SPLIT_MOVES)


def candidate_moves(st, m: int, fanout: int, hot: int, dp_max_gb: float, types: Sequence[str] = ALL_TYPES,
                    max_pieces: int = 16, moves: Sequence[Move] = FIRST_MOVES + SPLIT_MOVES
                    ) -> list[tuple[str, Change]]:
    """Every candidate of ``moves`` from device ``m`` (only changes whose new shardings are of
    ``types``; table-wise is always allowed)."""
    ctx = move_context(st, m, fanout, hot, dp_max_gb, types, max_pieces)
    out = []
    allowed = set(types) | {TABLE_WISE}
    for mv in moves:
        for kind, change in mv.candidates(st, m, ctx):
            if all(s.type in allowed for s in change.values()):
                out.append((kind, change))
    return out
