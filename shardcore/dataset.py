"""The processed dataset directory: ``table_configs.json`` plus ``data.pt``.

``table_configs.json``: ``{"tables": [{"index": i, "row": .., "dim": .., "pooling_factor": ..,
"bin_0": .., ..., "bin_16": ..}, ...]}`` (the original repositories' layout).

``data.pt``: one batch of lookups per table, CSR style, as a dict of plain tensors that loads with
``torch.load(..., weights_only=True, mmap=True)``::

    {"format": "shardcore-lookups-v1", "batch_size": B,
     "indices": [T int32 tensors], "offsets": [T int32 tensors of B + 1 entries, from 0]}

Table ``i``'s sample ``b`` looks up ``indices[i][offsets[i][b]:offsets[i][b + 1]]``.
Indices and offsets are stored as int32 (a table's rows and one batch's lookups per table fit) to
halve the file; :meth:`Dataset.lookups` hands them out as int64, as FBGEMM wants them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from . import io
from .errors import ShardError
from .originals import lookups_from_original, tables_from_original_list
from .tables import TableConfig

DEFAULT_DATA_DIR = "data/dlrm_datasets"
CONFIGS_FILE = "table_configs.json"
DATA_FILE = "data.pt"
FORMAT = "shardcore-lookups-v1"


def load_table_configs(path: str | os.PathLike) -> list[TableConfig]:
    """Read a ``table_configs.json``; tables come back ordered by ``index`` (which must be 0..T-1)."""
    path = Path(path)
    if not path.is_file():
        raise ShardError(f"table configs not found: {path} (run tools/gen_dlrm_data.py first)")
    try:
        obj = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ShardError(f"{path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if isinstance(obj, list):   # NeuroShard's layout: a bare list of tables (shardcore.originals)
        return tables_from_original_list(obj, path)
    if not isinstance(obj, dict) or not isinstance(obj.get("tables"), list):
        raise ShardError(f'{path}: expected an object with a "tables" list')
    tables = [TableConfig.from_json(t, where=f"{path}: tables[{k}]") for k, t in enumerate(obj["tables"])]
    tables.sort(key=lambda t: t.index)
    if [t.index for t in tables] != list(range(len(tables))):
        raise ShardError(f"{path}: table indices must be 0..{len(tables) - 1}, each once")
    return tables


def save_table_configs(path: str | os.PathLike, tables: Sequence[TableConfig]) -> None:
    io.write_json(path, {"tables": [t.to_json() for t in tables]})


@dataclass
class Dataset:
    """Table configs and (optionally) one batch of lookup data per table."""

    tables: list[TableConfig]
    batch_size: int | None = None
    indices: list[torch.Tensor] | None = None
    offsets: list[torch.Tensor] | None = None
    path: Path | None = None

    @property
    def num_tables(self) -> int:
        return len(self.tables)

    @property
    def has_lookups(self) -> bool:
        return self.indices is not None

    def lookups(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Table ``i``'s batch as ``(indices, offsets)``, both int64, offsets starting at 0."""
        if self.indices is None or self.offsets is None:
            raise ShardError(f"{self.path or 'dataset'}: no lookup data loaded ({DATA_FILE} missing?)")
        if not 0 <= i < len(self.indices):
            raise ShardError(f"table id {i} out of range: the dataset has {len(self.indices)} tables")
        return self.indices[i].long(), self.offsets[i].long()


def load_dataset(data_dir: str | os.PathLike = DEFAULT_DATA_DIR, with_lookups: bool = True) -> Dataset:
    """Load a processed dataset directory. ``with_lookups=False`` reads only the table configs.

    ``data.pt`` is memory-mapped, so a process that touches a few tables reads only those.
    """
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise ShardError(f"dataset directory not found: {data_dir} (run tools/gen_dlrm_data.py first)")
    tables = load_table_configs(data_dir / CONFIGS_FILE)
    ds = Dataset(tables=tables, path=data_dir)
    if not with_lookups:
        return ds
    data_path = data_dir / DATA_FILE
    if not data_path.is_file():
        raise ShardError(f"lookup data not found: {data_path} (run tools/gen_dlrm_data.py first)")
    try:
        obj = torch.load(data_path, weights_only=True, mmap=True)
    except Exception as exc:  # a truncated or foreign file
        raise ShardError(f"{data_path}: cannot read lookup data ({type(exc).__name__}: {exc})") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:   # the originals' layouts, else one line
        obj = lookups_from_original(obj, data_path, FORMAT)
    indices, offsets, batch = obj["indices"], obj["offsets"], int(obj["batch_size"])
    if len(indices) != len(tables) or len(offsets) != len(tables):
        raise ShardError(f"{data_path}: holds {len(indices)} tables but {CONFIGS_FILE} lists {len(tables)}")
    for i, off in enumerate(offsets):
        if off.numel() != batch + 1:
            raise ShardError(f"{data_path}: table {i} has {off.numel() - 1} samples, expected {batch}")
    ds.batch_size, ds.indices, ds.offsets = batch, list(indices), list(offsets)
    return ds


def save_dataset(out_dir: str | os.PathLike, tables: Sequence[TableConfig], indices: Sequence[torch.Tensor],
                 offsets: Sequence[torch.Tensor], batch_size: int) -> None:
    """Write ``table_configs.json`` and ``data.pt`` atomically (each through a temporary file)."""
    if not (len(tables) == len(indices) == len(offsets)):
        raise ValueError("tables, indices and offsets must have one entry per table")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    obj = {
        "format": FORMAT,
        "batch_size": int(batch_size),
        "indices": [t.to(torch.int32).contiguous() for t in indices],
        "offsets": [t.to(torch.int32).contiguous() for t in offsets],
    }
    io.torch_save(obj, out_dir / DATA_FILE)
    save_table_configs(out_dir / CONFIGS_FILE, tables)
