"""Readers for the cost data that NeuroShard's original collection scripts wrote (``data.txt``).

**Compute** (``collect_compute_cost_data.py --out_dir DIR``): ``DIR/table_configs.json`` lists the
augmented tables, every dataset table once per dim ``max_dim, max_dim/2, .., 4`` (dataset order
within each dim block; ``row``, ``pooling_factor``, ``bin_0..bin_16``, ``dim``), and each line of
``DIR/data.txt`` is ``i1,i2,...,ik cost``: a shard of those augmented tables (ids may repeat) and its
measured cost in ms, forward and backward timed together. Our compute model predicts the forward
and the backward cost separately, so the total is split evenly between them (an assumption: the
plan cost, their sum, is exact; the split is not known from these files).

**Communication** (``collect_comm_cost_data.py --out_dir DIR``): each line of ``DIR/data.txt`` is
``dim_sums delays fw_costs bw_costs``, four comma-separated lists with one entry per device: the
per-device dim sums, the start delays (ms), and the forward and backward all-to-all times (ms).

:func:`neuroshard.collect.load_compute_data` and :func:`~neuroshard.collect.load_comm_data` read a
directory in this layout when it has ``data.txt`` and none of our CSV files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from shardcore.errors import ShardError
from shardcore.oracles.setting import EXACT_SGD
from shardcore.originals import tables_from_original_list
from shardcore.tables import TableConfig

DATA_TXT = "data.txt"
CONFIGS = "table_configs.json"
# what is known of the original measurement setting (EXACT_SGD, fp32 weights); its hardware and batch are not
ORIGINAL_COMPUTE_SETTING = {"optimizer": EXACT_SGD, "precision": "fp32"}


def is_original_dir(path: str | os.PathLike, csv_name: str) -> bool:
    p = Path(path)
    return p.is_dir() and (p / DATA_TXT).is_file() and not (p / csv_name).is_file()


def _floats(text: str, what: str, where: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise ShardError(f"{where}: {what} must be comma-separated numbers, got {text!r}") from None


def _lines(path: Path):
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            yield f"{path}:{lineno}", line.split()


def read_original_compute_data(data_dir: str | os.PathLike) -> tuple[list[list[TableConfig]], np.ndarray, dict]:
    """Shards, costs ``[N, 2]`` (fw, bw ms: the measured total split evenly) and the known setting."""
    d = Path(data_dir)
    cfg_path = d / CONFIGS
    if not cfg_path.is_file():
        raise ShardError(f"{d}: NeuroShard's compute data needs {CONFIGS} beside {DATA_TXT} "
                         "(the augmented tables its collect_compute_cost_data.py wrote)")
    try:
        obj = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise ShardError(f"{cfg_path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if isinstance(obj, dict) and isinstance(obj.get("tables"), list):
        obj = obj["tables"]
    if not isinstance(obj, list) or any(not isinstance(t, dict) or "dim" not in t for t in obj):
        raise ShardError(f"{cfg_path}: expected NeuroShard's list of augmented tables, each with a dim")
    aug = tables_from_original_list([{k: v for k, v in t.items() if k != "index"} for t in obj], cfg_path)
    # the dataset's table count: the length of the first block of equal dims
    block = next((k for k, t in enumerate(aug) if t.dim != aug[0].dim), len(aug))
    aug = [TableConfig(k % block, t.row, t.dim, t.pooling_factor, t.bins) for k, t in enumerate(aug)]
    shards, costs = [], []
    for where, parts in _lines(d / DATA_TXT):
        if len(parts) != 2:
            raise ShardError(f"{where}: expected 'table_ids cost' (NeuroShard's compute data), got {len(parts)} fields")
        try:
            ids = [int(x) for x in parts[0].split(",")]
            total = float(parts[1])
        except ValueError:
            raise ShardError(f"{where}: malformed line {' '.join(parts)!r}") from None
        bad = [i for i in ids if not 0 <= i < len(aug)]
        if bad:
            raise ShardError(f"{where}: table id {bad[0]} out of range: {CONFIGS} lists {len(aug)} tables")
        if not total > 0:
            raise ShardError(f"{where}: cost must be positive, got {parts[1]}")
        shards.append([aug[i] for i in ids])
        costs.append((total / 2.0, total / 2.0))
    if not shards:
        raise ShardError(f"{d / DATA_TXT}: no samples")
    return shards, np.asarray(costs, dtype=np.float64).reshape(-1, 2), dict(ORIGINAL_COMPUTE_SETTING)


def read_original_comm_data(data_dir: str | os.PathLike):
    """Per sample: dim sums, delays, fw ms and bw ms per device (as :func:`neuroshard.collect.load_comm_data`)."""
    d = Path(data_dir)
    dims, delays, fw, bw = [], [], [], []
    for where, parts in _lines(d / DATA_TXT):
        if len(parts) != 4:
            raise ShardError(f"{where}: expected 'dim_sums delays fw_costs bw_costs' (NeuroShard's "
                             f"communication data), got {len(parts)} fields")
        row = [_floats(p, name, where) for p, name in zip(parts, ("dim sums", "delays", "fw costs", "bw costs"))]
        if len({len(r) for r in row}) != 1:
            raise ShardError(f"{where}: the four lists must have one entry per device each")
        for arr, r in zip((dims, delays, fw, bw), row):
            arr.append(np.array(r, dtype=np.float64))
    if not dims:
        raise ShardError(f"{d / DATA_TXT}: no samples")
    return dims, delays, fw, bw, {}
