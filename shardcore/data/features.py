"""What a learned model reads of a table: its 21 features (22 with the bag-length CV), their
standardisation (fitted once on a model's training tables and saved with it), the flag that leaves the
CV out, and the heavier variants a learned method's training may add (augmentation). Only the learned
methods use these; the planners and oracles of the core never do.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from shardcore.tables import BIN_NAMES, TableConfig

FEATURE_NAMES = ("dim", "row", "pooling_factor", "size") + BIN_NAMES
NUM_FEATURES = len(FEATURE_NAMES)  # 21
# Features whose scale depends on the task's tables; the reuse bins are fractions in [0, 1] already.
SCALED_FEATURES = ("dim", "row", "pooling_factor", "size")


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
