"""Embedding-table configurations and their memory footprint (the learned models' features of a table:
:mod:`shardcore.data.features`).

A table is described by its hash size (``row``), embedding dimension (``dim``), mean lookups per
sample (``pooling_factor``) and the 17-bin access-reuse histogram ``bin_0`` .. ``bin_16``: of the
distinct rows looked up in a batch, the fraction looked up (0,1], (1,2], (2,4], ... (2^15, inf) times;
where the data gave it, also by the CV of its per-sample lookup counts (``length_cv``, a model's 22nd feature).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Iterable


NUM_BINS = 17
BIN_NAMES = tuple(f"bin_{k}" for k in range(NUM_BINS))

PRECISION_BYTES = {"fp16": 2, "fp32": 4}
# FBGEMM's embedding kernels need every table's dim to be a multiple of 4.
DIM_MULTIPLE = 4
GB = float(1 << 30)


def bytes_per_element(precision: str) -> int:
    b = PRECISION_BYTES.get(precision)
    if b is not None:
        return b
    from shardcore.errors import ShardError

    raise ShardError(f"unknown weights precision {precision!r}: choose one of {', '.join(PRECISION_BYTES)}")


MAX_ROWS, MAX_POOLING = 2 ** 40, 1e5   # beyond any real table (a table's own numbers, validated on entry)


def dim_problem(dim: int) -> str | None:
    """Why ``dim`` cannot be an embedding table's dim (``None`` when it can)."""
    if dim <= 0:
        return f"dim must be positive, got {dim}"
    if dim % DIM_MULTIPLE:
        return f"dim {dim} is not a multiple of {DIM_MULTIPLE} (FBGEMM's kernels need that)"
    return None


def _number(value, name: str, where: str, integer: bool = False) -> float | int:
    """A finite number from a JSON value (a number or a numeric string); ``integer``: a whole one."""
    from shardcore.errors import ShardError

    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ShardError(f"{where}: non-numeric {name} {value!r}")
    try:
        v = float(value)
    except (ValueError, OverflowError):
        raise ShardError(f"{where}: non-numeric {name} {value!r}") from None
    if not math.isfinite(v):
        raise ShardError(f"{where}: {name} must be finite, got {value!r}")
    if integer:
        if isinstance(value, int):
            return value
        if v != int(v):
            raise ShardError(f"{where}: {name} must be a whole number, got {value!r}")
        return int(v)
    return v


@dataclass(frozen=True)
class TableConfig:
    """One embedding table. ``index`` is its id in the dataset."""

    index: int
    row: int
    dim: int
    pooling_factor: float
    bins: tuple[float, ...] = field(default=(0.0,) * NUM_BINS)
    # the CV of its per-sample lookup counts where the data gave it (table_configs.json "length_cv")
    length_cv: float | None = field(default=None, compare=False)

    @functools.cached_property
    def key(self) -> tuple:   # what a piece of work is (shardcore.plan.piece_key), kept once made
        return (int(self.index), int(self.row), int(self.dim))

    @property
    def size(self) -> int:
        """Number of weights: row x dim."""
        return self.row * self.dim

    def memory_gb(self, precision: str = "fp16") -> float:
        """Weight memory in GiB (2^30 bytes): row x dim x bytes per element."""
        return self.size * bytes_per_element(precision) / GB

    def with_dim(self, dim: int) -> "TableConfig":
        """The same table (rows, lookups, reuse) with another embedding dimension."""
        return dataclasses.replace(self, dim=int(dim))

    # -- JSON (the original repositories' table_configs.json layout) ---------------------------
    def to_json(self) -> dict:
        out = {"index": self.index, "row": self.row, "dim": self.dim,
               "pooling_factor": self.pooling_factor}
        out.update({name: float(v) for name, v in zip(BIN_NAMES, self.bins)})
        return out if self.length_cv is None else {**out, "length_cv": float(self.length_cv)}

    @classmethod
    def from_json(cls, obj: dict, where: str = "table") -> "TableConfig":
        from shardcore.errors import ShardError

        if not isinstance(obj, dict):
            raise ShardError(f"{where}: expected an object, got {type(obj).__name__}")
        missing = [k for k in ("index", "row", "dim", "pooling_factor") if k not in obj]
        if missing:
            raise ShardError(f"{where}: missing field(s) {', '.join(missing)}")
        index = _number(obj["index"], "index", where, integer=True)
        row = _number(obj["row"], "row", where, integer=True)
        dim = _number(obj["dim"], "dim", where, integer=True)
        pf = _number(obj["pooling_factor"], "pooling_factor", where)
        bins = tuple(_number(obj.get(name, 0.0), name, where) for name in BIN_NAMES)
        cv = None if obj.get("length_cv") is None else _number(obj["length_cv"], "length_cv", where)
        if not (0 < row <= MAX_ROWS and dim > 0 and 0 <= pf <= MAX_POOLING):   # beyond: the cost models overflow
            raise ShardError(f"{where}: row and dim must be positive and pooling_factor >= 0 (got row={row}, dim={dim}, "
                             f"pooling_factor={pf}) (at most 2**40 rows and pooling factor {MAX_POOLING:g})")
        problem = dim_problem(dim)
        if problem:
            raise ShardError(f"{where}: {problem}")
        bad = [(n, b) for n, b in zip(BIN_NAMES, bins) if b < 0]
        if bad or (cv is not None and cv < 0):
            raise ShardError(f"{where}: " + (f"reuse bin {bad[0][0]} = {bad[0][1]}" if bad else f"length_cv {cv}") + " is negative")
        return cls(index=index, row=row, dim=dim, pooling_factor=pf, bins=bins, length_cv=cv)


def total_memory_gb(tables: Iterable[TableConfig], precision: str = "fp16") -> float:
    return sum(t.memory_gb(precision) for t in tables)
