"""The processed dataset directory: ``table_configs.json`` plus ``data.pt``.

``table_configs.json``: ``{"tables": [{"index": i, "row": .., "dim": .., "pooling_factor": ..,
"bin_0": .., ..., "bin_16": ..}, ...]}`` (the original repositories' layout).

``data.pt``: one batch of lookups per table, CSR style, as a dict of plain tensors that loads with
``torch.load(..., weights_only=True, mmap=True)``::

    {"format": "shardcore-lookups-v1", "batch_size": B,
     "indices": [T int32 tensors], "offsets": [T int32 tensors of B + 1 entries, from 0],
     "min_index": int64 [T], "max_index": int64 [T]}   # per table, -1 without lookups

Loading checks every table's ``row`` against ``max_index`` (files without it: computed once).

Table ``i``'s sample ``b`` looks up ``indices[i][offsets[i][b]:offsets[i][b + 1]]``.
Indices and offsets are stored as int32 (a table's rows and one batch's lookups per table fit) to
halve the file; :meth:`Dataset.lookups` hands them out as int64, as FBGEMM wants them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from shardcore import io
from shardcore.errors import ShardError
from shardcore.originals import lookups_from_original, tables_from_original_list
from shardcore.tables import TableConfig

if TYPE_CHECKING:   # annotations only: torch is imported where it is used
    import torch
DEFAULT_DATA_DIR = "data/dlrm_datasets"
CONFIGS_FILE = "table_configs.json"
DATA_FILE = "data.pt"
FORMAT = "shardcore-lookups-v1"


COST_DATA_FILES = ("compute_costs.csv", "comm_costs.csv")   # what the cost-data collectors write


def _cost_data_files(folder: Path) -> str:
    """The cost-data files (``collect_compute_cost_data.py`` / ``collect_comm_cost_data.py`` output) in
    ``folder`` or one level below it, as text ('' when there are none)."""
    found = []
    for name in COST_DATA_FILES:
        found += [str(p.relative_to(folder)) for p in sorted(folder.glob(name)) + sorted(folder.glob(f"*/{name}"))]
    return ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")


def load_table_configs(path: str | os.PathLike) -> list[TableConfig]:
    """Read a ``table_configs.json``; tables come back ordered by ``index`` (which must be 0..T-1)."""
    path = Path(path)
    if not path.is_file():
        cost_data = _cost_data_files(path.parent)
        if cost_data:
            raise ShardError(f"table configs not found: {path.parent} holds cost data ({cost_data}), not a dataset: "
                             "here --data-dir/--data_dir names the dataset (table_configs.json, e.g. "
                             f"{DEFAULT_DATA_DIR}); cost models trained on that data are given with --compute-model, "
                             "--fw-comm-model and --bw-comm-model")
        raise ShardError(f"table configs not found: {path} (run tools/gen_dlrm_data.py first)")
    obj = io.parse_json(io.read_text(path, "table_configs.json (JSON)"), path)
    if isinstance(obj, list):   # NeuroShard's layout: a bare list of tables (shardcore.originals)
        return tables_from_original_list(obj, path)
    if not isinstance(obj, dict) or not isinstance(obj.get("tables"), list):
        raise ShardError(f'{path}: expected an object with a "tables" list')
    tables = [TableConfig.from_json(t, where=f"{path}: tables[{k}]") for k, t in enumerate(obj["tables"])]
    tables.sort(key=lambda t: t.index)
    if [t.index for t in tables] != list(range(len(tables))):
        raise ShardError(f"{path}: table indices must be 0..{len(tables) - 1}, each once")
    return tables


def table_names(data_dir: str | os.PathLike) -> dict[int, str]:
    """``{index: name}`` of the tables whose entry in ``table_configs.json`` carries a ``name`` (as
    ``plan.py``'s JSON tables do); tables without one are left out ({} when the file names none)."""
    path = Path(data_dir) / CONFIGS_FILE
    try:
        obj = json.loads(io.read_text(path, "table_configs.json (JSON)"))
    except (ShardError, json.JSONDecodeError):
        return {}
    entries = obj.get("tables") if isinstance(obj, dict) else None
    out = {}
    for k, e in enumerate(entries or []):
        if isinstance(e, dict) and isinstance(e.get("name"), str) and e["name"]:
            index = e.get("index", k)
            if isinstance(index, int):
                out[index] = e["name"]
    return out


def save_table_configs(path: str | os.PathLike, tables: Sequence[TableConfig], batch_size: int | None = None) -> None:
    """Write ``table_configs.json``; ``batch_size`` (the batch the pooling factors and reuse bins were
    taken at) is recorded beside the tables, so an emulated oracle can use the configs without
    ``data.pt`` (the original repositories' readers ignore the extra key)."""
    obj: dict = {"tables": [t.to_json() for t in tables]}
    if batch_size is not None:
        obj["batch_size"] = int(batch_size)
    io.write_json(path, obj)


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
    if not with_lookups:   # the table configs only: no torch needed
        return ds
    import torch
    data_path = data_dir / DATA_FILE
    if not data_path.is_file():
        raise ShardError(f"lookup data not found: {data_path} (run tools/gen_dlrm_data.py first)")
    obj = io.safe_torch_load(data_path, "lookup data", mmap=True)
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:   # the originals' layouts, else one line
        obj = lookups_from_original(obj, data_path, FORMAT)
    indices, offsets, batch = obj.get("indices"), obj.get("offsets"), obj.get("batch_size")
    if not (isinstance(indices, (list, tuple)) and isinstance(offsets, (list, tuple)) and isinstance(batch, int)
            and batch > 0 and all(isinstance(t, torch.Tensor) for t in list(indices) + list(offsets))):
        raise ShardError(f"{data_path}: malformed {FORMAT} file (regenerate it with tools/gen_dlrm_data.py)")
    if len(indices) != len(tables) or len(offsets) != len(tables):
        raise ShardError(f"{data_path}: holds {len(indices)} tables but {CONFIGS_FILE} lists {len(tables)}")
    for i, off in enumerate(offsets):
        if off.numel() != batch + 1:
            raise ShardError(f"{data_path}: table {i} has {off.numel() - 1} samples, expected {batch}")
    verify_lookups(tables, indices, offsets, data_path)
    ds.batch_size, ds.indices, ds.offsets = batch, list(indices), list(offsets)
    return ds


_VERIFIED: set = set()


def _verified_marker(data_path: Path, tables: Sequence[TableConfig]) -> Path | None:
    """The file that says this very ``data.pt`` (path, size, time, inode) with these table rows was
    verified: per-user, outside the dataset; None when there is no place for it."""
    import hashlib
    import json

    try:
        st = data_path.stat()
        key = json.dumps([str(data_path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino,
                          [int(t.row) for t in tables]])
    except OSError:
        return None
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "shardkit" / "verified-lookups"
    return base / hashlib.sha256(key.encode()).hexdigest()[:32]


def verify_lookups(tables: Sequence[TableConfig], indices: Sequence[torch.Tensor], offsets: Sequence[torch.Tensor],
                   data_path: Path) -> None:
    """Trust nothing ``data.pt`` says about itself: every table's offsets start at 0, never decrease and
    end at its number of indices, and its indices (integers) lie in ``0 .. row - 1``: the index range
    is computed from the data (a per-table min and max over the memory-mapped tensor), never taken
    from the stored ``min_index``/``max_index``. Done once per file and table rows: remembered in this
    process and in a per-user marker, so the measuring workers do not read the data again."""
    import torch
    marker = _verified_marker(data_path, tables)
    if marker is not None and (marker in _VERIFIED or marker.is_file()):
        return
    for i, (idx, off) in enumerate(zip(indices, offsets)):
        if idx.is_floating_point() or idx.is_complex() or off.is_floating_point() or off.is_complex() \
                or idx.dtype == torch.bool or off.dtype == torch.bool:
            raise ShardError(f"{data_path}: table {i}: indices and offsets must be integer tensors "
                             "(regenerate it with tools/gen_dlrm_data.py)")
        o = off.reshape(-1).to(torch.int64)
        if o.numel() == 0 or int(o[0]) != 0 or bool((o[1:] < o[:-1]).any()) or int(o[-1]) != idx.numel():
            raise ShardError(f"{data_path}: table {i}: offsets must start at 0, never decrease and end at its "
                             f"{idx.numel()} indices (regenerate it with tools/gen_dlrm_data.py)")
    lo = [int(t.min()) if t.numel() else -1 for t in indices]
    hi = [int(t.max()) if t.numel() else -1 for t in indices]
    check_rows(tables, (lo, hi), data_path)
    if marker is not None:
        _VERIFIED.add(marker)
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
        except OSError:
            pass   # no place to remember it: the next process checks again


def check_rows(tables: Sequence[TableConfig], index_range: tuple[list[int], list[int]], where) -> None:
    """Every table's ``row`` must exceed every index its lookups use (and no index may be negative):
    otherwise the kernels would read out of bounds and the measured cost would mean nothing."""
    for t, lo, hi in zip(tables, *index_range):
        if hi >= t.row:
            raise ShardError(f"{where}: table {t.index} looks up row {hi} but {CONFIGS_FILE} gives it only "
                             f"{t.row} rows: its row must exceed every index (regenerate the dataset)")
        if lo < -1 or (hi >= 0 and lo < 0):
            raise ShardError(f"{where}: table {t.index} looks up a negative row index {lo}")


def save_dataset(out_dir: str | os.PathLike, tables: Sequence[TableConfig], indices: Sequence[torch.Tensor],
                 offsets: Sequence[torch.Tensor], batch_size: int) -> None:
    """Write ``table_configs.json`` and ``data.pt`` atomically (each through a temporary file)."""
    import torch
    if not (len(tables) == len(indices) == len(offsets)):
        raise ValueError("tables, indices and offsets must have one entry per table")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lo = [int(t.min()) if t.numel() else -1 for t in indices]
    hi = [int(t.max()) if t.numel() else -1 for t in indices]
    check_rows(tables, (lo, hi), out_dir / DATA_FILE)
    obj = {"format": FORMAT, "batch_size": int(batch_size),
           "indices": [t.to(torch.int32).contiguous() for t in indices],
           "offsets": [t.to(torch.int32).contiguous() for t in offsets],
           "min_index": torch.tensor(lo, dtype=torch.int64), "max_index": torch.tensor(hi, dtype=torch.int64)}
    io.torch_save(obj, out_dir / DATA_FILE)
    save_table_configs(out_dir / CONFIGS_FILE, tables, batch_size)


def configs_batch_size(data_dir: str | os.PathLike) -> int | None:
    """The batch a dataset's lookups were taken at, from ``data.pt`` or a ``batch_size`` key in
    ``table_configs.json``; None when neither says."""
    path = Path(data_dir)
    try:
        with open(path / CONFIGS_FILE, "rb") as fh:
            obj = json.loads(fh.read().decode("utf-8"))
        if isinstance(obj, dict) and "batch_size" in obj:
            value = obj["batch_size"]
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
            raise ShardError(f"{path / CONFIGS_FILE}: batch_size must be a positive integer, got {value!r}")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        pass  # the dataset loader reports unreadable configs
    try:
        return load_dataset(path).batch_size
    except ShardError:
        return None
