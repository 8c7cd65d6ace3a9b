"""Meta's raw ``dlrm_datasets`` format, its processing into a dataset directory, and a synthetic
generator that writes the same raw format with the published statistics.

Raw format (e.g. ``fbgemm_t856_bs65536.pt.gz``): one ``torch.save``d tuple ``(indices, offsets,
lengths)``, optionally gzipped. ``lengths`` has shape ``[T, B]`` (T tables, batch B); ``offsets`` has
``T * B + 1`` entries over the concatenation of all tables' indices, so table ``t``, sample ``b``
looks up ``indices[offsets[t * B + b] : offsets[t * B + b + 1]]``.

Processing (:func:`process_raw`) turns it, table by table, into per-table CSR lookups plus a
:class:`~shardcore.tables.TableConfig` (``row`` = max index + 1, ``pooling_factor`` = mean lookups per
kept sample, the 17 reuse bins of the kept batch, a ``dim``), which :func:`write_dataset` stores with
:func:`shardcore.dataset.save_dataset`.

The real main file holds about 0.9 billion int64 indices (7 GB), so nothing here makes a second int64
copy of them: a ``.gz`` is stream-decompressed to a temporary file that is memory-mapped, and the
synthetic generator fills one preallocated int64 array table by table.
"""

from __future__ import annotations

import gzip
import math
import os
import shutil
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from shardcore import io
from shardcore.dataset import save_dataset
from shardcore.errors import ShardError
from shardcore.planning import DEFAULT_BATCH_SIZE
from shardcore.tables import NUM_BINS, TableConfig

DEFAULT_DIM = 16
DEFAULT_SYNTHETIC_TABLES = 856
DEFAULT_SYNTHETIC_BATCH = DEFAULT_BATCH_SIZE   # the batch every planner assumes where none is said

# Upper edges of the reuse bins 0..15: a row looked up c times falls in bin
# searchsorted(REUSE_EDGES, c, "left"), i.e. (0,1] -> 0, (1,2] -> 1, (2,4] -> 2, ..., (2^15, inf) -> 16.
REUSE_EDGES = np.array([1 << k for k in range(NUM_BINS - 1)], dtype=np.int64)
BIN_LABELS = tuple(["(0,1]"] + [f"({1 << (k - 1)},{1 << k}]" for k in range(1, NUM_BINS - 1)]
                   + [f">{1 << (NUM_BINS - 2)}"])

# Published statistics of the main file (fbgemm_t856_bs65536), as the FBGEMM dlrm_datasets release describes it.
PUBLISHED_NUM_TABLES = 856
PUBLISHED_BATCH_SIZE = 65536
PUBLISHED_MEAN_POOLING = 15.8
PUBLISHED_REUSE_BY_LOOKUPS = (.069, .044, .068, .101, .121, .104, .073, .058, .052, .050, .049, .048,
                              .048, .043, .031, .023, .019)
PUBLISHED_REUSE_BY_ROWS = (.473, .152, .139, .112, .072, .032, .011, .005, .002, .001, 0.0, 0.0,
                           0.0, 0.0, 0.0, 0.0, 0.0)
KNOWN_TABLE_ROWS = 6_618_839   # one table of the main file is known: its hash size ...
KNOWN_TABLE_POOLING = 194.0    # ... and its lookups per sample

INT32_MAX = (1 << 31) - 1


# ---------------------------------------------------------------------------------------------
# The raw format
# ---------------------------------------------------------------------------------------------
@dataclass
class RawDLRM:
    """A raw dlrm_datasets tuple. Tensors may be memory-mapped; nothing here copies ``indices``."""

    indices: torch.Tensor   # 1-D, all tables' lookups concatenated
    offsets: torch.Tensor   # 1-D, T * B + 1 entries
    lengths: torch.Tensor   # [T, B]
    source: str = "raw data"

    @property
    def num_tables(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[1])

    @property
    def num_lookups(self) -> int:
        return int(self.indices.numel())

    def table_lookups(self, t: int, num_samples: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Table ``t``'s first ``num_samples`` samples as ``(indices, offsets)``; offsets start at 0
        and have ``num_samples + 1`` entries. ``indices`` is a view into the raw tensor."""
        B = self.batch_size
        n = B if num_samples is None else num_samples
        off = self.offsets[t * B: t * B + n + 1]
        start, end = int(off[0]), int(off[-1])
        return self.indices[start:end], off - start

    def to_tuple(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.indices, self.offsets, self.lengths


def validate_raw(obj, source: str = "raw data") -> RawDLRM:
    """Check the shape of a loaded raw object (cheap checks only; per-table consistency of offsets
    and lengths is checked while processing). Raises :class:`ShardError` with one line."""
    if not isinstance(obj, (tuple, list)) or len(obj) != 3:
        what = f"a {type(obj).__name__} of {len(obj)} items" if isinstance(obj, (tuple, list)) else \
            f"a {type(obj).__name__}"
        raise ShardError(f"{source}: expected a tuple (indices, offsets, lengths), got {what}")
    names = ("indices", "offsets", "lengths")
    for name, t in zip(names, obj):
        if not isinstance(t, torch.Tensor):
            raise ShardError(f"{source}: {name} is a {type(t).__name__}, expected a tensor")
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise ShardError(f"{source}: {name} has dtype {t.dtype}, expected integers")
    indices, offsets, lengths = obj
    if indices.dim() != 1:
        raise ShardError(f"{source}: indices must be 1-D, got shape {list(indices.shape)}")
    if lengths.dim() != 2:
        raise ShardError(f"{source}: lengths must have shape [tables, batch], got {list(lengths.shape)}")
    T, B = lengths.shape
    if T < 1 or B < 1:
        raise ShardError(f"{source}: lengths has shape {list(lengths.shape)}: no tables or no samples")
    if offsets.dim() != 1 or offsets.numel() != T * B + 1:
        raise ShardError(f"{source}: offsets has shape {list(offsets.shape)}, expected [{T * B + 1}] "
                         f"(tables x batch + 1 = {T} x {B} + 1)")
    first, last = int(offsets[0]), int(offsets[-1])
    if first != 0 or last != indices.numel():
        raise ShardError(f"{source}: offsets run from {first} to {last}, expected 0 to "
                         f"{indices.numel()} (the number of indices)")
    return RawDLRM(indices=indices, offsets=offsets, lengths=lengths, source=source)


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def load_raw(path: str | os.PathLike, tmp_dir: str | os.PathLike | None = None) -> RawDLRM:
    """Load a raw ``.pt`` or ``.pt.gz`` file without a second in-memory copy of the indices.

    A gzipped file is stream-decompressed to a temporary file in ``tmp_dir`` (default: the system
    temporary directory); the file is memory-mapped and unlinked at once, so its disk space is
    returned when the tensors are freed. Files in torch's legacy (pre-zip) format cannot be mapped
    and are read into memory instead.
    """
    path = Path(path)
    if not path.is_file():
        raise ShardError(f"raw DLRM data not found: {path}")
    source = str(path)
    tmp: Path | None = None
    try:
        if _is_gzip(path):
            if tmp_dir is not None:
                Path(tmp_dir).mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=".dlrm-raw-", suffix=".pt", dir=tmp_dir)
            tmp = Path(name)
            try:
                with os.fdopen(fd, "wb") as out, gzip.open(path, "rb") as src:
                    shutil.copyfileobj(src, out, 16 << 20)
            except (OSError, EOFError, zlib.error) as exc:
                raise ShardError(f"{source}: cannot decompress ({type(exc).__name__}: {exc})") from None
            target = tmp
        else:
            target = path
        obj = _read_torch_file(target, source)
    finally:
        if tmp is not None and tmp.exists():
            tmp.unlink()  # a mapping stays valid after the unlink
    return validate_raw(obj, source)


def _read_torch_file(path: Path, source: str):
    mappable = zipfile.is_zipfile(path)
    return io.safe_torch_load(path, "raw DLRM data", name=source, mmap=mappable)


def save_raw(raw: RawDLRM | Sequence[torch.Tensor], path: str | os.PathLike, compresslevel: int = 1) -> None:
    """Write a raw tuple atomically; a path ending in ``.gz`` is gzipped (level ``compresslevel``)."""
    obj = raw.to_tuple() if isinstance(raw, RawDLRM) else tuple(raw)
    path = Path(path)
    if path.suffix != ".gz":
        io.torch_save(obj, path)
        return
    with io.atomic_path(path) as tmp:
        with gzip.open(tmp, "wb", compresslevel=compresslevel) as fh:
            torch.save(obj, fh)


# ---------------------------------------------------------------------------------------------
# Reuse statistics
# ---------------------------------------------------------------------------------------------
def reuse_counts(indices: torch.Tensor | np.ndarray, row: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Reuse of one table's batch: ``(rows_per_bin, lookups_per_bin)``, two int64 arrays of 17.

    ``rows_per_bin[k]``: distinct rows looked up a number of times in bin ``k``;
    ``lookups_per_bin[k]``: lookups that fall on those rows. ``row`` (the hash size) only picks the
    counting method; indices must be non-negative.
    """
    idx = indices.numpy() if isinstance(indices, torch.Tensor) else np.asarray(indices)
    rows = np.zeros(NUM_BINS, dtype=np.int64)
    looks = np.zeros(NUM_BINS, dtype=np.int64)
    if idx.size == 0:
        return rows, looks
    if row is None:
        row = int(idx.max()) + 1
    if row <= 8 * idx.size + (1 << 16):
        counts = np.bincount(idx, minlength=row)
        counts = counts[counts > 0]
    else:  # a huge table with few lookups: sort rather than allocate a counter per row
        counts = np.unique(idx, return_counts=True)[1]
    bins = np.searchsorted(REUSE_EDGES, counts, side="left")
    rows += np.bincount(bins, minlength=NUM_BINS)
    looks += np.bincount(bins, weights=counts, minlength=NUM_BINS).astype(np.int64)
    return rows, looks


def reuse_bins(rows_per_bin: np.ndarray) -> tuple[float, ...]:
    """The 17 ``bin_*`` features (fractions of distinct rows) from :func:`reuse_counts`; all 0 when
    nothing was looked up."""
    total = int(np.sum(rows_per_bin))
    if total == 0:
        return (0.0,) * NUM_BINS
    return tuple(float(v) / total for v in rows_per_bin)


def aggregate_reuse(rows_per_bin: np.ndarray, lookups_per_bin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Aggregate reuse histograms over all tables, ``(by_lookups, by_rows)``, from per-table counts
    of shape ``[T, 17]``: the fraction of all lookups falling on rows with reuse count in each bin, and
    the fraction of all distinct (table, row) pairs in each bin."""
    rows = np.asarray(rows_per_bin, dtype=np.float64).reshape(-1, NUM_BINS).sum(axis=0)
    looks = np.asarray(lookups_per_bin, dtype=np.float64).reshape(-1, NUM_BINS).sum(axis=0)
    by_lookups = looks / looks.sum() if looks.sum() > 0 else np.zeros(NUM_BINS)
    by_rows = rows / rows.sum() if rows.sum() > 0 else np.zeros(NUM_BINS)
    return by_lookups, by_rows


# ---------------------------------------------------------------------------------------------
# Processing
# ---------------------------------------------------------------------------------------------
@dataclass
class ProcessedData:
    """Per-table configs and CSR lookups of the kept batch, plus the per-table reuse counts."""

    tables: list[TableConfig]
    indices: list[torch.Tensor]     # int32, one per table
    offsets: list[torch.Tensor]     # int32, batch_size + 1 entries from 0
    batch_size: int
    rows_per_bin: np.ndarray        # [T, 17] int64
    lookups_per_bin: np.ndarray     # [T, 17] int64
    source: str = ""

    @property
    def num_tables(self) -> int:
        return len(self.tables)

    @property
    def total_lookups(self) -> int:
        return int(sum(t.numel() for t in self.indices))

    @property
    def mean_pooling_factor(self) -> float:
        return float(np.mean([t.pooling_factor for t in self.tables])) if self.tables else 0.0

    def reuse_histograms(self) -> tuple[np.ndarray, np.ndarray]:
        """``(by_lookups, by_rows)``: see :func:`aggregate_reuse`."""
        return aggregate_reuse(self.rows_per_bin, self.lookups_per_bin)


def draw_dims(num_tables: int, dims: Sequence[int], seed: int = 0) -> list[int]:
    """One dim per table, drawn uniformly from ``dims``, reproducibly from ``seed``."""
    dims = [int(d) for d in dims]
    if not dims or min(dims) < 1:
        raise ShardError(f"dims must be positive integers, got {dims}")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0xD175]))
    return [dims[k] for k in rng.integers(0, len(dims), size=num_tables)]


def process_raw(raw: RawDLRM, batch_size: int | None = None, dim: int = DEFAULT_DIM,
                dims: Sequence[int] | None = None, seed: int = 0, progress: bool = True) -> ProcessedData:
    """Turn raw data into table configs and per-table lookups, table by table.

    ``batch_size`` keeps the first N samples (default: all of them). A table's ``row`` is its
    largest index + 1 over *all* samples in the file (1 for a table without lookups); the pooling
    factor and the reuse bins describe the kept samples. ``dims`` (one drawn per table with
    ``seed``) overrides the fixed ``dim``.
    """
    from tqdm import tqdm

    T, B = raw.num_tables, raw.batch_size
    n = B if batch_size is None else int(batch_size)
    if n < 1:
        raise ShardError(f"batch size must be positive, got {n}")
    if n > B:
        raise ShardError(f"--batch-size {n} exceeds the {B} samples per table in {raw.source}")
    if dims is not None:
        table_dims = draw_dims(T, dims, seed)
    else:
        if int(dim) < 1:
            raise ShardError(f"dim must be positive, got {dim}")
        table_dims = [int(dim)] * T

    # numpy views (no copies; memory-mapped tensors stay mapped): numpy's per-call cost is lower
    # than torch's many small multi-threaded reductions
    indices, offsets, lengths = raw.indices.numpy(), raw.offsets.numpy(), raw.lengths.numpy()
    tables, out_idx, out_off = [], [], []
    rows_per_bin = np.zeros((T, NUM_BINS), dtype=np.int64)
    lookups_per_bin = np.zeros((T, NUM_BINS), dtype=np.int64)
    for t in tqdm(range(T), desc="tables", unit="table", disable=not progress, leave=False):
        off = offsets[t * B: (t + 1) * B + 1].astype(np.int64, copy=False)
        lens = np.diff(off)
        if not np.array_equal(lens, lengths[t]):
            bad = int(np.flatnonzero(lens != lengths[t])[0])
            raise ShardError(f"{raw.source}: offsets and lengths disagree for table {t}, sample {bad}")
        start, end, kept_end = int(off[0]), int(off[-1]), int(off[n])
        every = indices[start:end]
        if every.size:
            lo, hi = int(every.min()), int(every.max())
            if lo < 0:
                raise ShardError(f"{raw.source}: table {t} has a negative index ({lo})")
            if hi > INT32_MAX:
                raise ShardError(f"{raw.source}: table {t} has index {hi}, beyond the int32 range stored")
            row = hi + 1
        else:
            row = 1
        kept = indices[start:kept_end]
        if kept.size > INT32_MAX:
            raise ShardError(f"{raw.source}: table {t} has {kept.size} lookups in the kept batch, "
                             "too many for int32 offsets: use a smaller --batch-size")
        rpb, lpb = reuse_counts(kept, row)
        rows_per_bin[t], lookups_per_bin[t] = rpb, lpb
        out_idx.append(torch.from_numpy(kept.astype(np.int32)))
        out_off.append(torch.from_numpy((off[: n + 1] - start).astype(np.int32)))
        kept_lens = lens[:n]
        cv = float(kept_lens.std() / kept_lens.mean()) if n and kept_lens.mean() > 0 else 0.0
        tables.append(TableConfig(index=t, row=row, dim=table_dims[t], pooling_factor=float(kept.size) / n,
                                  bins=reuse_bins(rpb), length_cv=round(cv, 6)))
    return ProcessedData(tables=tables, indices=out_idx, offsets=out_off, batch_size=n,
                         rows_per_bin=rows_per_bin, lookups_per_bin=lookups_per_bin, source=raw.source)


def write_dataset(out_dir: str | os.PathLike, data: ProcessedData) -> None:
    """Write ``table_configs.json`` and ``data.pt`` (each file atomically)."""
    save_dataset(out_dir, data.tables, data.indices, data.offsets, data.batch_size)


# ---------------------------------------------------------------------------------------------
# Synthetic data
# ---------------------------------------------------------------------------------------------
# Shape of the synthetic table population (see synthetic_table_specs for how each is used).
#
# CALIBRATION. rows_lo/rows_hi, empty, pool_sigma and pool_max were chosen by hand for realistic
# spreads (10 .. 10^7 rows; 4% empty tables; pooling median ~5, p99 ~170, ~20 tables > 100);
# pool_per_decade (larger tables get more lookups) was fitted but sits at the bound 0.6 that we
# imposed. The exponent / head parameters were fitted with
# `python tools/check_synthetic.py --fit --seeds 0,1,2,3,4,5`: it computes the *expected* aggregate
# reuse histograms at 856 tables x batch 65536 in closed form (a row of expected count lam is looked
# up Poisson(lam) times; the row popularities of each table are integrated over log-spaced rank
# buckets) and minimises, by gradient descent, the deviation from both published histograms (by
# lookups and by distinct rows), jointly over the populations of seeds 0..5. The values below are
# that fit rounded to 3 decimals. Expected max |deviation| by lookups: 0.008 at seed 0, <= 0.02 at
# seeds 0..9; measured on generated data with `python tools/check_synthetic.py --batch-size 65536`.
# Reading them: tables under ~10^2.3 rows are uniform (exponent clipped at 0); larger ones send most
# lookups to a power-law head (exponent ~0.5..2, hotter for the largest tables and for tables with
# few lookups per sample) and the rest uniformly over all rows.
SYNTHETIC_PARAMS: dict = {
    "rows_lo": 1.0, "rows_hi": 7.0,
    "empty": 0.04,
    "pool_sigma": 1.0, "pool_per_decade": 0.6, "pool_max": 300.0,
    "knots": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0],
    "exp_knots": [-3.372, -1.608, 0.155, 1.84, 0.472, 1.115, 2.002],
    "exp_per_log_pool": -0.273, "exp_spread": 0.0,
    "head_knots": [18.799, 12.923, 6.96, 0.829, -1.626, 1.193, -1.459],
    "head_per_log_pool": 2.323, "head_spread": 0.594,
    "head_offset": 19.339,
    "disp_lo": 0.5, "disp_hi": 20.0,
}


@dataclass(frozen=True)
class SyntheticTable:
    """How one synthetic table draws its lookups."""

    row: int              # hash size
    pooling_factor: float  # expected lookups per sample
    exponent: float       # power-law exponent of the row popularity in the head
    head_offset: float    # Zipf-Mandelbrot shift q: popularity of rank k ~ (k + q) ** -exponent
    head: float           # fraction of the lookups drawn from the power law; the rest is uniform
    dispersion: float     # negative-binomial shape of the per-sample lengths (large = Poisson)


_SALT_SPECS, _SALT_TABLE = 0x5EC5, 0x7AB1


def _stratified(rng: np.random.Generator, n: int) -> np.ndarray:
    """n uniforms in [0, 1), one in each stratum [k/n, (k+1)/n), in random order: even a small
    number of tables covers the whole range of each distribution."""
    return (rng.permutation(n) + rng.random(n)) / n


def _ndtri(u: np.ndarray) -> np.ndarray:
    return torch.special.ndtri(torch.as_tensor(u, dtype=torch.float64)).numpy()


def _spec_draws(num_tables: int, seed: int, p: dict) -> dict:
    """The random part of the table population: stratified quantiles, independent of the
    calibrated shape parameters except the hash-size range and the empty fraction."""
    T = int(num_tables)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), _SALT_SPECS]))
    u_row, u_pool, u_exp, u_head, u_disp = (_stratified(rng, T) for _ in range(5))
    decades = p["rows_lo"] + (p["rows_hi"] - p["rows_lo"]) * u_row
    empty = u_pool < p["empty"]
    z = _ndtri(np.clip((u_pool - p["empty"]) / (1.0 - p["empty"]), 1e-9, 1 - 1e-9))
    fixed = np.zeros(T, dtype=bool)
    if T >= 100:  # the known table of the main file replaces the one drawn nearest its size
        j = int(np.argmin(np.abs(decades - math.log10(KNOWN_TABLE_ROWS)) + 1e3 * empty))
        decades[j] = math.log10(KNOWN_TABLE_ROWS)
        fixed[j] = True
    rows = np.maximum(np.rint(10.0 ** decades), 1).astype(np.int64)
    rows[fixed] = KNOWN_TABLE_ROWS
    return {"decades": decades, "rows": rows, "z": z, "empty": empty, "fixed": fixed,
            "fixed_pool": np.where(fixed, KNOWN_TABLE_POOLING, 0.0),
            "u_exp": u_exp, "u_head": u_head, "u_disp": u_disp}


def _pooling(draws: dict, p: dict) -> np.ndarray:
    T = len(draws["z"])
    pool = np.exp(p["pool_sigma"] * draws["z"] + p["pool_per_decade"] * (draws["decades"] - 4.0))
    pool[draws["empty"]] = 0.0
    fixed = draws["fixed"]
    target = PUBLISHED_MEAN_POOLING * T - draws["fixed_pool"].sum()
    for _ in range(4):  # scale to the published mean, cap, repeat (the cap moves little mass)
        free_sum = pool[~fixed].sum()
        if free_sum > 0 and target > 0:
            pool[~fixed] *= target / free_sum
        pool[~fixed] = np.minimum(pool[~fixed], p["pool_max"])
    pool[fixed] = draws["fixed_pool"][fixed]
    return pool


def synthetic_table_specs(num_tables: int = DEFAULT_SYNTHETIC_TABLES, seed: int = 0,
                          params: dict | None = None) -> list[SyntheticTable]:
    """Draw the synthetic tables (reproducible from ``seed``; independent of the batch size).

    Each distribution is sampled at stratified quantiles, so a few tables cover its range.

    - hash size: log-uniform, 10 ** rows_lo .. 10 ** rows_hi rows;
    - pooling factor: a fraction ``empty`` of the tables has none; the others are log-normal with
      log-spread ``pool_sigma`` and a median growing by ``pool_per_decade`` (natural log units) per
      decade of rows, scaled so that the mean over all tables is 15.8, capped at ``pool_max``.
      With at least 100 tables, the table drawn nearest 6,618,839 rows becomes the one known table
      of the main file (that size, 194 lookups per sample);
    - lookups: a fraction ``head`` of them follows a power law with ``exponent`` (and Zipf-Mandelbrot
      shift ``head_offset``), the rest is uniform over the rows; both ``exponent`` and ``logit(head)``
      are piecewise linear in d = log10(row) (values ``*_knots`` at ``knots``), plus
      ``*_per_log_pool * (ln(pool) - 2)`` and a uniform jitter of +-``*_spread``;
    - per-sample lengths: negative binomial, shape log-uniform in [disp_lo, disp_hi].
    """
    p = dict(SYNTHETIC_PARAMS)
    if params:
        p.update(params)
    T = int(num_tables)
    if T < 1:
        raise ShardError(f"number of tables must be positive, got {T}")
    draws = _spec_draws(T, seed, p)
    pool = _pooling(draws, p)
    d = draws["decades"]
    log_pool = np.log(np.maximum(pool, 1e-3)) - 2.0
    expo = (np.interp(d, p["knots"], p["exp_knots"]) + p["exp_per_log_pool"] * log_pool
            + p["exp_spread"] * (2.0 * draws["u_exp"] - 1.0))
    expo = np.clip(expo, 0.0, 3.0)
    head_logit = (np.interp(d, p["knots"], p["head_knots"]) + p["head_per_log_pool"] * log_pool
                  + p["head_spread"] * (2.0 * draws["u_head"] - 1.0))
    head = 1.0 / (1.0 + np.exp(-head_logit))
    ld = np.log(p["disp_lo"]) + (np.log(p["disp_hi"]) - np.log(p["disp_lo"])) * draws["u_disp"]
    return [SyntheticTable(row=int(draws["rows"][t]), pooling_factor=float(pool[t]),
                           exponent=float(expo[t]), head_offset=float(p["head_offset"]),
                           head=float(head[t]), dispersion=float(np.exp(ld[t])))
            for t in range(T)]


def _table_rng(seed: int, t: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed), _SALT_TABLE, int(t)]))


def _draw_lengths(rng: np.random.Generator, spec: SyntheticTable, batch_size: int) -> np.ndarray:
    if spec.pooling_factor <= 0:
        return np.zeros(batch_size, dtype=np.int64)
    k = spec.dispersion
    lam = rng.gamma(k, spec.pooling_factor / k, size=batch_size)
    return rng.poisson(lam).astype(np.int64, copy=False)


def _affine_permutation(rng: np.random.Generator, row: int) -> tuple[int, int]:
    """``(a, b)`` with gcd(a, row) = 1: ``(a * x + b) % row`` permutes 0..row-1 without memory."""
    if row <= 1:
        return 1, 0
    while True:
        a = int(rng.integers(1, row))
        if math.gcd(a, row) == 1:
            return a, int(rng.integers(0, row))


def _fill_indices(out: np.ndarray, rng: np.random.Generator, spec: SyntheticTable,
                  chunk: int = 1 << 21) -> None:
    """Fill ``out`` with rows of ``spec``: a fraction ``head`` of the lookups follows a power law,
    the rest is uniform over all rows; an affine permutation then scatters the hot rows.

    A power-law rank is drawn from the continuous density ~ x ** -s on [1 + q, row + 1 + q) by its
    inverse CDF (0-based rank: floor(x - q) - 1); a uniform rank is floor(v * row)."""
    R, s, q, h = spec.row, spec.exponent, spec.head_offset, spec.head
    mult, add = _affine_permutation(rng, R)
    lo, hi = 1.0 + q, R + 1.0 + q
    a = 1.0 - s
    log_form = abs(a) < 1e-6
    if log_form:
        scale = math.log(hi / lo)
    else:
        base, span, inv = lo ** a, hi ** a - lo ** a, 1.0 / a

    def power_law(u: np.ndarray) -> None:  # in place: u uniform in [0, 1] -> 0-based rank (float)
        if log_form:
            u *= scale
            np.exp(u, out=u)
            u *= lo
        else:
            u *= span
            u += base
            np.power(u, inv, out=u)
        u -= q + 1.0

    buf = np.empty(min(chunk, max(out.size, 1)), dtype=np.float64)
    for pos in range(0, out.size, chunk):
        m = min(chunk, out.size - pos)
        u = buf[:m]
        rng.random(out=u)
        if h <= 0.0:
            u *= R
        else:
            cold = None
            if h < 1.0:  # u < h: power law on u / h; u >= h: uniform on (u - h) / (1 - h)
                cold = u >= h
                tail = u[cold]
                tail -= h
                tail *= R / (1.0 - h)
                u *= 1.0 / h
                np.minimum(u, 1.0, out=u)
            power_law(u)
            if cold is not None:
                u[cold] = tail
        np.clip(u, 0.0, R - 1.0, out=u)
        o = out[pos:pos + m]
        o[...] = u  # truncation: the floor of a non-negative rank
        if R > 1:
            o *= mult
            o += add
            np.remainder(o, R, out=o)


def generate_synthetic_raw(num_tables: int = DEFAULT_SYNTHETIC_TABLES,
                           batch_size: int = DEFAULT_SYNTHETIC_BATCH, seed: int = 0,
                           progress: bool = True, params: dict | None = None) -> RawDLRM:
    """A synthetic raw dataset in the dlrm_datasets format (see :func:`synthetic_table_specs`).

    All indices go into one preallocated int64 array, filled table by table; each table has its
    own random stream, so the result depends only on ``(num_tables, batch_size, seed)``."""
    from tqdm import tqdm

    T, B = int(num_tables), int(batch_size)
    if B < 1:
        raise ShardError(f"batch size must be positive, got {B}")
    specs = synthetic_table_specs(T, seed, params)
    rngs = [_table_rng(seed, t) for t in range(T)]
    lengths = np.empty((T, B), dtype=np.int64)
    for t, spec in enumerate(specs):
        lengths[t] = _draw_lengths(rngs[t], spec, B)
    offsets = np.zeros(T * B + 1, dtype=np.int64)
    np.cumsum(lengths.reshape(-1), out=offsets[1:])
    indices = np.empty(int(offsets[-1]), dtype=np.int64)
    for t in tqdm(range(T), desc="synthetic tables", unit="table", disable=not progress, leave=False):
        _fill_indices(indices[offsets[t * B]: offsets[(t + 1) * B]], rngs[t], specs[t])
    return RawDLRM(indices=torch.from_numpy(indices), offsets=torch.from_numpy(offsets),
                   lengths=torch.from_numpy(lengths), source="synthetic data")
