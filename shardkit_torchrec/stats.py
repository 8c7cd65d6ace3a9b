"""The tables of a TorchRec model as shardkit sees them: rows, dim, pooling factor, reuse and bag-length
dispersion, read from what TorchRec users already state.

Per table (one ``EmbeddingBagConfig`` of an ``EmbeddingBagCollection``):

* **rows, dim**: the config's ``num_embeddings`` and ``embedding_dim``;
* **pooling factor** (mean lookups per sample): from the sample batches when they hold the table's
  feature (values / samples over every batch), else ``ParameterConstraints.pooling_factors`` (the
  table's one feature), else TorchRec's own default (``POOLING_FACTOR``, 1.0: what TorchRec's planner
  assumes then);
* **reuse histogram** (the 17 ``bin_*`` of :class:`~shardcore.tables.TableConfig`: of the distinct rows
  looked up in a batch, the fraction looked up (0,1], (1,2], (2,4], ... times): from the sample's ids,
  the batches taken together up to the global batch the plan is for (``shardcore.data.dlrm.reuse_counts``,
  the counting the datasets use); without samples all zero, which the emulator reads as "every lookup a
  distinct row" (``min(lookups, rows)`` rows touched: the most DRAM traffic, never an under-estimate);
* **bag-length CV** (the coefficient of variation of the per-sample lookup counts, which the emulated
  H200's forward kernel is sensitive to): from the sample's lengths, else ``None`` (the emulator's
  default, the fitted population's median).

The global batch is TorchRec's per-rank ``batch_size`` times the world size: a table-wise table's device
looks up every rank's samples, which is the batch shardkit's cost models are stated for.

A table that serves several features (its pooled output is ``dim`` wide per feature) is refused:
shardkit's data model has one feature per table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from shardcore.errors import ShardError
from shardcore.tables import DIM_MULTIPLE, NUM_BINS, TableConfig

DEFAULT_POOLING_FACTOR = 1.0     # TorchRec's planner constant POOLING_FACTOR (checked in the tests)
PRECISIONS = {"FP16": "fp16", "FP32": "fp32"}


@dataclass(frozen=True)
class TableStats:
    """One TorchRec table for shardkit: its ``path`` (the collection's module path), ``name``, the
    :class:`TableConfig` (``index`` = its position in the planned task), the bag-length CV (``None``:
    the emulator's default) and where the pooling factor came from (``samples``, ``constraints`` or
    ``default``)."""

    path: str
    name: str
    feature: str
    table: TableConfig
    length_cv: float | None
    source: str


def collections(module) -> list[tuple[str, Any]]:
    """``(module path, EmbeddingBagCollection)`` of every collection in ``module`` (itself included)."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    return [(path, m) for path, m in module.named_modules() if isinstance(m, EmbeddingBagCollection)]


def precision_of(configs: Iterable[Any]) -> str:
    """``fp16`` or ``fp32``: the weights' type of every table (one for all, as shardkit's topology has)."""
    kinds = {getattr(c.data_type, "name", str(c.data_type)) for c in configs}
    if not kinds:
        return "fp32"
    bad = sorted(k for k in kinds if k not in PRECISIONS)
    if bad:
        raise ShardError(f"shardkit plans fp16 or fp32 embedding weights; a table has data_type {bad[0]}")
    if len(kinds) > 1:
        raise ShardError(f"shardkit plans one weights precision for all tables; the model mixes {', '.join(sorted(kinds))}")
    return PRECISIONS[kinds.pop()]


def _sample_features(samples: Sequence[Any] | None, limit: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{feature: (lengths, values)}`` over the sample batches, at most ``limit`` samples per feature."""
    out: dict[str, tuple[list, list, int]] = {}
    for kjt in samples or ():
        for key, jt in kjt.to_dict().items():
            lengths = jt.lengths().detach().cpu().numpy().astype(np.int64)
            values = jt.values().detach().cpu().numpy().astype(np.int64)
            ls, vs, n = out.setdefault(key, ([], [], 0))
            room = limit - n
            if room <= 0:
                continue
            if len(lengths) > room:
                values = values[: int(lengths[:room].sum())]
                lengths = lengths[:room]
            ls.append(lengths)
            vs.append(values)
            out[key] = (ls, vs, n + len(lengths))
    return {k: (np.concatenate(ls) if ls else np.zeros(0, np.int64), np.concatenate(vs) if vs else np.zeros(0, np.int64))
            for k, (ls, vs, _n) in out.items()}


def table_stats(module, constraints: Mapping[str, Any] | None = None, samples: Sequence[Any] | None = None,
                global_batch: int | None = None) -> list[TableStats]:
    """Every table of ``module``'s collections, in module order (see the module notes).

    ``constraints``: TorchRec's ``{table name: ParameterConstraints}``; ``samples``: input batches
    (``KeyedJaggedTensor`` s) keyed by feature name; ``global_batch``: the most samples per feature the
    reuse statistics take (default: all)."""
    from shardcore.data.dlrm import reuse_bins, reuse_counts

    found = collections(module)
    if not found:
        raise ShardError("the module holds no EmbeddingBagCollection to plan")
    feats = _sample_features(samples, int(global_batch) if global_batch else 1 << 62)
    out: list[TableStats] = []
    seen: dict[str, str] = {}
    for path, ebc in found:
        for cfg in ebc.embedding_bag_configs():
            where = f"{path + '.' if path else ''}{cfg.name}"
            if cfg.name in seen:
                raise ShardError(f"table name {cfg.name!r} appears in two collections ({seen[cfg.name]!r} and "
                                 f"{path!r}); TorchRec's constraints are keyed by name, so names must be unique")
            seen[cfg.name] = path
            if len(cfg.feature_names) != 1:
                raise ShardError(f"table {where} serves {len(cfg.feature_names)} features "
                                 f"({', '.join(cfg.feature_names)}); shardkit's cost model has one feature per "
                                 "table: give each feature its own table")
            if cfg.embedding_dim % DIM_MULTIPLE:
                raise ShardError(f"table {where}: dim {cfg.embedding_dim} is not a multiple of {DIM_MULTIPLE}")
            feature = cfg.feature_names[0]
            cv = None
            bins = (0.0,) * NUM_BINS
            con = (constraints or {}).get(cfg.name)
            if feature in feats and len(feats[feature][0]):
                lengths, values = feats[feature]
                pf = float(lengths.sum()) / len(lengths)
                mean = float(lengths.mean())
                cv = float(lengths.std() / mean) if mean > 0 else 0.0
                if len(values):
                    if values.min() < 0 or values.max() >= cfg.num_embeddings:
                        raise ShardError(f"table {where}: the sample's ids of feature {feature!r} fall outside "
                                         f"[0, {cfg.num_embeddings})")
                    bins = reuse_bins(reuse_counts(values, cfg.num_embeddings)[0])
                source = "samples"
            elif con is not None and getattr(con, "pooling_factors", None):
                if len(con.pooling_factors) != 1:
                    raise ShardError(f"table {where}: {len(con.pooling_factors)} pooling factors in its "
                                     "ParameterConstraints for one feature")
                pf = float(con.pooling_factors[0])
                source = "constraints"
            else:
                pf = DEFAULT_POOLING_FACTOR
                source = "default"
            if not pf >= 0:
                raise ShardError(f"table {where}: pooling factor must be >= 0, got {pf}")
            t = TableConfig(len(out), int(cfg.num_embeddings), int(cfg.embedding_dim), pf, tuple(bins))
            out.append(TableStats(path, cfg.name, feature, t, cv, source))
    return out
