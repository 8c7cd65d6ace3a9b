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

A :class:`Plan` is the task's tables, one sharding per table and the :class:`~shardcore.topology.Topology`
it is for. It expands into **pieces** (:class:`ShardPiece`: a shard in TorchRec's sense, the part of a table
one device holds, as a :class:`~shardcore.tables.TableConfig` with the rows and dim the device holds, and for
RW the row range, for DP the batch slice); :attr:`Plan.device_pieces` gives each device's pieces, which is
what an oracle prices. Memory per device counts each piece's rows x dims (a DP table counts on every
device); :attr:`Plan.feasible` is the cap check. :meth:`Plan.shardings_json` / :meth:`Plan.from_json` are
the JSON form (``eval.py --out``'s ``"shardings"``); :meth:`Plan.from_allocation` reads the compact form of
older records (``allocation`` over the pieces, ``splits[i] = k`` cutting table ``i`` into ``k`` column blocks
of ``dim / k``), which :attr:`Plan.allocation` and :attr:`Plan.splits` still write beside the shardings.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Sequence

from shardcore.errors import ShardError
from shardcore.tables import DIM_MULTIPLE, TableConfig
from shardcore.topology import Topology

TABLE_WISE, COLUMN_WISE, ROW_WISE, DATA_PARALLEL, GRID = "table_wise", "column_wise", "row_wise", "data_parallel", "grid"
SHARDING_TYPES = (TABLE_WISE, COLUMN_WISE, ROW_WISE, DATA_PARALLEL, GRID)


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


def device_kernels(pieces: Sequence[TableConfig], batch_size: int) -> list[tuple[int, list[TableConfig]]]:
    """The fused kernels a device runs for its ``pieces``, as ``(batch, pieces)``: its model-parallel
    pieces (table-wise, column-wise, row-wise) in one kernel over the whole batch, then its
    data-parallel replicas in another over the device's batch slice (one per distinct slice, normally
    one). Empty kernels are left out, so a device of whole tables is one kernel at ``batch_size``."""
    mp = [t for t in pieces if getattr(t, "kind", None) != DATA_PARALLEL]
    out = [(int(batch_size), mp)] if mp else []
    dp: dict = {}
    for t in pieces:
        if getattr(t, "kind", None) == DATA_PARALLEL:
            dp.setdefault(tuple(t.batch_part) if t.batch_part else None, []).append(t)
    out.extend((local_batch(ts[0], batch_size), ts) for ts in dp.values())
    return out


def has_pieces(pieces: Sequence[TableConfig]) -> bool:
    """Whether a device's pieces hold a row-wise or data-parallel one: its lookups are not its
    tables' full batch, so the measurement cache (which keys a device's work by its tables' index, rows
    and dim) neither stores nor answers it, nor the plan it belongs to."""
    return any(getattr(t, "special", False) for t in pieces)


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
    """A plan: per task table one :class:`Sharding`, on a :class:`~shardcore.topology.Topology`.

    The one form every planner returns and every consumer reads: ``tables`` (the task's, by position),
    ``shardings`` (one per table) and ``topology``; what it gives each device follows from them
    (:attr:`pieces`, :attr:`device_pieces`, :attr:`device_memory_gb`, :attr:`feasible`). The compact form
    of older records and plan files (``allocation`` over the pieces, ``splits`` per table) is read with
    :meth:`from_allocation` and written as :attr:`allocation` / :attr:`splits`.
    """

    tables: tuple[TableConfig, ...]
    shardings: tuple[Sharding, ...]
    topology: Topology

    def __post_init__(self):
        object.__setattr__(self, "tables", tuple(self.tables))
        object.__setattr__(self, "shardings", tuple(self.shardings))
        if len(self.shardings) != len(self.tables):
            raise ShardError(f"{len(self.shardings)} shardings for {len(self.tables)} tables")
        n = self.topology.ndevices
        for pos, (t, s) in enumerate(zip(self.tables, self.shardings)):
            s.check(t, n, where=f"table {t.index} (task position {pos})")

    # -- building one ------------------------------------------------------------------------------
    @classmethod
    def table_wise(cls, tables: Sequence[TableConfig], devices: Sequence[int], topology: Topology) -> "Plan":
        """Every table whole: table ``i`` on device ``devices[i]``."""
        if len(devices) != len(tables):
            raise ShardError(f"plan puts {len(devices)} tables on devices but the task has {len(tables)}")
        return cls(tables, tuple(table_wise(d) for d in devices), topology)

    @classmethod
    def from_allocation(cls, tables: Sequence[TableConfig], allocation: Sequence[int], topology: Topology,
                        splits: Sequence[int] | None = None) -> "Plan":
        """The compact form of records and plan files: table ``i`` cut into ``splits[i]`` column blocks of
        ``dim / splits[i]`` (default: whole), the pieces in table order, piece ``j`` on ``allocation[j]``."""
        n = topology.ndevices
        bad = [d for d in allocation if not 0 <= int(d) < n]
        if bad:
            raise ShardError(f"plan puts a table on device {bad[0]}, but there are {n} devices")
        ks = tuple(int(k) for k in splits) if splits is not None else (1,) * len(tables)
        if len(ks) != len(tables):
            raise ShardError(f"plan splits {len(ks)} tables but the task has {len(tables)}")
        for t, k in zip(tables, ks):
            if k < 1 or t.dim % k:
                raise ShardError(f"table {t.index} (dim {t.dim}) cannot be split into {k} column shards")
        if sum(ks) != len(allocation):
            raise ShardError(f"plan has {len(allocation)} pieces but the task's tables make {sum(ks)}")
        out, pos = [], 0
        for t, k in zip(tables, ks):
            devs = [int(d) for d in allocation[pos:pos + k]]
            out.append(table_wise(devs[0]) if k == 1 else column_wise([(d, t.dim // k) for d in devs]))
            pos += k
        return cls(tables, tuple(out), topology)

    @classmethod
    def from_device_tables(cls, tables: Sequence[TableConfig], positions: Sequence[Sequence[int]],
                           topology: Topology) -> "Plan":
        """Every table whole, from ``positions[d]``: the task positions of the tables on device ``d``
        (each exactly once)."""
        alloc = [-1] * len(tables)
        if len(positions) != topology.ndevices:
            raise ShardError(f"{len(positions)} devices' tables for a topology of {topology.ndevices} devices")
        for d, on in enumerate(positions):
            for i in on:
                if not 0 <= i < len(tables) or alloc[i] != -1:
                    raise ShardError(f"devices must hold each of tables 0..{len(tables) - 1} exactly once (bad: {i})")
                alloc[i] = d
        if -1 in alloc:
            raise ShardError(f"table {alloc.index(-1)} is on no device")
        return cls.table_wise(tables, alloc, topology)

    @classmethod
    def from_json(cls, tables: Sequence[TableConfig], obj: Any, topology: Topology, where: str = "plan") -> "Plan":
        """The plan of a ``"shardings"`` list (see :meth:`shardings_json`)."""
        if not isinstance(obj, list):
            raise ShardError(f"{where}: shardings must be a list, got {type(obj).__name__}")
        if len(obj) != len(tables):
            raise ShardError(f"{where}: {len(obj)} shardings for {len(tables)} tables")
        shardings = [Sharding.from_json(o, t, where=f"{where}: table {t.index} (task position {pos})")
                     for pos, (t, o) in enumerate(zip(tables, obj))]
        return cls(tables, tuple(shardings), topology)

    # -- what it gives each device -----------------------------------------------------------------
    @property
    def ndevices(self) -> int:
        return self.topology.ndevices

    @functools.cached_property
    def pieces(self) -> tuple[tuple[int, TableConfig], ...]:
        """``(device, piece)`` of every piece, in table order (a table's in column / row / device order);
        a table-wise table's piece is the table itself."""
        n = self.topology.ndevices
        return tuple(x for t, s in zip(self.tables, self.shardings)
                     for x in (((s.devices[0], t),) if s.type == TABLE_WISE else pieces_of(s, t, n)))

    @property
    def allocation(self) -> tuple[int, ...]:
        """The device of every piece (:attr:`pieces`' order): the compact form's allocation."""
        return tuple(int(d) for d, _ in self.pieces)

    @property
    def general(self) -> bool:
        """Whether the plan needs its shardings to be written (row-wise, grid, data-parallel or uneven
        column-wise tables), not the compact allocation and splits."""
        return any(s.legacy(t.dim) is None for t, s in zip(self.tables, self.shardings))

    @property
    def splits(self) -> tuple[int, ...] | None:
        """Column blocks per table in the compact form: None when every table is whole, or when the
        plan is :attr:`general`."""
        if self.general:
            return None
        ks = tuple(len(s.devices) for s in self.shardings)
        return ks if any(k > 1 for k in ks) else None

    @property
    def device_positions(self) -> list[list[int]]:
        """Per device the positions (in :attr:`pieces`) of its pieces."""
        out: list[list[int]] = [[] for _ in range(self.ndevices)]
        for i, (d, _) in enumerate(self.pieces):
            out[d].append(i)
        return out

    @property
    def device_pieces(self) -> list[list[TableConfig]]:
        """Per device its pieces: what an oracle prices (:data:`~shardcore.types.DevicePieces`)."""
        out: list[list[TableConfig]] = [[] for _ in range(self.ndevices)]
        for d, p in self.pieces:
            out[d].append(p)
        return out

    def device_memory_gb(self, precision: str | None = None) -> list[float]:
        """Per device the GiB of its pieces' weights (at the topology's precision unless another is given)."""
        precision = precision or self.topology.precision
        mem = [0.0] * self.ndevices
        for d, p in self.pieces:
            mem[d] += p.memory_gb(precision)
        return mem

    @property
    def feasible(self) -> bool:
        """Whether every device holds its pieces within the cap (:meth:`Topology.holds`)."""
        return self.topology.holds(max(self.device_memory_gb(), default=0.0))

    @property
    def sharding_types(self) -> list[str]:
        return [s.type for s in self.shardings]

    def shardings_json(self) -> list[dict]:
        """Per task table ``{"type", "devices", "dims" (column-wise, grid), "rows" (row-wise, grid)}``."""
        return [s.to_json(t) for t, s in zip(self.tables, self.shardings)]
