"""Readers for the files of the original AutoShard, DreamShard and NeuroShard repositories.

Their processed dataset directories hold the same two files as ours, in slightly different layouts:

- ``data.pt``: a ``torch.save``d dict of two lists with one 1-D tensor per table, the table's batch
  CSR style (``offsets`` of B + 1 entries from 0 into its ``indices``): ``{"lS_offsets": [...],
  "lS_indices": [...]}`` (AutoShard, DreamShard) or ``{"offsets": [...], "indices": [...]}``
  (NeuroShard). Plain tensors, so they load with ``weights_only=True``.
- ``table_configs.json``: ``{"tables": [{"index", "row", "dim", "pooling_factor", "bin_0".."bin_16"}]}``
  (AutoShard, DreamShard: our layout; their pooling factors are truncated to integers) or, in
  NeuroShard, a bare list ``[{"row", "pooling_factor", "bin_0".."bin_16"}, ...]`` without ``index``
  and ``dim`` (NeuroShard's tasks give every table its dim). A table's index is its position; a
  table without a dim gets :data:`ORIGINAL_DEFAULT_DIM` (what DreamShard-style tasks, which carry no
  dims, then use).

:func:`shardcore.dataset.load_dataset` and :func:`~shardcore.dataset.load_table_configs` read both
through these functions, so an original directory works wherever ours does.
"""

from __future__ import annotations

import os
from typing import Any

from shardcore.errors import ShardError
from shardcore.tables import TableConfig

ORIGINAL_DEFAULT_DIM = 16      # DreamShard's gen_dlrm_data.py --dim default (NeuroShard's configs have none)
LOOKUP_LAYOUTS = (("lS_offsets", "lS_indices"), ("offsets", "indices"))   # AutoShard/DreamShard, NeuroShard


def tables_from_original_list(obj: list, where: str | os.PathLike,
                              default_dim: int = ORIGINAL_DEFAULT_DIM) -> list[TableConfig]:
    """NeuroShard's list-style ``table_configs.json``: index = position, dim = its ``dim`` if any."""
    tables = []
    for k, t in enumerate(obj):
        if not isinstance(t, dict):
            raise ShardError(f"{where}: entry {k} is {type(t).__name__}, expected an object with row, "
                             "pooling_factor, bin_0..bin_16")
        if "index" in t and t["index"] != k:
            raise ShardError(f"{where}: entry {k} has index {t['index']!r}; a list of tables is indexed by position")
        tables.append(TableConfig.from_json({**t, "index": k, "dim": t.get("dim", default_dim)},
                                            where=f"{where}: entry {k}"))
    if not tables:
        raise ShardError(f"{where}: no tables")
    return tables


def is_original_lookups(obj: Any) -> bool:
    return isinstance(obj, dict) and any(o in obj and i in obj for o, i in LOOKUP_LAYOUTS)


def lookups_from_original(obj: Any, where: str | os.PathLike, expected_format: str) -> dict:
    """An original ``data.pt`` (either layout) as our lookup dict ``{"format", "batch_size",
    "indices", "offsets"}`` (tensors kept as stored, e.g. int64); anything else is refused in one line."""
    import torch
    if not is_original_lookups(obj):
        raise ShardError(f"{where}: neither a {expected_format} file nor an original repository's data.pt "
                         "(a dict of lS_offsets/lS_indices or offsets/indices lists): regenerate it with "
                         "tools/gen_dlrm_data.py")
    okey, ikey = next((o, i) for o, i in LOOKUP_LAYOUTS if o in obj and i in obj)
    offsets, indices = obj[okey], obj[ikey]
    if not isinstance(offsets, (list, tuple)) or not isinstance(indices, (list, tuple)):
        raise ShardError(f"{where}: {okey} and {ikey} must be lists with one tensor per table")
    if len(offsets) != len(indices) or not offsets:
        raise ShardError(f"{where}: {len(offsets)} {okey} but {len(indices)} {ikey} entries")
    batch = None
    for i, (off, idx) in enumerate(zip(offsets, indices)):
        if not (torch.is_tensor(off) and torch.is_tensor(idx)) or off.dim() != 1 or idx.dim() != 1:
            raise ShardError(f"{where}: table {i}: {okey}/{ikey} entries must be 1-D tensors")
        if off.numel() < 2 or int(off[0]) != 0 or int(off[-1]) != idx.numel():
            raise ShardError(f"{where}: table {i}: offsets must start at 0 and end at the number of indices "
                             f"({idx.numel()})")
        if batch is None:
            batch = off.numel() - 1
        elif off.numel() - 1 != batch:
            raise ShardError(f"{where}: table {i} has {off.numel() - 1} samples, table 0 has {batch}")
    return {"format": expected_format, "batch_size": batch, "indices": list(indices), "offsets": list(offsets)}
