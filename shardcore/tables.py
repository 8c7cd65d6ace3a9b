"""Embedding-table configurations, their memory footprint and the 21 learned-model features.

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
from typing import Iterable, Sequence

import numpy as np

NUM_BINS = 17
BIN_NAMES = tuple(f"bin_{k}" for k in range(NUM_BINS))
FEATURE_NAMES = ("dim", "row", "pooling_factor", "size") + BIN_NAMES
NUM_FEATURES = len(FEATURE_NAMES)  # 21
# Features whose scale depends on the task's tables; the reuse bins are fractions in [0, 1] already.
SCALED_FEATURES = ("dim", "row", "pooling_factor", "size")

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


def heavier(t: TableConfig, doublings: int) -> TableConfig:
    """``t`` with the same rows, each looked up ``2^doublings`` times as often: its pooling factor scaled and
    its reuse bins (distinct rows by lookups, bins of doubling ranges) shifted up by ``doublings`` bins, the
    last bin keeping what passes it. A table only an emulated oracle can price (a measured one would look
    up the dataset's real ids): the learned methods' augmentation of their training tables."""
    b = list(t.bins)
    shifted = [0.0] * doublings + b[:len(b) - doublings]
    shifted[-1] += sum(b[len(b) - doublings:])
    return dataclasses.replace(t, pooling_factor=t.pooling_factor * 2 ** doublings, bins=tuple(shifted))


def augment_tasks(task_tables: list, share: float, seed: int, emulated: bool) -> list:
    """A learned method's ``--pf-augment``: in every training task, each table with probability ``share`` replaced by
    :func:`heavier` by 1 or 2 doublings (drawn once from ``seed``, the same for every
    iteration and a resumed run). Refused on a measured oracle, which would look up the dataset's real
    ids of the table, not the heavier ones."""
    if share <= 0:
        return task_tables
    if not emulated:
        from shardcore.errors import ShardError

        raise ShardError("--pf-augment needs an emulated oracle: a measured one looks up the dataset's real ids")
    rng = np.random.default_rng([int(seed), 0x5046])
    return [[heavier(t, int(rng.integers(1, 3))) if rng.random() < share else t for t in ts] for ts in task_tables]


def raw_features(tables: Sequence[TableConfig]) -> np.ndarray:
    """The 21 unstandardised features per table, shape ``[len(tables), 21]`` (float64)."""
    out = np.zeros((len(tables), NUM_FEATURES), dtype=np.float64)
    for i, t in enumerate(tables):
        out[i, 0] = t.dim
        out[i, 1] = t.row
        out[i, 2] = t.pooling_factor
        out[i, 3] = t.size
        out[i, 4:] = t.bins
    return out


def length_cv_flag(group: str = ""):
    """A learned model's ``length_cv_feature`` config field: the bag-length CV as a 22nd table feature,
    on by default; ``--no-length-cv-feature`` gives the papers' 21."""
    from shardcore.config import param

    return param(True, "leave the tables' bag-length CV (table_configs.json length_cv) out of the table features: "
                 "the paper's 21 (default: a 22nd feature, an unknown CV counting as the training tables' median; "
                 "stored in the checkpoint)", flags=("--no-length-cv-feature",), action="store_false", group=group)


LOG_FEATURES = ("row", "size")   # the features a scaler puts on a log10(1 + x) scale by default


@dataclass
class Standardiser:
    """Per-feature standardisation ``(x - mean) / std``, fitted once on a model's training data and
    saved with the model: the one scaler of the cost models (tables' features: :class:`FeatureScaler`;
    other feature vectors, e.g. a device's exchange features, this class itself)."""

    mean: list[float]
    std: list[float]

    def __post_init__(self):
        from shardcore.errors import ShardError

        self.mean = [float(v) for v in self.mean]
        self.std = [float(v) for v in self.std]
        if len(self.mean) != len(self.std):
            raise ShardError(f"feature scaler: {len(self.mean)} means but {len(self.std)} standard deviations")
        if not all(math.isfinite(v) for v in self.mean) or not all(math.isfinite(v) and v > 0 for v in self.std):
            raise ShardError("feature scaler: means must be finite and standard deviations finite and positive "
                             f"(got mean {self.mean}, std {self.std})")
        self._mean = np.asarray(self.mean, dtype=np.float64)
        self._std = np.asarray(self.std, dtype=np.float64)

    @staticmethod
    def statistics(x: np.ndarray, min_std: float = 1e-12) -> tuple[np.ndarray, np.ndarray]:
        """Column means and standard deviations of ``x [N, F]``; a deviation below ``min_std`` (a
        constant feature) becomes 1."""
        std = x.std(axis=0)
        std[std < min_std] = 1.0
        return x.mean(axis=0), std

    @classmethod
    def fit_array(cls, x: np.ndarray, min_std: float = 1e-12) -> "Standardiser":
        return cls(*cls.statistics(np.asarray(x, dtype=np.float64), min_std))

    def apply(self, x: np.ndarray) -> np.ndarray:
        """``(x - mean) / std`` over the last axis (float64)."""
        return (x - self._mean) / self._std


@dataclass
class FeatureScaler(Standardiser):
    """Standardisation of the scale-dependent features (dim, row, pooling_factor, size; the CV if asked).

    Statistics are fitted once on a model's training tables and saved with the model
    (:meth:`to_state` gives plain values), then re-applied unchanged to any task. The
    ``log_features`` are first put on a log10(1 + x) scale: by default ``row`` and ``size``, which
    span many orders of magnitude; a cost model may put all four there (a shard's compute is
    roughly multiplicative in lookups x dim, which an MLP learns more easily, to a uniform relative
    accuracy, on log inputs).
    """

    log_features: tuple[str, ...] = LOG_FEATURES
    cv_default: float | None = None      # with the bag-length CV feature: an unknown table's CV

    def __post_init__(self):
        super().__post_init__()
        self.log_features = tuple(self.log_features)

    @staticmethod
    def _log(raw: np.ndarray, log_features: Sequence[str]) -> np.ndarray:
        x = np.array(raw, dtype=np.float64, copy=True)
        idx = [FEATURE_NAMES.index(n) for n in log_features]
        x[:, idx] = np.log10(1.0 + np.maximum(x[:, idx], 0.0))
        return x

    @classmethod
    def fit(cls, tables: Sequence[TableConfig], log_features: Sequence[str] = LOG_FEATURES,
            length_cv: bool = False) -> "FeatureScaler":
        """Statistics of ``tables``; ``length_cv`` adds the bag-length CV as a 22nd feature (a table
        without one gets the median of those that have one) where at least one table has one."""
        from shardcore.errors import ShardError

        if not tables:
            raise ShardError("cannot fit feature statistics on zero tables")
        x = cls._log(raw_features(tables), log_features)[:, [FEATURE_NAMES.index(n) for n in SCALED_FEATURES]]
        cvs = [t.length_cv for t in tables if t.length_cv is not None]
        default = float(np.median(cvs)) if length_cv and cvs else None   # no CV seen: a feature never learnt
        mean, std = cls.statistics(x if default is None else np.c_[x, cls._cvs(tables, default)], 1e-12)
        return cls(mean=list(mean), std=list(std), log_features=tuple(log_features), cv_default=default)

    @staticmethod
    def _cvs(tables: Sequence[TableConfig], default: float) -> np.ndarray:
        return np.array([default if t.length_cv is None else t.length_cv for t in tables], dtype=np.float64)

    @property
    def num_features(self) -> int:
        return NUM_FEATURES + (self.cv_default is not None)

    def transform(self, tables: Sequence[TableConfig], dtype=np.float32) -> np.ndarray:
        """Standardised features, shape ``[len(tables), num_features]`` (float32 unless ``dtype`` says otherwise)."""
        x = self._log(raw_features(tables), self.log_features)
        idx = [FEATURE_NAMES.index(n) for n in SCALED_FEATURES]
        if self.cv_default is None:
            x[:, idx] = self.apply(x[:, idx])
            return x.astype(dtype, copy=False)
        z = self.apply(np.c_[x[:, idx], self._cvs(tables, self.cv_default)])
        x[:, idx] = z[:, :-1]
        return np.c_[x, z[:, -1:]].astype(dtype, copy=False)

    def to_state(self) -> dict:
        """``features``, ``mean``, ``std``, and ``log`` (the log-scale features) where they are not
        the default: the form checkpoints have always stored."""
        state = {"features": list(SCALED_FEATURES), "mean": list(self.mean), "std": list(self.std)}
        if self.log_features != LOG_FEATURES:
            state["log"] = list(self.log_features)
        if self.cv_default is not None:
            state.update(features=state["features"] + ["length_cv"], cv_default=float(self.cv_default))
        return state

    @classmethod
    def from_state(cls, state: dict, log_features: Sequence[str] = LOG_FEATURES) -> "FeatureScaler":
        """The scaler a checkpoint stored, which must put ``log_features`` on a log scale (the model
        loading it was trained so)."""
        from shardcore.errors import ShardError

        saved_log = tuple(state.get("log", LOG_FEATURES))
        cv = state.get("cv_default")
        if list(state.get("features", [])) != list(SCALED_FEATURES) + ["length_cv"] * (cv is not None) \
                or saved_log != tuple(log_features):
            raise ShardError(f"feature statistics were saved for other features: {state.get('features')} "
                             f"(log scale: {list(saved_log)}), expected {list(SCALED_FEATURES)} "
                             f"(log scale: {list(log_features)})")
        return cls(mean=state["mean"], std=state["std"], log_features=saved_log,
                   cv_default=None if cv is None else float(cv))


def total_memory_gb(tables: Iterable[TableConfig], precision: str = "fp16") -> float:
    return sum(t.memory_gb(precision) for t in tables)
