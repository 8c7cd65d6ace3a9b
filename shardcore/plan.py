"""The sharding plan: per task table one sharding, and the pieces of work it gives each device.

Five sharding types (the moves of production planners such as TorchRec's):

* ``table_wise(device)`` (TW): the whole table on one device;
* ``column_wise([(device, dim), ...])`` (CW, and TorchRec's table-column-wise): the table's columns
  cut into blocks of the given dims (uneven allowed, each a multiple of 4), in column order, each
  block on its device (same rows, same lookups);
* ``row_wise(devices)`` (RW, and TorchRec's table-row-wise on one host's devices): the rows cut into
  ``k = len(devices)`` equal ranges of ``ceil(rows / k)`` (the last may be shorter), range ``j`` on
  ``devices[j]``; a device looks up only the batch's indices that fall in its range;
* ``grid([(devices, dim), ...])`` (TorchRec's grid_shard): column blocks as CW, each row-wise over its
  own devices (normally one host's; the same count per block), its pieces RW pieces of the block's dim;
* ``data_parallel`` (DP): a full replica on every device, each looking up its own slice of the batch.

What a device computes is :func:`device_kernels`: its model-parallel pieces (TW, CW, RW) fused in
one kernel over the whole batch ``B``, and its data-parallel replicas in a second kernel over its
batch slice only (``B_d`` samples, :func:`batch_slices`), as a training step runs them (a replica's
pooled outputs are its own samples', never exchanged). Every oracle and cost model prices a
device's compute as these kernels.

A plan expands into **pieces** (:class:`ShardPiece`, a :class:`~shardcore.tables.TableConfig` with
the rows and dim the device holds, and for RW the row range, for DP the batch slice); ``allocation``
then gives the device of every piece, ``shards`` the pieces per device. Memory per device counts
each piece's rows x dims (a DP table counts on every device).

Plans made of table-wise tables and *uniform* column splits keep today's compact form, which is
lossless: ``Plan(allocation, ndevices, splits)`` (``splits[i] = k`` cuts table ``i`` into ``k`` column
shards of ``dim / k``; the allocation covers the expanded table list, table ``i`` as ``k``
consecutive shards). Plans with row-wise, grid, data-parallel or uneven column-wise tables carry their
``shardings`` (:meth:`Plan.from_shardings` chooses the form). :meth:`Plan.table_shardings` gives
every plan's per-table shardings, and :func:`shardings_to_json` / :func:`shardings_from_json`
their JSON form (``eval.py --out``'s ``"shardings"``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Sequence

from shardcore.errors import ShardError
from shardcore.tables import DIM_MULTIPLE, TableConfig

TABLE_WISE, COLUMN_WISE, ROW_WISE, DATA_PARALLEL, GRID = "table_wise", "column_wise", "row_wise", "data_parallel", "grid"
SHARDING_TYPES = (TABLE_WISE, COLUMN_WISE, ROW_WISE, DATA_PARALLEL, GRID)


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


def row_blocks(rows: int, k: int) -> list[int]:
    """Rows of each of ``k`` row-wise shards: ``ceil(rows / k)`` each, the last ones shorter (as
    TorchRec's row-wise sharding; with fewer rows than shards, the trailing shards hold 0 rows)."""
    if k < 1:
        raise ShardError(f"a row-wise sharding needs at least one device, got {k}")
    block = -(-int(rows) // k)
    out, left = [], int(rows)
    for _ in range(k):
        out.append(min(block, left))
        left -= out[-1]
    return out


@dataclass(frozen=True)
class ShardPiece(TableConfig):
    """The part of a table one device holds, as a table: ``row`` x ``dim`` weights.

    ``kind``: ``table_wise``/``column_wise`` (the whole batch's lookups of the table),
    ``row_wise`` (rows ``row_start .. row_start + row - 1`` of a table of ``full_row`` rows: only the
    batch's indices in that range, shifted to start at 0; its ``pooling_factor`` the table's times
    the row share, an estimate) or ``data_parallel`` (the lookups of batch slice ``batch_part =
    (j, n)``: slice ``j`` of the batch split evenly over ``n`` devices, the first ``B mod n`` taking
    one more sample (:func:`batch_slices`), looked up in its own kernel over those samples only
    (:func:`device_kernels`); its ``pooling_factor`` is the table's, per sample of the slice).
    """

    kind: str = TABLE_WISE
    row_start: int = 0
    full_row: int = 0
    batch_part: tuple[int, int] | None = None

    @property
    def special(self) -> bool:
        """Whether the piece's lookups differ from its table's full batch (RW or DP)."""
        return self.kind in (ROW_WISE, DATA_PARALLEL)

    @functools.cached_property
    def key(self) -> tuple:   # what the piece is, kept once made (a search asks millions of times)
        return (int(self.index), int(self.row), int(self.dim), self.kind, int(self.row_start),
                int(self.full_row), tuple(self.batch_part) if self.batch_part else None)


def batch_slices(batch_size: int, ndevices: int) -> list[int]:
    """Samples per device: ``B`` split evenly, the first ``B mod n`` devices taking one more."""
    base, rem = divmod(int(batch_size), int(ndevices))
    return [base + (1 if j < rem else 0) for j in range(ndevices)]


def local_batch(t: TableConfig, batch_size: int) -> int:
    """The samples a piece is looked up for: a data-parallel replica's batch slice, else the batch."""
    part = getattr(t, "batch_part", None)
    if getattr(t, "kind", None) == DATA_PARALLEL and part is not None:
        j, n = part
        return batch_slices(batch_size, n)[j]
    return int(batch_size)


def device_kernels(shard: Sequence[TableConfig], batch_size: int) -> list[tuple[int, list[TableConfig]]]:
    """The fused kernels a device runs for its pieces, as ``(batch, pieces)``: its model-parallel
    pieces (table-wise, column-wise, row-wise) in one kernel over the whole batch, then its
    data-parallel replicas in another over the device's batch slice (one per distinct slice, normally
    one). Empty kernels are left out, so a shard of whole tables is one kernel at ``batch_size``."""
    mp = [t for t in shard if getattr(t, "kind", None) != DATA_PARALLEL]
    out = [(int(batch_size), mp)] if mp else []
    dp: dict = {}
    for t in shard:
        if getattr(t, "kind", None) == DATA_PARALLEL:
            dp.setdefault(tuple(t.batch_part) if t.batch_part else None, []).append(t)
    out.extend((local_batch(ts[0], batch_size), ts) for ts in dp.values())
    return out


def has_pieces(shard: Sequence[TableConfig]) -> bool:
    """Whether a device's shard holds a row-wise or data-parallel piece: its lookups are not its
    tables' full batch, so the measurement cache (which keys a shard by its tables' index, rows and
    dim) neither stores nor answers it, nor the plan it belongs to."""
    return any(getattr(t, "special", False) for t in shard)


def piece_key(t: TableConfig) -> tuple:
    """What a device's piece of work is, for operators kept between measurements."""
    return t.key   # (index, rows, dim) of a whole table; a ShardPiece's says which part (both kept once made)


@dataclass(frozen=True)
class Sharding:
    """How one table is sharded: ``type`` and its ``devices``; ``dims`` (column-wise, one per device,
    in column order) or, for row-wise, ``devices[j]`` holds row block ``j``; data-parallel lists
    every device; grid: ``dims`` per column block, ``devices`` the blocks' ``k`` each, concatenated."""

    type: str
    devices: tuple[int, ...]
    dims: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.type not in SHARDING_TYPES:
            raise ShardError(f"unknown sharding type {self.type!r}: choose one of {', '.join(SHARDING_TYPES)}")
        if not self.devices:
            raise ShardError(f"a {self.type} sharding needs at least one device")
        if self.type == TABLE_WISE and len(self.devices) != 1:
            raise ShardError(f"a table_wise sharding has one device, got {len(self.devices)}")
        if self.type in (COLUMN_WISE, GRID):
            if not self.dims or len(self.devices) % len(self.dims) or (
                    self.type == COLUMN_WISE and len(self.dims) != len(self.devices)):
                per = "device" if self.type == COLUMN_WISE else "column block, and as many devices in every block"
                raise ShardError(f"a {self.type} sharding needs one dim per {per}")
            bad = [d for d in self.dims if d <= 0 or d % DIM_MULTIPLE]
            if bad:
                raise ShardError(f"{self.type} dims must be positive multiples of {DIM_MULTIPLE}, got {bad[0]}")
        elif self.dims is not None:
            raise ShardError(f"only column_wise and grid shardings have dims ({self.type} got {list(self.dims)})")
        if self.type in (ROW_WISE, DATA_PARALLEL, GRID) and len(set(self.devices)) != len(self.devices):
            raise ShardError(f"a {self.type} sharding names each device once, got {list(self.devices)}")

    def check(self, table: TableConfig, ndevices: int, where: str = "table") -> None:
        bad = [d for d in self.devices if not 0 <= int(d) < ndevices]
        if bad:
            raise ShardError(f"{where}: {self.type} sharding puts a shard on device {bad[0]}, "
                             f"but there are {ndevices} devices")
        if self.dims is not None and sum(self.dims) != table.dim:
            raise ShardError(f"{where}: {self.type} dims {list(self.dims)} add up to {sum(self.dims)}, "
                             f"not the table's dim {table.dim}")
        if self.type == DATA_PARALLEL and sorted(self.devices) != list(range(ndevices)):
            raise ShardError(f"{where}: a data_parallel table is replicated on every device "
                             f"(0..{ndevices - 1}), got {list(self.devices)}")

    def pieces(self, table: TableConfig, ndevices: int) -> list[tuple[int, TableConfig]]:
        """``(device, piece)`` for every non-empty piece, in column / row / device order."""
        base = TableConfig(table.index, table.row, table.dim, table.pooling_factor, table.bins, table.length_cv)
        if self.type == TABLE_WISE:
            return [(int(self.devices[0]), base)]
        if self.type == COLUMN_WISE:
            return [(int(d), base.with_dim(int(w))) for d, w in zip(self.devices, self.dims)]
        if self.type in (ROW_WISE, GRID):   # grid: each column block row-wise over its k devices
            out, dims = [], self.dims or (table.dim,)
            k = len(self.devices) // len(dims)
            for j, w in enumerate(dims):
                start = 0
                for d, rows in zip(self.devices[j * k:(j + 1) * k], row_blocks(table.row, k)):
                    if rows > 0:
                        # the piece's pooling factor: the table's, in proportion to its rows (an estimate
                        # for proxies only; the measured lookups are the real ones in the range); its
                        # bag-length spread is not the table's (fewer lookups per sample): unknown
                        out.append((int(d), ShardPiece(table.index, rows, int(w),
                                                       table.pooling_factor * rows / table.row, table.bins,
                                                       None, kind=ROW_WISE, row_start=start, full_row=table.row)))
                    start += rows
            return out
        n = ndevices
        # a replica's own kernel runs over its batch slice: the table's lookups per sample
        return [(int(d), ShardPiece(table.index, table.row, table.dim, table.pooling_factor, table.bins,
                                    table.length_cv, kind=DATA_PARALLEL, full_row=table.row, batch_part=(int(d), n)))
                for d in sorted(self.devices)]

    def legacy(self, dim: int) -> tuple[int, tuple[int, ...]] | None:
        """``(k, devices)`` when this is table-wise or a uniform column split (today's compact form)."""
        if self.type == TABLE_WISE:
            return 1, tuple(self.devices)
        if self.type == COLUMN_WISE and len(set(self.dims)) == 1 and self.dims[0] * len(self.dims) == dim:
            return len(self.dims), tuple(self.devices)
        return None

    def to_json(self, table: TableConfig | None = None) -> dict:
        out: dict[str, Any] = {"type": self.type, "devices": [int(d) for d in self.devices]}
        if self.dims is not None:
            out["dims"] = [int(d) for d in self.dims]
        if self.type in (ROW_WISE, GRID) and table is not None:   # a grid's: every block's
            out["rows"] = row_blocks(table.row, len(self.devices) // len(self.dims or (1,)))
        return out

    @classmethod
    def from_json(cls, obj: Any, table: TableConfig | None = None, where: str = "sharding") -> "Sharding":
        if not isinstance(obj, dict):
            raise ShardError(f"{where}: expected an object, got {type(obj).__name__}")
        kind = obj.get("type")
        if kind not in SHARDING_TYPES:
            raise ShardError(f"{where}: unknown sharding type {kind!r} (one of {', '.join(SHARDING_TYPES)})")
        devices = _int_list(obj.get("devices"), "devices", where)
        dims = _int_list(obj["dims"], "dims", where) if kind in (COLUMN_WISE, GRID) and "dims" in obj else None
        try:
            s = cls(kind, tuple(devices), tuple(dims) if dims is not None else None)
        except ShardError as exc:
            raise ShardError(f"{where}: {exc}") from None
        if kind in (ROW_WISE, GRID) and "rows" in obj and table is not None:
            rows, k = _int_list(obj["rows"], "rows", where), len(devices) // len(s.dims or (1,))
            if rows != row_blocks(table.row, k):
                raise ShardError(f"{where}: {kind} rows {rows} are not {table.row} rows in equal blocks "
                                 f"over {k} devices ({row_blocks(table.row, k)})")
        return s


@functools.lru_cache(maxsize=1 << 16)
def pieces_of(s: Sharding, t: TableConfig, ndevices: int) -> tuple:
    """``s.pieces(t, ndevices)``, kept (a search on 128 devices expands a replica's 128 pieces often)."""
    return tuple(s.pieces(t, ndevices))


_pieces = pieces_of


def _int_list(value, name: str, where: str) -> list[int]:
    if not isinstance(value, list) or not value or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise ShardError(f"{where}: {name} must be a non-empty list of whole numbers, got {value!r}")
    return [int(v) for v in value]


def table_wise(device: int) -> Sharding:
    return Sharding(TABLE_WISE, (int(device),))


def column_wise(blocks: Sequence[tuple[int, int]]) -> Sharding:
    """``blocks``: ``(device, dim)`` per column block, in column order."""
    return Sharding(COLUMN_WISE, tuple(int(d) for d, _ in blocks), tuple(int(w) for _, w in blocks))


def row_wise(devices: Sequence[int]) -> Sharding:
    return Sharding(ROW_WISE, tuple(int(d) for d in devices))


def grid(blocks: Sequence[tuple[Sequence[int], int]]) -> Sharding:
    """``blocks``: ``(devices, dim)`` per column block, in column order, each row-wise over its devices."""
    return Sharding(GRID, tuple(int(d) for devs, _ in blocks for d in devs), tuple(int(w) for _, w in blocks))


def data_parallel(ndevices: int) -> Sharding:
    return Sharding(DATA_PARALLEL, tuple(range(int(ndevices))))


@dataclass(frozen=True)
class Plan:
    """``allocation[i] = d``: the (expanded) task's i-th piece goes to device ``d``.

    Compact form (``shardings`` is None): the pieces are the tables, or with ``splits`` their uniform
    column shards. General form: ``shardings`` (one per task table) defines the pieces; ``allocation``
    and ``splits`` (pieces per table) are derived from it (:meth:`from_shardings`).
    """

    allocation: tuple[int, ...]
    ndevices: int
    splits: tuple[int, ...] | None = None   # pieces per task table; None: every table is one piece
    shardings: tuple[Sharding, ...] | None = None   # None: the compact form

    def __post_init__(self):
        if self.ndevices < 1:
            raise ShardError(f"a plan needs at least one device, got {self.ndevices}")
        bad = [d for d in self.allocation if not 0 <= d < self.ndevices]
        if bad:
            raise ShardError(f"plan puts a table on device {bad[0]}, but there are {self.ndevices} devices")
        if self.splits is not None and sum(self.splits) != len(self.allocation):
            raise ShardError(f"plan splits tables into {sum(self.splits)} shards but allocates {len(self.allocation)}")
        if self.shardings is not None and self.splits is None:
            raise ShardError("a plan with shardings needs its pieces per table (use Plan.from_shardings)")

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

    @classmethod
    def from_shardings(cls, tables: Sequence[TableConfig], shardings: Sequence[Sharding], ndevices: int) -> "Plan":
        """The plan giving table ``i`` the sharding ``shardings[i]``; the compact form when every
        table is table-wise or uniformly column split (so such plans equal today's)."""
        if len(shardings) != len(tables):
            raise ShardError(f"{len(shardings)} shardings for {len(tables)} tables")
        for pos, (t, s) in enumerate(zip(tables, shardings)):
            s.check(t, ndevices, where=f"table {t.index} (task position {pos})")
        legacy = [s.legacy(t.dim) for t, s in zip(tables, shardings)]
        if all(x is not None for x in legacy):
            alloc = tuple(d for _k, devs in legacy for d in devs)
            splits = tuple(k for k, _ in legacy)
            return cls(alloc, ndevices, splits if any(k > 1 for k in splits) else None)
        alloc, counts = [], []
        for t, s in zip(tables, shardings):
            pieces = _pieces(s, t, ndevices)
            alloc.extend(d for d, _ in pieces)
            counts.append(len(pieces))
        return cls(tuple(alloc), ndevices, tuple(counts), tuple(shardings))

    @property
    def shards(self) -> list[list[int]]:
        """``shards[d]``: positions (in the expanded piece list) of the pieces on device ``d``."""
        out: list[list[int]] = [[] for _ in range(self.ndevices)]
        for i, d in enumerate(self.allocation):
            out[d].append(i)
        return out

    @property
    def general(self) -> bool:
        """Whether the plan needs the general form (row-wise, grid, data-parallel or uneven column-wise)."""
        return self.shardings is not None

    def table_shardings(self, tables: Sequence[TableConfig]) -> list[Sharding]:
        """Every table's sharding (the compact form's tables are table-wise or uniform column splits)."""
        if self.shardings is not None:
            if len(self.shardings) != len(tables):
                raise ShardError(f"plan has {len(self.shardings)} tables but the task has {len(tables)}")
            return list(self.shardings)
        self.expand(tables)
        splits = self.splits if self.splits is not None else (1,) * len(tables)
        out, pos = [], 0
        for t, k in zip(tables, splits):
            devs = self.allocation[pos:pos + k]
            out.append(table_wise(devs[0]) if k == 1 else column_wise([(d, t.dim // k) for d in devs]))
            pos += k
        return out

    def sharding_types(self, tables: Sequence[TableConfig]) -> list[str]:
        return [s.type for s in self.table_shardings(tables)]

    def expand(self, tables: Sequence[TableConfig]) -> list[TableConfig]:
        """The pieces the allocation refers to (today's form: ``tables`` with the column splits)."""
        if self.shardings is not None:
            if len(self.shardings) != len(tables):
                raise ShardError(f"plan has {len(self.shardings)} tables but the task has {len(tables)}")
            expanded = [p for t, s in zip(tables, self.shardings) for _d, p in _pieces(s, t, self.ndevices)]
        else:
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


def shardings_to_json(tables: Sequence[TableConfig], plan: Plan) -> list[dict]:
    """Per task table ``{"type", "devices", "dims" (column-wise, grid), "rows" (row-wise, grid)}``."""
    return [s.to_json(t) for t, s in zip(tables, plan.table_shardings(tables))]


def shardings_from_json(tables: Sequence[TableConfig], obj: Any, ndevices: int, where: str = "plan") -> Plan:
    """The plan of a ``"shardings"`` list (see :func:`shardings_to_json`)."""
    if not isinstance(obj, list):
        raise ShardError(f"{where}: shardings must be a list, got {type(obj).__name__}")
    if len(obj) != len(tables):
        raise ShardError(f"{where}: {len(obj)} shardings for {len(tables)} tables")
    shardings = [Sharding.from_json(o, t, where=f"{where}: table {t.index} (task position {pos})")
                 for pos, (t, o) in enumerate(zip(tables, obj))]
    return Plan.from_shardings(tables, shardings, ndevices)
