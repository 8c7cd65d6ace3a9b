"""What an emulated card was measured on, and how it prices a table beyond that.

**The domain** (:class:`Domain`, :func:`shardcore.oracles.emulated.emulator.card_domain`): the ranges of the tables in the card's measured
shards -- rows, pooling factor, dim, the weights' precision -- and one joint range: tables looked up at
most :data:`FEW_LOOKUPS` times per sample were measured only up to a smaller row count than the others
(a one-hot table of tens of millions of rows, the typical public model's largest, was never measured).
A table outside is *out of range*; :meth:`Domain.problems` says which range and by how far, and every
output that prices such a table says so (:func:`domain_note`).

**Beyond it** the fitted model extrapolates its hat functions flat (rows past the last knot add
nothing). A shard holding an out-of-range table is priced as the same shard brought inside the range
(:meth:`Domain.clip`: rows, pooling and dim clipped to the measured ones) plus what the clipped part
touches, by a physical law: the extra bytes of distinct rows (read by the forward; read and written back
by the backward's update) at the median bandwidth the card's bandwidth-bound measured shards achieved
above its launch floor (:func:`shardcore.oracles.emulated.emulator.physical_weights`). The price is
continuous at the range's edge and grows with the rows a table touches, not with rows it never looks up:
a one-hot table of 40M rows touches at most a batch's worth of them, like one of 1M. Inside the domain
nothing changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from shardcore.tables import TableConfig

FEW_LOOKUPS = 2.0          # pooling factor at or below which a table's measured rows are counted apart
PHYSICAL_FEATURES = ("1", "lookup bytes / 1e9", "distinct-row bytes / 1e9")
SECTOR_BYTES = 32


@dataclass(frozen=True)
class Domain:
    """The card's measured ranges (see the module notes)."""

    card: str
    max_rows: int
    max_pooling: float
    min_dim: int
    max_dim: int
    few_lookup_max_rows: int
    precisions: tuple = ("fp16",)

    def problems(self, t: TableConfig, precision: str = "fp16") -> list[str]:
        """Why ``t`` is out of range, each with how far (empty: in range)."""
        out = []
        rows = int(t.row)
        if rows > self.max_rows:
            out.append(f"{rows / 1e6:.3g}M rows, {rows / self.max_rows:.1f}x the largest measured ({self.max_rows / 1e6:.3g}M)")
        elif t.pooling_factor <= FEW_LOOKUPS and rows > self.few_lookup_max_rows:
            out.append(f"{rows / 1e6:.3g}M rows at pooling {t.pooling_factor:g}, {rows / self.few_lookup_max_rows:.1f}x "
                       f"the largest measured at pooling <= {FEW_LOOKUPS:g} ({self.few_lookup_max_rows / 1e6:.3g}M)")
        if t.pooling_factor > self.max_pooling:
            out.append(f"pooling {t.pooling_factor:g}, {t.pooling_factor / self.max_pooling:.1f}x the largest measured "
                       f"({self.max_pooling:g})")
        if not self.min_dim <= t.dim <= self.max_dim:
            out.append(f"dim {t.dim} outside the measured {self.min_dim}..{self.max_dim}")
        if precision not in self.precisions:
            out.append(f"{precision} weights (measured: {', '.join(self.precisions)}; priced by the bytes they move)")
        return out

    def clip(self, ta):
        """The tables of ``ta`` (an emulator's ``TableArrays``) brought inside the range: rows, pooling
        factor and dim clipped to the measured ones (the rows of a table looked up at most
        :data:`FEW_LOOKUPS` times per sample to that range's own)."""
        rows = np.minimum(ta.row, np.where(ta.pf <= FEW_LOOKUPS, self.few_lookup_max_rows, self.max_rows))
        return type(ta)(row=rows, pf=np.minimum(ta.pf, self.max_pooling), dim=np.clip(ta.dim, self.min_dim, self.max_dim),
                        bins=ta.bins, cv=ta.cv)

    def outside(self, rows: np.ndarray, pooling: np.ndarray, dims: np.ndarray) -> np.ndarray:
        """Per table (arrays of full rows, pooling factors, dims) whether it is out of range (the
        precision apart: a GPU model prices another precision by its bytes, see
        :func:`~shardcore.oracles.emulated.emulator.shard_features`)."""
        return ((rows > self.max_rows) | ((pooling <= FEW_LOOKUPS) & (rows > self.few_lookup_max_rows))
                | (pooling > self.max_pooling) | (dims < self.min_dim) | (dims > self.max_dim))


def domain_of(card: str, tables: Sequence[TableConfig]) -> Domain:
    """The domain of the measured ``tables`` (every table of every measured shard) of ``card``."""
    rows = np.array([t.row for t in tables], dtype=float)
    pf = np.array([t.pooling_factor for t in tables], dtype=float)
    dims = np.array([t.dim for t in tables], dtype=int)
    few = rows[pf <= FEW_LOOKUPS]
    return Domain(card, int(rows.max()), float(pf.max()), int(dims.min()), int(dims.max()),
                  int(few.max()) if len(few) else 0)


def physical_features(rows: np.ndarray, pooling: np.ndarray, dims: np.ndarray, distinct: np.ndarray,
                      shard_of: np.ndarray, nshards: int, batch_size: int, bytes_per_weight: int) -> np.ndarray:
    """``[nshards, 3]``: per shard 1, the bytes its lookups read and the bytes of its distinct rows,
    both / 1e9 (rows rounded up to 32-byte sectors)."""
    row_bytes = np.ceil(dims * float(bytes_per_weight) / SECTOR_BYTES) * SECTOR_BYTES
    lookups = float(batch_size) * pooling
    X = np.zeros((nshards, len(PHYSICAL_FEATURES)))
    X[:, 0] = 1.0
    X[:, 1] = np.bincount(shard_of, weights=lookups * row_bytes, minlength=nshards) / 1e9
    X[:, 2] = np.bincount(shard_of, weights=distinct * row_bytes, minlength=nshards) / 1e9
    return X


BEYOND = "priced as the nearest measured table plus the bytes of the distinct rows beyond it at the measured bandwidth"


def domain_note(dom: Domain, tables: Sequence[TableConfig], names: Sequence[str] | None, precision: str,
                limit: int = 6, how: str = BEYOND) -> str | None:
    """One line naming the tables the emulated card of ``dom`` prices out of its measured range (and by
    how far), or None when every table is in range and of a measured precision. ``how``: how its model
    prices them (a CPU card's features extrapolate; the GPU family adds the physical extra)."""
    card = dom.card
    names = list(names) if names is not None else [f"table {t.index}" for t in tables]
    found = [(n, dom.problems(t, "fp16")) for t, n in zip(tables, names)]
    found = [(n, p) for n, p in found if p]
    parts = []
    if precision not in dom.precisions:
        parts.append(f"{precision} weights: compute derived from {', '.join(dom.precisions)} measurements by bytes "
                     "moved, not measured")
    if found:
        shown = "; ".join(f"{n}: {', '.join(p)}" for n, p in found[:limit])
        more = f"; ... ({len(found)} in all)" if len(found) > limit else ""
        parts.append(f"{len(found)} table(s) outside the measured range, {how}: {shown}{more}")
    return f"note: emulated:{card}: " + "; ".join(parts) if parts else None
