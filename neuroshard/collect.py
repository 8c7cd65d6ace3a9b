"""Cost-data collection for pre-training: random shards (compute) and random all-to-alls (communication).

Both run on the hardware oracle (:class:`~shardcore.oracles.measured.driver.PlanEvaluator`) and write tidy CSV
tables (pandas) into an output directory, next to a ``meta.json`` that records the measurement
setting (hardware fingerprint, dataset digest, batch size, optimizer, precision).

**Compute** (``compute_costs.csv``, one row per shard): a random shard has 1..``max_tables``
distinct tables drawn from every table of the dataset (``pool="all"``, the default: the original
pre-trains on the whole dataset and plans new *tasks* of its tables), or from one pool of the seeded
train/test split of ``tools/gen_tasks.py`` (``pool="train"``: the test tasks' tables never seen), each with
a dim drawn from ``max_dim, max_dim/2, ..., 4`` (data augmentation: the same table at many dims) or,
with probability ``whole_share``, every table at its own dim (a table-wise plan's device); with
probability ``pf_augment`` a table is made 2x or 4x heavier (:func:`heavier`; emulated oracles only);
if the shard's weights exceed ``max_mem`` GiB, its largest tables are dropped until it fits. Shards
are measured through the oracle's ``measure_devices``; the measurement cache around it
(:class:`~shardcore.oracles.cache.CachedOracle`) reads and fills the shard entries, so a shard measured
before (by any script) costs nothing. Columns: ``sample``,
``num_tables``, ``table_ids``, ``dims``, ``rows``, ``pooling_factors`` (``;``-separated, one entry
per table), ``bins`` (JSON, 17 reuse-histogram values per table), ``dim_sum``, ``mem_gb``,
``fw_ms``, ``bw_ms``, ``total_ms``, ``from_cache``, ``source`` (``random``, or ``cache`` for shards
imported from the measurement cache with ``from_cache=True``). The table columns rebuild every
:class:`~shardcore.tables.TableConfig` without the dataset.

**Communication** (``comm_costs.csv``, one row per sample): ``T`` tables (``T_range``) with random
dims are dealt to the devices with random imbalance (device shares drawn from a Dirichlet whose
concentration is itself random), giving per-device dim sums; each device starts its forward
all-to-all after a random delay from ``sleep_range`` (ms), mimicking imbalanced compute; the real
all-to-alls are timed by :meth:`PlanEvaluator.measure_comm`. Columns: ``sample``, ``ndevices``,
``num_tables``, then per device ``d``: ``dim_sum_d``, ``delay_ms_d``, ``fw_ms_d``, ``bw_ms_d``;
``source`` (``random``, or ``cache``: plans measured earlier by ``eval.py`` and friends, with no
delays, imported with ``from_cache=True``).

Collection is resumable: an existing CSV in the output directory is kept and appended to until it
holds ``data_size`` samples (the random draws continue with a fresh seed), provided it was measured
in the same setting. The CSV is rewritten atomically after every chunk of samples, so an interrupted
run loses at most one chunk.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from shardcore import io
from shardcore.errors import ShardError
from shardcore.oracles.cache import measurement_store, shard_key
from shardcore.oracles.factory import is_emulated
from shardcore.oracles.setting import PRODUCED_BY, produced_by, refuse_predictions
from shardcore.tables import NUM_BINS, TableConfig
from shardcore.data.features import heavier
from shardcore.types import CommLayout
from shardcore.data.taskgen import halving_dims, split_pools

from . import config
from .original_data import is_original_dir, read_original_comm_data, read_original_compute_data

LIST_COLUMNS = ("table_ids", "dims", "rows", "pooling_factors")
SETTING_KEYS = ("hardware", "dataset", "batch_size", "optimizer", "precision", "exchange")


# ----------------------------------------------------------------------------------------------
# Sampling
# ----------------------------------------------------------------------------------------------
def table_pool(num_tables: int, pool: str = config.COLLECTION.pool,
               train_fraction: float = config.COLLECTION.train_fraction,
               seed: int = config.COLLECTION.pool_seed) -> list[int]:
    """Dataset table ids to draw from: ``train`` / ``test`` (gen_tasks.py's split) or ``all``."""
    if pool == "all":
        return list(range(num_tables))
    if pool not in ("train", "test"):
        raise ShardError(f"--pool must be train, test or all, got {pool!r}")
    train, test = split_pools(num_tables, train_fraction, np.random.default_rng(seed))
    return train if pool == "train" else test


def random_shard(rng: np.random.Generator, tables: Sequence[TableConfig], pool: Sequence[int], max_tables: int,
                 max_mem_gb: float, dims: Sequence[int], precision: str = "fp16", whole_share: float = 0.0,
                 pf_augment: float = 0.0) -> list[TableConfig]:
    """1..max_tables distinct pool tables with random dims (with probability ``whole_share``: each at its own
    dim, a whole table), each with probability ``pf_augment`` :func:`heavier` by 1 or 2 doublings, trimmed
    (largest first) to ``max_mem_gb``."""
    n = int(rng.integers(1, min(max_tables, len(pool)) + 1))
    ids = rng.choice(np.asarray(pool), size=n, replace=False)
    ds = rng.choice(np.asarray(dims), size=n)
    if whole_share > 0 and rng.random() < whole_share:   # (no draw at 0: the original's sample stream)
        ds = [tables[int(i)].dim for i in ids]
    shard = [tables[int(i)].with_dim(int(d)) for i, d in zip(ids, ds)]
    if pf_augment > 0:
        shard = [heavier(t, int(rng.integers(1, 3))) if rng.random() < pf_augment else t for t in shard]
    shard.sort(key=lambda t: t.memory_gb(precision))
    while len(shard) > 1 and sum(t.memory_gb(precision) for t in shard) > max_mem_gb:
        shard.pop()
    if shard[0].memory_gb(precision) > max_mem_gb:   # a lone table over the cap: smallest dim that fits
        t = shard[0]
        for d in sorted(dims, reverse=True):
            if t.with_dim(int(d)).memory_gb(precision) <= max_mem_gb:
                return [t.with_dim(int(d))]
        return []
    rng.shuffle(shard)
    return shard


def random_comm_sample(rng: np.random.Generator, ndevices: int, t_range: Sequence[int], dims: Sequence[int],
                       sleep_range: Sequence[float]) -> tuple[int, list[int], list[float]]:
    """``(T, dim sums per device, delays in ms per device)`` for one communication sample."""
    t = int(rng.integers(int(t_range[0]), int(t_range[1]) + 1))
    table_dims = rng.choice(np.asarray(dims), size=t)
    alpha = float(10 ** rng.uniform(-0.5, 1.0))        # 0.3 (very uneven) .. 10 (nearly even)
    share = rng.dirichlet([alpha] * ndevices)
    dev = rng.choice(ndevices, size=t, p=share)
    dim_sums = np.bincount(dev, weights=table_dims, minlength=ndevices).astype(int).tolist()
    lo, hi = float(sleep_range[0]), float(sleep_range[1])
    if rng.random() < 0.1:   # some samples with all devices starting together (as a plan is measured)
        delays = [0.0] * ndevices
    else:
        delays = [round(float(x), 3) for x in rng.uniform(lo, hi, size=ndevices)]
    return t, dim_sums, delays


# ----------------------------------------------------------------------------------------------
# CSV rows
# ----------------------------------------------------------------------------------------------
def _join(values) -> str:
    return ";".join(str(v) for v in values)


def shard_row(sample: int, shard: Sequence[TableConfig], fw_ms: float, bw_ms: float, precision: str = "fp16",
              from_cache: bool = False, source: str = "random") -> dict:
    return {
        "sample": int(sample), "num_tables": len(shard),
        "table_ids": _join(t.index for t in shard), "dims": _join(t.dim for t in shard),
        "rows": _join(t.row for t in shard), "pooling_factors": _join(repr(float(t.pooling_factor)) for t in shard),
        "bins": json.dumps([[round(float(b), 6) for b in t.bins] for t in shard], separators=(",", ":")),
        "length_cvs": _join("" if t.length_cv is None else repr(float(t.length_cv)) for t in shard),
        "dim_sum": sum(t.dim for t in shard), "mem_gb": round(sum(t.memory_gb(precision) for t in shard), 6),
        "fw_ms": float(fw_ms), "bw_ms": float(bw_ms), "total_ms": float(fw_ms) + float(bw_ms),
        "from_cache": bool(from_cache), "source": source,
    }


def row_tables(row) -> list[TableConfig]:
    """Rebuild a compute row's tables."""
    ids = [int(x) for x in str(row["table_ids"]).split(";")]
    dims = [int(x) for x in str(row["dims"]).split(";")]
    rows = [int(x) for x in str(row["rows"]).split(";")]
    pfs = [float(x) for x in str(row["pooling_factors"]).split(";")]
    bins = json.loads(row["bins"]) if isinstance(row.get("bins"), str) and row["bins"] else [[0.0] * NUM_BINS] * len(ids)
    if not (len(ids) == len(dims) == len(rows) == len(pfs) == len(bins)):
        raise ShardError(f"compute sample {row.get('sample')}: table columns of different lengths")
    if not all(v > 0 for v in rows + dims) or not all(math.isfinite(v) and v >= 0 for v in pfs):
        raise ShardError(f"rows and dims must be positive, pooling factors finite and >= 0 (got rows {rows}, "
                         f"dims {dims}, pooling factors {pfs})")
    if not all(isinstance(bs, list) and all(isinstance(b, (int, float)) and math.isfinite(b) and b >= 0 for b in bs)
               for bs in bins):
        raise ShardError("bins must be lists of finite numbers >= 0")
    cvs = [None if c.strip() in ("", "nan") else float(c) for c in str(row.get("length_cvs", "")).split(";")]
    cvs = cvs if len(cvs) == len(ids) and all(c is None or (math.isfinite(c) and c >= 0) for c in cvs) else [None] * len(ids)
    return [TableConfig(i, r, d, p, tuple(float(b) for b in bs), c)
            for i, d, r, p, bs, c in zip(ids, dims, rows, pfs, bins, cvs)]


def comm_row(sample: int, num_tables: int, dim_sums: Sequence[int], delays: Sequence[float],
             costs: Sequence[Sequence[float]], source: str = "random") -> dict:
    row = {"sample": int(sample), "ndevices": len(dim_sums), "num_tables": int(num_tables)}
    for d, v in enumerate(dim_sums):
        row[f"dim_sum_{d}"] = int(v)
    for d, v in enumerate(delays):
        row[f"delay_ms_{d}"] = float(v)
    for d, (fw, bw) in enumerate(costs):
        row[f"fw_ms_{d}"] = float(fw)
        row[f"bw_ms_{d}"] = float(bw)
    row["source"] = source
    return row


@contextlib.contextmanager
def _csv_row(path: Path, index: int):
    """Reading row ``index`` of a cost CSV: a missing, non-numeric or out-of-range value (a row cut
    short, a ``nan`` cost) becomes one line naming the file and its line."""
    try:
        yield
    except ShardError as exc:
        text = str(exc)
        raise ShardError(text if text.startswith(str(path)) else f"{path}:{index + 2}: {text}") from None
    except (ValueError, TypeError, KeyError, AttributeError, json.JSONDecodeError) as exc:
        raise ShardError(f"{path}:{index + 2}: unreadable cost row ({type(exc).__name__}: {io.first_line(exc, 120)})"
                         ) from None


def _cost(v, what: str) -> float:
    """A cost (or size) from a CSV cell: a finite number >= 0."""
    if isinstance(v, str) or isinstance(v, bool):
        raise ShardError(f"{what} must be a number, got {v!r}")
    x = float(v)
    if not (math.isfinite(x) and x >= 0):
        raise ShardError(f"{what} must be a finite number >= 0, got {v!r}")
    return x


def _whole(v, what: str, low: int = 0) -> int:
    x = _cost(v, what)
    if x != int(x) or x < low:
        raise ShardError(f"{what} must be a whole number >= {low}, got {v!r}")
    return int(x)


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path, dtype={c: str for c in LIST_COLUMNS})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ShardError(f"{path}: cannot read cost data ({type(exc).__name__}: {exc})") from None


def _write_csv(path: Path, rows: list[dict]) -> None:
    with io.atomic_open(path) as fh:
        pd.DataFrame(rows).to_csv(fh, index=False)


def _split_paths(paths: str | os.PathLike | Sequence) -> list:
    if isinstance(paths, (str, os.PathLike)):
        paths = [p for p in str(paths).split(",") if p.strip()]
    return list(paths)


def _csv_paths(paths: str | os.PathLike | Sequence, name: str) -> list[Path]:
    paths = _split_paths(paths)
    out = []
    for p in paths:
        p = Path(p)
        f = p / name if p.is_dir() else p
        if not f.is_file():
            raise ShardError(f"no cost data at {f} (collect it first: collect_compute_cost_data.py / "
                             "collect_comm_cost_data.py, or train_neuroshard.py)")
        out.append(f)
    return out


def read_meta(csv_path: Path) -> dict:
    meta = csv_path.parent / config.META_JSON
    if not meta.is_file():
        return {}
    try:
        obj = json.loads(meta.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ShardError(f"{meta}: unreadable ({exc}): the setting its samples were measured in is unknown; "
                         "move it away and collect again") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("setting", {}), dict):
        raise ShardError(f"{meta}: not a cost data meta file (expected an object with a 'setting' object)")
    return obj


def common_setting(metas: Sequence[dict], where: Sequence[str] = ()) -> dict:
    """The setting shared by several data files (``where``: their names): samples measured in different
    settings (another oracle, dataset, batch, optimizer, precision or exchange model) would train one model
    on a mix, refused in one line naming the field; a key a file does not state (older data) is not compared."""
    settings = [m.get("setting", {}) for m in metas]
    names = list(where) or [f"data file {k + 1}" for k in range(len(settings))]
    out = {}
    for key in SETTING_KEYS:
        given = [(n, s[key]) for n, s in zip(names, settings) if s.get(key) is not None]
        other = next(((n, v) for n, v in given if v != given[0][1]), None)
        if other is not None:
            raise ShardError(f"cost data measured in different settings: {key} {given[0][1]!r} in {given[0][0]}, "
                             f"{other[1]!r} in {other[0]}; train on data of one setting")
        if given and len(given) == len(settings):
            out[key] = given[0][1]
    return out


def load_compute_data(paths) -> tuple[list[list[TableConfig]], np.ndarray, dict]:
    """Shards, costs ``[N, 2]`` (fw, bw ms) and the common setting from compute data directories/CSVs."""
    paths = _split_paths(paths)
    originals = [p for p in paths if is_original_dir(p, config.COMPUTE_CSV)]   # NeuroShard's data.txt
    files = _csv_paths([p for p in paths if p not in originals], config.COMPUTE_CSV) if len(originals) < len(paths) else []
    shards, costs, metas = [], [], []
    for p in originals:
        s, c, setting = read_original_compute_data(p)
        shards += s
        costs += [tuple(x) for x in c]
        metas.append({"setting": setting})
    for f in files:
        df = _read_csv(f)
        missing = [c for c in ("table_ids", "dims", "rows", "pooling_factors", "fw_ms", "bw_ms") if c not in df]
        if missing:
            raise ShardError(f"{f}: not a compute cost table (missing {', '.join(missing)})")
        for i, (_, row) in enumerate(df.iterrows()):
            with _csv_row(f, i):
                shards.append(row_tables(row))
                costs.append((_cost(row["fw_ms"], "fw_ms"), _cost(row["bw_ms"], "bw_ms")))
        metas.append(read_meta(f))
        refuse_predictions(metas[-1], str(f.parent / config.META_JSON), f"{f.name}'s measured costs")
    setting = common_setting(metas, [str(p) for p in originals + files])
    return shards, np.asarray(costs, dtype=np.float64).reshape(-1, 2), setting


def load_comm_data(paths) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[np.ndarray], dict]:
    """Per sample: dim sums, delays, fw ms and bw ms per device (device counts may differ), and the setting."""
    paths = _split_paths(paths)
    originals = [p for p in paths if is_original_dir(p, config.COMM_CSV)]   # NeuroShard's data.txt
    files = _csv_paths([p for p in paths if p not in originals], config.COMM_CSV) if len(originals) < len(paths) else []
    dims, delays, fw, bw, metas = [], [], [], [], []
    for p in originals:
        o = read_original_comm_data(p)
        for arr, part in zip((dims, delays, fw, bw), o[:4]):
            arr += part
        metas.append({"setting": o[4]})
    for f in files:
        df = _read_csv(f)
        if "ndevices" not in df:
            raise ShardError(f"{f}: not a communication cost table (no ndevices column)")
        for i, (_, row) in enumerate(df.iterrows()):
            with _csv_row(f, i):
                n = _whole(row["ndevices"], "ndevices", 1)
                try:
                    got = [np.array([_cost(row[f"{k}_{d}"], f"{k}_{d}") for d in range(n)], dtype=np.float64)
                           for k in ("dim_sum", "delay_ms", "fw_ms", "bw_ms")]
                except KeyError as exc:
                    raise ShardError(f"{f}: sample {row.get('sample')} lacks column {exc}") from None
                for arr, v in zip((dims, delays, fw, bw), got):
                    arr.append(v)
        metas.append(read_meta(f))
        refuse_predictions(metas[-1], str(f.parent / config.META_JSON), f"{f.name}'s measured costs")
    return dims, delays, fw, bw, common_setting(metas, [str(p) for p in originals + files])


# ----------------------------------------------------------------------------------------------
# Collection
# ----------------------------------------------------------------------------------------------
def evaluator_setting(ev, exchange: bool = True) -> dict:
    """What the samples depend on besides themselves; ``exchange``: the all-to-alls' (communication data)."""
    from shardcore.oracles.factory import exchange_setting

    ctx = ev.context
    out = {"hardware": ctx.hardware, "dataset": ctx.dataset, "batch_size": int(ctx.batch_size),
           "optimizer": ctx.optimizer, "precision": ctx.precision}
    return {**out, "exchange": exchange_setting(ev)} if exchange else out


def check_resumable(out_dir: str | os.PathLike, kind: str, setting: dict) -> None:
    """A collection into ``out_dir`` tops up the samples there only if they are ``kind`` data measured in
    ``setting`` (:func:`evaluator_setting`): else one line, before anything is measured."""
    csv_path = Path(out_dir) / (config.COMPUTE_CSV if kind == "compute" else config.COMM_CSV)
    if not csv_path.is_file():
        return
    old = read_meta(csv_path)
    old_setting = old.get("setting", {})
    diff = [k for k in SETTING_KEYS if k in old_setting and old_setting[k] != setting.get(k)]
    if old.get("kind", kind) != kind:
        raise ShardError(f"{out_dir} holds {old.get('kind')} data, not {kind} data: choose another --out_dir")
    if not diff and "exchange" not in old_setting and setting.get("exchange", "measured") != "measured":
        diff = ["exchange"]   # samples of a modelled exchange that does not say whose constants
    if diff:
        k = diff[0]
        raise ShardError(f"{csv_path} was measured in another setting ({k} {old_setting.get(k, 'not recorded')!r}, "
                         f"this run {setting.get(k)!r}): its samples and this run's would be mixed; choose "
                         "another --out_dir to collect for this one")


def _prepare(out_dir: Path, csv_name: str, kind: str, setting: dict, params: dict) -> list[dict]:
    """Existing rows of a resumable collection (after checking its setting); writes meta.json."""
    check_resumable(out_dir, kind, setting)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / csv_name
    meta_path = out_dir / config.META_JSON
    rows: list[dict] = []
    if csv_path.is_file():
        df = _read_csv(csv_path)
        rows = df.to_dict("records")
        for r in rows:
            for c in LIST_COLUMNS:
                if c in r:
                    r[c] = str(r[c])
    io.write_json(meta_path, {"kind": kind, "setting": setting, "params": params,
                              PRODUCED_BY: produced_by(f"neuroshard.collect ({kind})", setting.get("hardware")),
                              "updated": time.strftime("%Y-%m-%d %H:%M:%S")})
    return rows


@dataclass
class CollectStats:
    path: Path
    total: int           # samples in the file now
    added: int           # samples added by this run
    from_cache: int      # of which answered by the measurement cache
    seconds: float


def check_compute_args(max_tables: int, max_mem_gb: float, max_dim: int) -> tuple[int, ...]:
    """Validate the compute collection's settings (call before starting any hardware); returns its dims."""
    if max_tables < 1 or not (math.isfinite(max_mem_gb) and max_mem_gb > 0):
        raise ShardError("--max_tables must be >= 1 and --max_mem a positive finite number")
    return halving_dims(max_dim, config.MIN_DIM)


def check_comm_args(t_range: Sequence[int], sleep_range: Sequence[float], max_dim: int) -> tuple[int, ...]:
    """Validate the communication collection's settings (call before starting any hardware)."""
    if len(t_range) != 2 or not 1 <= t_range[0] <= t_range[1]:
        raise ShardError(f"--T_range takes MIN,MAX with 1 <= MIN <= MAX, got {list(t_range)}")
    if (len(sleep_range) != 2 or not all(math.isfinite(float(v)) for v in sleep_range)
            or not 0 <= sleep_range[0] <= sleep_range[1]):
        raise ShardError(f"--sleep_range takes MIN,MAX milliseconds with 0 <= MIN <= MAX, got {list(sleep_range)}")
    return halving_dims(max_dim, config.MIN_DIM)


def collect_compute(ev, out_dir: str | os.PathLike, data_size: int | None, max_tables: int = config.COLLECTION.max_tables,
                    max_mem_gb: float = config.COLLECTION.max_mem_gb, max_dim: int = config.COLLECTION.max_dim,
                    pool: str = config.COLLECTION.pool, pool_seed: int = config.COLLECTION.pool_seed,
                    train_fraction: float = config.COLLECTION.train_fraction, seed: int = config.COLLECTION.seed,
                    chunk: int = config.COLLECTION.chunk, from_cache: bool = config.COLLECTION.from_cache,
                    progress: bool = True, group_tables: int = config.COLLECTION.group_tables,
                    group_shards: int = config.COLLECTION.group_shards,
                    whole_share: float | None = config.COLLECTION.whole_share,
                    pf_augment: float | None = config.COLLECTION.pf_augment) -> CollectStats:
    """Measure random shards until ``out_dir/compute_costs.csv`` holds ``data_size`` of them.

    ``data_size``, ``whole_share``, ``pf_augment`` None: :data:`config.COMPUTE_DEFAULTS` for the oracle
    (emulated: 10,000 samples, half of them shards of whole tables, a quarter of the tables 2x or 4x
    heavier; measured: the original's 2,000 samples of random dims, no heavier tables).

    ``group_tables > 0``: each oracle call measures ``group_shards`` shards drawn from one random
    subset of ``group_tables`` pool tables (a fresh subset per call), instead of ``chunk`` shards
    from the whole pool."""
    from tqdm import tqdm


    t0 = time.perf_counter()
    fill = config.COMPUTE_DEFAULTS[is_emulated(ev)]
    data_size = fill["compute_samples"] if data_size is None else data_size
    whole_share = fill["whole_share"] if whole_share is None else whole_share
    pf_augment = fill["pf_augment"] if pf_augment is None else pf_augment
    dims = check_compute_args(max_tables, max_mem_gb, max_dim)
    tables = ev.dataset.tables
    ids = table_pool(len(tables), pool, train_fraction, pool_seed)
    precision = ev.precision
    out_dir = Path(out_dir)
    params = {"max_tables": max_tables, "max_mem_gb": max_mem_gb, "max_dim": max_dim, "pool": pool,
              "pool_seed": pool_seed, "train_fraction": train_fraction, "seed": seed}
    if group_tables < 0 or group_shards < 1:
        raise ShardError(f"--group-tables must be >= 0 and --group-shards >= 1, got {group_tables}, {group_shards}")
    if group_tables:
        params.update(group_tables=int(group_tables), group_shards=int(group_shards))
    if not 0.0 <= whole_share <= 1.0:
        raise ShardError(f"--whole-share must be in [0, 1], got {whole_share}")
    if whole_share:
        params.update(whole_share=float(whole_share))
    if not 0.0 <= pf_augment <= 1.0:
        raise ShardError(f"--pf-augment must be in [0, 1], got {pf_augment}")
    if pf_augment:
        if not is_emulated(ev):
            raise ShardError("--pf-augment needs an emulated oracle (--oracle emulated:...): a measured one looks up "
                             "the dataset's real ids, whatever a table's pooling factor says")
        params.update(pf_augment=float(pf_augment))
    rows = _prepare(out_dir, config.COMPUTE_CSV, "compute", evaluator_setting(ev, exchange=False), params)
    csv_path = out_dir / config.COMPUTE_CSV
    added = hits = 0
    store = measurement_store(ev)
    if from_cache and store is not None:
        have = {shard_key(row_tables(r)) for r in rows}
        allowed = set(ids)
        for e in store.shard_entries(ev.context):
            if e.tables in have or any(i not in allowed or i >= len(tables) for i, _, _ in e.tables):
                continue
            shard = [TableConfig(i, r, d, tables[i].pooling_factor, tables[i].bins, tables[i].length_cv) for i, r, d in e.tables]
            rows.append(shard_row(len(rows), shard, e.fw_ms, e.bw_ms, precision, True, "cache"))
            have.add(e.tables)
            added += 1
            hits += 1
        if added:
            _write_csv(csv_path, rows)
    rng = np.random.default_rng([int(seed), len(rows)])
    todo = max(0, int(data_size) - len(rows))
    with tqdm(total=max(int(data_size), len(rows)), initial=len(rows), desc="compute samples", unit="shard",
              disable=not progress, dynamic_ncols=True) as bar:
        while todo > 0:
            batch = []
            draw_from = ids
            size = chunk
            if group_tables:
                draw_from = sorted(int(i) for i in rng.choice(np.asarray(ids), size=min(int(group_tables), len(ids)),
                                                                replace=False))
                size = int(group_shards)
            while len(batch) < min(size, todo):
                s = random_shard(rng, tables, draw_from, max_tables, max_mem_gb, dims, precision, whole_share, pf_augment)
                if s:
                    batch.append(s)
            cached = [store is not None and ev.is_stored(s) for s in batch]
            costs = ev.measure_devices(batch)
            for s, c, hit in zip(batch, costs, cached):
                rows.append(shard_row(len(rows), s, c.fw_ms, c.bw_ms, precision, hit))
            _write_csv(csv_path, rows)
            added += len(batch)
            hits += sum(cached)
            todo -= len(batch)
            bar.update(len(batch))
    return CollectStats(csv_path, len(rows), added, hits, time.perf_counter() - t0)


def collect_comm(ev, out_dir: str | os.PathLike, data_size: int,
                 t_range: Sequence[int] = tuple(config.COLLECTION.T_range),
                 sleep_range: Sequence[float] = tuple(config.COLLECTION.sleep_range),
                 max_dim: int = config.COLLECTION.max_dim, seed: int = config.COLLECTION.seed,
                 chunk: int = config.COLLECTION.chunk, from_cache: bool = config.COLLECTION.from_cache,
                 progress: bool = True) -> CollectStats:
    """Time random all-to-alls until ``out_dir/comm_costs.csv`` holds ``data_size`` samples."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    dims = check_comm_args(t_range, sleep_range, max_dim)
    n = ev.ndevices
    out_dir = Path(out_dir)
    params = {"ndevices": n, "T_range": list(t_range), "sleep_range": list(sleep_range), "max_dim": max_dim,
              "seed": seed}
    rows = _prepare(out_dir, config.COMM_CSV, "comm", evaluator_setting(ev), params)
    if any(int(r.get("ndevices", n)) != n for r in rows):
        raise ShardError(f"{out_dir} holds communication data of another device count: choose another --out_dir")
    csv_path = out_dir / config.COMM_CSV
    added = hits = 0
    store = measurement_store(ev)
    if from_cache and store is not None:
        seen = {tuple(r[f"dim_sum_{d}"] for d in range(n)) for r in rows if r.get("source") == "cache"}
        for e in store.plan_entries(ev.context, ndevices=n):
            dim_sums = tuple(int(sum(t[2] for t in s)) for s in e.shards)
            if dim_sums in seen:
                continue
            seen.add(dim_sums)
            num = sum(len(s) for s in e.shards)
            rows.append(comm_row(len(rows), num, dim_sums, [0.0] * n, [(c[1], c[2]) for c in e.device_costs_ms],
                                 "cache"))
            added += 1
            hits += 1
        if added:
            _write_csv(csv_path, rows)
    rng = np.random.default_rng([int(seed), len(rows)])
    todo = max(0, int(data_size) - len(rows))
    with tqdm(total=max(int(data_size), len(rows)), initial=len(rows), desc="comm samples", unit="sample",
              disable=not progress, dynamic_ncols=True) as bar:
        while todo > 0:
            for _ in range(min(chunk, todo)):
                t, dim_sums, delays = random_comm_sample(rng, n, t_range, dims, sleep_range)
                costs, _ = ev.measure_comm(CommLayout(list(dim_sums)), delays)
                rows.append(comm_row(len(rows), t, dim_sums, delays, costs))
                added += 1
                todo -= 1
                bar.update(1)
            _write_csv(csv_path, rows)
    return CollectStats(csv_path, len(rows), added, hits, time.perf_counter() - t0)
