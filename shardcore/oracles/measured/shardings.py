"""From a plan's pieces to the work each device really does: its lookups and its exchanges.

A plan (:mod:`shardcore.plan`) gives each device a list of pieces (:class:`~shardcore.plan.ShardPiece`
or plain tables). Per piece, :func:`piece_lookups` cuts the batch's lookups from ``data.pt``:

* table-wise / column-wise: the table's whole batch (a column block has the table's lookups);
* row-wise (and a grid's pieces, row blocks of a column block): only the indices in the piece's row
  range, shifted to start at 0, with the per-sample offsets rebuilt (a sample with no index in the
  range is an empty bag);
* data-parallel: only the samples of the device's batch slice (``B_d`` bags), looked up in a kernel
  of their own over that slice (:func:`shardcore.plan.device_kernels`), so the piece's pooled
  output is its slice's rows.

Per plan, :func:`comm_layout` gives what the communication phase exchanges besides the all-to-all
of pooled outputs (whose per-device widths include the row-wise partial sums); it is the convention
of :mod:`shardcore.oracles.commmodel`, with the ids counted from ``data.pt`` instead of expected:

* **input distribution**: every device holds the ids of its batch slice; it sends every holder of a
  model-parallel piece the ids of its slice the piece looks up, plus one length per sample (to
  rebuild the offsets): a table-wise table's holder and every column block's holder all the table's
  ids of the slice, a row-wise holder those in its range; an all-to-all of int64 with split sizes
  counted from ``data.pt`` (:func:`slice_id_counts`). A data-parallel replica's ids stay home;
* **row-wise output**: each holder's partial sums ``[B, dim]`` go out in the pooled-output
  all-to-all (device ``j`` receives ``[B_j, dim]`` from every holder) and are summed at ``j``
  (the all-to-all plus local sum that a reduce-scatter does; one all-to-all serves every backend and
  uneven slices); backward, the reverse all-to-all hands every holder the gradient ``[B, dim]``
  (an all-gather);
* **data-parallel**: no output exchange (each device's slice stays home); backward, an all-reduce
  of the table's dense gradient, ``rows x dim`` elements in the weights' precision.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:   # annotations only: torch is imported where it is used
    import torch

from shardcore.oracles.commmodel import batch_slices
from shardcore.errors import ShardError
from shardcore.plan import DATA_PARALLEL, ROW_WISE, ShardPiece
from shardcore.tables import TableConfig
from shardcore.types import CommLayout


def _raw(dataset, t: TableConfig, b: int, full_row: int) -> tuple[torch.Tensor, torch.Tensor]:
    import torch
    raw_idx, raw_off = dataset.indices[t.index], dataset.offsets[t.index]
    off = raw_off[: b + 1].to(torch.int64)
    n = int(off[-1])
    idx = raw_idx[:n].to(torch.int64)
    if n and full_row < dataset.tables[t.index].row and int(idx.max()) >= full_row:
        idx = torch.remainder(idx, full_row)
    return idx, off - off[0]


def piece_lookups(dataset, t: TableConfig, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The piece's indices (int64, local to the piece's rows) and offsets over them: ``[b + 1]``
    for a batch of ``b``, a data-parallel replica's ``[B_d + 1]`` over its slice of that batch."""
    import torch
    if not isinstance(t, ShardPiece) or not t.special:
        return _raw(dataset, t, b, t.row)
    idx, off = _raw(dataset, t, b, t.full_row or t.row)
    if t.kind == ROW_WISE:
        lo, hi = int(t.row_start), int(t.row_start) + int(t.row)
        mask = (idx >= lo) & (idx < hi)
        lengths = off[1:] - off[:-1]
        sample = torch.repeat_interleave(torch.arange(b, dtype=torch.int64), lengths)
        kept = torch.bincount(sample[mask], minlength=b)
        new_off = torch.zeros(b + 1, dtype=torch.int64)
        torch.cumsum(kept, 0, out=new_off[1:])
        return (idx[mask] - lo).contiguous(), new_off
    if t.kind == DATA_PARALLEL:
        j, n = t.batch_part
        sl = batch_slices(b, n)
        s0 = sum(sl[:j])
        s1 = s0 + sl[j]
        a, z = int(off[s0]), int(off[s1])
        return idx[a:z].contiguous(), (off[s0:s1 + 1] - a).contiguous()
    raise ShardError(f"unknown piece kind {t.kind!r}")


def rw_counts(dataset, t: ShardPiece, b: int, ndevices: int) -> list[int]:
    """Per batch slice ``j`` (of ``ndevices``): how many of the slice's ids fall in the piece's rows."""
    import torch
    idx, off = _raw(dataset, t, b, t.full_row or t.row)
    lo, hi = int(t.row_start), int(t.row_start) + int(t.row)
    inside = ((idx >= lo) & (idx < hi)).to(torch.int64)
    csum = torch.zeros(idx.numel() + 1, dtype=torch.int64)
    torch.cumsum(inside, 0, out=csum[1:])
    out, s = [], 0
    for n in batch_slices(b, ndevices):
        out.append(int(csum[int(off[s + n])] - csum[int(off[s])]))
        s += n
    return out


def slice_id_counts(dataset, t: TableConfig, b: int, ndevices: int) -> list[int]:
    """Per batch slice ``j`` (of ``ndevices``): how many ids of the slice the piece's holder receives
    (a table-wise table or column block: all the table's; a row-wise block: those in its rows; a
    data-parallel replica: none)."""
    import torch
    kind = getattr(t, "kind", None)
    if kind == DATA_PARALLEL:
        return [0] * ndevices
    if kind == ROW_WISE:
        return rw_counts(dataset, t, b, ndevices)
    off = dataset.offsets[t.index][: b + 1].to(torch.int64)
    out, s = [], 0
    for n in batch_slices(b, ndevices):
        out.append(int(off[s + n] - off[s]))
        s += n
    return out


def comm_layout(dataset, shards: Sequence[Sequence[TableConfig]], batch_size: int) -> CommLayout:
    """The exchanges of a plan whose device ``d`` holds ``shards[d]`` (see the module notes)."""
    n = len(shards)
    slices = batch_slices(batch_size, n)
    dim_sums = [0] * n
    ids = [[0] * n for _ in range(n)]
    allreduce = [0] * n
    groups: dict[tuple, list[dict[int, tuple[int, int, int]]]] = {}
    whole: dict[int, list[int]] = {}     # a whole table's ids per slice (table-wise, column blocks)
    for d, shard in enumerate(shards):
        col = 0
        for t in shard:
            if isinstance(t, ShardPiece) and t.kind == DATA_PARALLEL:
                allreduce[d] += int(t.row) * int(t.dim)
                continue
            if isinstance(t, ShardPiece) and t.kind == ROW_WISE:
                counts = slice_id_counts(dataset, t, batch_size, n)
            else:
                if t.index not in whole:
                    whole[t.index] = slice_id_counts(dataset, t, batch_size, n)
                counts = whole[t.index]
            for j, c in enumerate(counts):      # slice j's ids of the piece, plus one length a sample
                ids[j][d] += c + slices[j]
            if isinstance(t, ShardPiece) and t.kind == ROW_WISE:
                # a table's row blocks: same table, rows and dim, consecutive ranges; where the ranges
                # repeat (a grid's column blocks of one dim, or a table used twice), one sum per repeat
                repeats = groups.setdefault((t.index, t.full_row, t.dim), [])
                grp = next((g for g in repeats if t.row_start not in g), None)
                if grp is None:
                    repeats.append(grp := {})
                grp[int(t.row_start)] = (d, col, int(t.dim))
            col += int(t.dim)
            dim_sums[d] += int(t.dim)
    rw = [list(g.values()) for repeats in groups.values() for g in repeats if len(g) > 1]
    return CommLayout(dim_sums, ids, allreduce, rw)


TYPE_ABBREV = {"table_wise": "TW", "column_wise": "CW", "table_column_wise": "TWCW", "row_wise": "RW",
               "table_row_wise": "TWRW", "data_parallel": "DP", "grid": "GRID", "grid_shard": "GRID"}


def type_counts(results) -> dict[str, dict[str, int]]:
    """Per algorithm, how many tables its feasible plans gave each sharding type (TorchRec's own
    type names where the result records them, ``torchrec_types``; else ours)."""
    out: dict[str, dict[str, int]] = {}
    for r in results:
        if not r.feasible or not r.shardings:
            continue
        kinds = r.extra.get("torchrec_types") or [s["type"] for s in r.shardings]
        counts = out.setdefault(r.alg, {})
        for k in kinds:
            counts[k] = counts.get(k, 0) + 1
    return out


def type_counts_text(results) -> str:
    """One line per algorithm: the share of tables per sharding type."""
    lines = []
    for alg, counts in type_counts(results).items():
        total = sum(counts.values())
        parts = [f"{TYPE_ABBREV.get(k, k)} {v} ({100.0 * v / total:.0f}%)"
                 for k, v in sorted(counts.items(), key=lambda kv: -kv[1])]
        lines.append(f"  {alg:>20s}: " + ", ".join(parts))
    return "sharding types chosen (tables over all tasks):\n" + "\n".join(lines) if lines else ""
