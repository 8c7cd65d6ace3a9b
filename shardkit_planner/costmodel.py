"""The planner's cost model: a whole plan's per-device costs (ms), for every sharding type.

A device's cost is what the oracles report (:mod:`shardcore.oracles.factory`): forward + backward compute
of its kernels, plus its forward and backward exchanges.

**Compute.** One shard's ``(fw_ms, bw_ms)`` from the features of :mod:`shardcore.oracles.emulated.emulator` (lookups,
distinct rows, estimated DRAM traffic, bag-length dispersion, outputs, table count, the shard's
widest table and its row count...), linear with non-negative weights. On a CPU the features are the
emulator's CPU family (:data:`shardcore.oracles.emulated.emulator.CPU_SPEC`: every per-lookup term times the row's dim,
as FBGEMM's CPU kernels read whole rows, so a column piece costs its share of the dim there; and the
backward's sort passes and the locality of its row updates: distinct rows x hats of the bytes between
two consecutive updated rows). A piece is a table with the
rows, dim and pooling factor it holds (:meth:`shardcore.plan.Sharding.pieces`: a row-wise block the
lookups in proportion to its rows), so the same features cover every type. A device runs two
kernels (:func:`shardcore.plan.device_kernels`): its model-parallel pieces fused over the batch and
its data-parallel replicas fused over its batch slice, each predicted at its batch and summed
(:func:`shardcore.oracles.emulated.emulator.predict_devices`, the emulated oracle's own function). The weights come
from

* ``emulated:h200``: the emulator itself (the oracle's own compute model: exact by construction); a card
  file's landscape (``emulated:<card>``, :mod:`shardcore.oracles.emulated.card`) its fit, on the card's
  measurements of the hardware it was calibrated on, with the card's exchange figures;
* ``measured``: a fit on this machine's shard measurements (the measurement cache's
  :meth:`~shardcore.oracles.cache.CostCache.shard_entries` for the dataset, batch and precision),
  made by :func:`fit_cost_model` (``tools/fit_shardkit_model.py``) with the emulator's fitting code (the
  feature rows of :func:`~shardcore.oracles.emulated.model.device_features` and its least squares, the
  one fit a calibrated card uses too).

**Communication.** ``latency + max(bytes sent, bytes received) / bandwidth`` per phase, priced by
:meth:`shardcore.oracles.commmodel.CommModel.exchange_ms` (the one place, shared with the emulated oracle)
with the convention every oracle uses: the pooled all-to-all both ways (a data-parallel table sends
no pooled outputs, :func:`~shardcore.oracles.commmodel.pooled_width`), forward the input-id all-to-all of
every model-parallel piece (per device the expected ids it sends and receives, 8 bytes each plus
one length per sample, :func:`~shardcore.oracles.commmodel.id_width`), backward the data-parallel gradient
all-reduce (``2 (n-1)/n x rows x dim x bytes``, :func:`~shardcore.oracles.commmodel.allreduce_bytes`), one
latency each. The constants are the emulated oracle's analytic ones (so on that landscape the model
is the oracle exactly), or on the CPU a fit of the measured exchanges of plans outside the tables to
avoid (the cache's plan measurements, both phases: forward the pooled and id all-to-alls, backward the
pooled one), one latency and bandwidth per device count (gloo's differ: on a 2-core CPU, 0.7–1.3 ms +
bytes / 2.1–3.6 GB/s on 4 devices, 2.8 ms + bytes / 1.35–2.2 GB/s on 8).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from shardcore.oracles.commmodel import (CommModel, allreduce_bytes, fit_exchange_model, id_bytes,
                                         id_width as piece_id_width, pooled_width, remote_bytes)
from shardcore.oracles.emulated.card import read_card
from shardcore.oracles.emulated.measurements import SHIPPED, load_gpu_model
from shardcore.oracles.emulated.model import (CPU_SPEC, DEFAULT_SPEC, PIECE_DEVICE_KINDS, GpuComputeModel,
                                              device_features, fit_params, fit_weights, piece_device_kind,
                                              predict_devices)
from shardcore.errors import ShardError
from shardcore.oracles.setting import EXACT_SGD
from shardcore.planning import is_card_file
from shardcore.io import atomic_open
from shardcore.plan import Plan
from shardcore.tables import TableConfig
from shardcore.types import DeviceCost, device_costs

FORMAT = "shardkit-planner-cost-1"
MEASURED, EMULATED = "measured", "emulated:h200"
DEFAULT_CV = 0.7
ERROR_DRAWS = 64          # draws of the model's error in the search's objective


def length_cvs(data_dir: str | os.PathLike, batch_size: int) -> list[float] | None:
    """Per dataset table the coefficient of variation of its per-sample lookup counts (the first
    ``batch_size`` samples of ``data.pt``); None without lookup data."""
    from shardcore.dataset import load_dataset

    try:
        ds = load_dataset(data_dir)
    except ShardError:
        return None
    if not ds.has_lookups:
        return None
    out = []
    for off in ds.offsets:
        n = min(int(batch_size), off.numel() - 1)
        lengths = np.diff(off[: n + 1].numpy().astype(np.int64))
        mean = float(lengths.mean()) if n > 0 else 0.0
        out.append(float(lengths.std() / mean) if mean > 0 else 0.0)
    return out


@dataclass
class CostModel:
    """Per-device plan costs in ms (see the module notes)."""

    compute: GpuComputeModel
    comm: CommModel
    batch_size: int
    landscape: str = EMULATED          # which landscape the weights and constants describe
    length_cv: list[float] | None = None
    precision: str = "fp16"
    source: str = ""
    # the compute model's own error, as measured / predicted ratios (cross-validated on its shards);
    # with it the search minimises the expected slowest device (error_draws), without it the slowest
    error: np.ndarray | None = field(default=None, repr=False)
    # the compute model's bias on devices holding row-wise blocks or replicas ({kind: factor}, measured
    # on other tasks' devices: shardcore.oracles.emulated.emulator.piece_bias); such a shard's compute
    # is multiplied by its kind's factor
    kind_bias: dict | None = None
    # its error on such devices ({kind: measured / predicted ratios of other tasks' devices of that
    # kind, each divided by its median, as kind_bias carries the bias}): a device holding replicas or
    # row-wise blocks draws from its kind's error in the objective (error_draws), the others from error
    kind_error: dict | None = field(default=None, repr=False)
    # the exchange per device count ({ndevices: CommModel}, fitted on plans of that count; a fitted
    # exchange's latency and bandwidth differ with the count on a CPU's gloo); ``comm`` for other counts
    comm_by_devices: dict | None = None
    _cv_cache: dict = field(default_factory=dict, repr=False)

    def error_draws(self, ndevices: int, draws: int = ERROR_DRAWS, seed: int = 0) -> np.ndarray | None:
        """``[1 + len(PIECE_DEVICE_KINDS), draws, ndevices]`` fixed factors (None without :attr:`error`):
        layer 0 drawn from :attr:`error`, for a device of whole tables and column blocks; layer ``k`` for
        a device of kind ``PIECE_DEVICE_KINDS[k - 1]`` (``piece_device_kind``), drawn from
        :attr:`kind_error` of that kind where it is known, else layer 0 again."""
        if self.error is None or len(self.error) == 0:
            return None
        shape = (draws, int(ndevices))
        base = np.asarray(self.error, dtype=float)[np.random.default_rng(seed).integers(0, len(self.error), size=shape)]
        layers = [base]
        for k, kind in enumerate(PIECE_DEVICE_KINDS):
            pool = (self.kind_error or {}).get(kind)
            if pool is None or len(pool) == 0:
                layers.append(base)
            else:
                pool = np.asarray(pool, dtype=float)
                layers.append(pool[np.random.default_rng(seed + 1 + k).integers(0, len(pool), size=shape)])
        return np.stack(layers)

    @staticmethod
    def device_kind_index(pieces: Sequence[TableConfig]) -> int:
        """The layer of :meth:`error_draws` a device holding ``pieces`` draws from."""
        kind = piece_device_kind([getattr(p, "kind", None) for p in pieces])
        return 0 if kind is None else 1 + PIECE_DEVICE_KINDS.index(kind)

    # -- compute -------------------------------------------------------------------------------
    def _cv(self, t: TableConfig) -> float:
        if self.length_cv is not None and 0 <= t.index < len(self.length_cv):
            return self.length_cv[t.index]
        # remembered by what it depends on (the search asks for it for every piece of every candidate)
        key = (t.index, t.row, t.pooling_factor, id(self.compute))
        cv = self._cv_cache.get(key)
        if cv is None:
            cv = self._cv_cache[key] = self.compute.table_cv(t)
        return cv

    def shard_compute(self, shards: Sequence[Sequence[TableConfig]]) -> np.ndarray:
        """fw + bw compute (ms) of each shard (an empty shard: 0)."""
        shards = [list(s) for s in shards]
        if not shards:
            return np.zeros(0)
        pred = predict_devices(self.compute, shards, self.batch_size, self._cv, precision=self.precision)
        out = pred[:, 0] + pred[:, 1]
        if self.kind_bias:
            for i, s in enumerate(shards):
                kind = piece_device_kind([getattr(p, "kind", None) for p in s])
                out[i] *= self.kind_bias.get(kind, 1.0)
        return out

    # -- communication ---------------------------------------------------------------------------
    def pooled_dim(self, t: TableConfig) -> int:
        """Width a piece adds to its device's pooled outputs (none for a data-parallel replica)."""
        return pooled_width(t)

    def id_width(self, t: TableConfig) -> float:
        """int64 elements per sample a piece adds to its device's input-id all-to-all
        (:func:`~shardcore.oracles.commmodel.id_width`, as every oracle prices it)."""
        return piece_id_width(t)

    def extra_bytes(self, t: TableConfig, ndevices: int) -> float:
        """Bytes of a piece's own backward collective on its device: a data-parallel replica's
        all-reduce (:func:`~shardcore.oracles.commmodel.allreduce_bytes`)."""
        return allreduce_bytes(t, ndevices, self.precision)

    def comm_costs(self, dim_sums, extra=None, ids=None) -> np.ndarray:
        """fw + bw exchange (ms) per device (the last axis: devices; leading axes: candidate plans),
        from the pooled widths, the extra collective's bytes and the input-id widths."""
        fw, bw = self.comm_for(np.shape(dim_sums)[-1]).exchange_ms(dim_sums, self.batch_size, ids, extra)
        return fw + bw

    def comm_for(self, ndevices: int) -> CommModel:
        """The exchange model of plans over ``ndevices`` devices (:attr:`comm_by_devices`, else :attr:`comm`)."""
        return (self.comm_by_devices or {}).get(int(ndevices), self.comm)

    # -- whole plans -----------------------------------------------------------------------------
    def shard_costs(self, shards: Sequence[Sequence[TableConfig]]) -> np.ndarray:
        """Per device total cost (ms) of a plan given as its devices' pieces."""
        n = len(shards)
        comp = self.shard_compute(shards)
        dims = [sum(self.pooled_dim(t) for t in s) for s in shards]
        extra = [sum(self.extra_bytes(t, n) for t in s) for s in shards]
        ids = [sum(self.id_width(t) for t in s) for s in shards]
        return comp + self.comm_costs(dims, extra, ids)

    def device_costs(self, plan: Plan) -> np.ndarray:
        """Per device of ``plan`` its total cost (ms), as an array (the search's form)."""
        return self.shard_costs(plan.device_pieces)

    def plan_cost(self, plan: Plan) -> float:
        return float(self.device_costs(plan).max())

    def estimate(self, plan: Plan) -> list[DeviceCost]:
        """Per device of ``plan`` its modelled cost by part: the stage's answer as every oracle gives it
        (forward and backward compute, each scaled as :meth:`shard_compute` scales their sum; forward and
        backward exchange)."""
        pieces = [list(s) for s in plan.device_pieces]
        n = len(pieces)
        pred = predict_devices(self.compute, pieces, self.batch_size, self._cv, precision=self.precision)
        scale = np.array([self.kind_bias.get(piece_device_kind([getattr(p, "kind", None) for p in s]), 1.0)
                          if self.kind_bias else 1.0 for s in pieces])
        dims = [sum(self.pooled_dim(t) for t in s) for s in pieces]
        extra = [sum(self.extra_bytes(t, n) for t in s) for s in pieces]
        ids = [sum(self.id_width(t) for t in s) for s in pieces]
        fw, bw = self.comm_for(n).exchange_ms(dims, self.batch_size, ids, extra)
        return device_costs(np.stack([pred[:, 0] * scale, np.broadcast_to(fw, (n,)), np.broadcast_to(bw, (n,)),
                                      pred[:, 1] * scale], axis=1))

    # -- files -----------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"format": FORMAT, "landscape": self.landscape, "batch_size": int(self.batch_size),
                "precision": self.precision, "source": self.source, "compute": self.compute.params,
                "comm": self.comm.to_json(), "length_cv": self.length_cv,
                **({"comm_by_devices": {str(n): c.to_json() for n, c in sorted(self.comm_by_devices.items())}}
                   if self.comm_by_devices else {})}

    def save(self, path: str | os.PathLike) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(path) as fh:
            fh.write(json.dumps(self.to_json()) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "CostModel":
        try:
            with open(path, "rb") as fh:
                obj = json.loads(fh.read().decode("utf-8"))
        except FileNotFoundError:
            raise ShardError(f"shardkit cost model not found: {path} (fit one with tools/fit_shardkit_model.py)") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ShardError(f"{path}: not a readable shardkit cost model ({exc})") from None
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise ShardError(f"{path}: not a shardkit cost model (format {obj.get('format') if isinstance(obj, dict) else None!r})")
        def comm(c) -> CommModel:
            return CommModel(float(c["bandwidth_gbps"]), float(c["latency_us"]), str(c.get("link", "")),
                             str(c.get("source", "fitted")))

        try:
            by_n = {int(n): comm(c) for n, c in (obj.get("comm_by_devices") or {}).items()}
            return cls(compute=GpuComputeModel(obj["compute"], SHIPPED), comm=comm(obj["comm"]), comm_by_devices=by_n or None,
                       batch_size=int(obj["batch_size"]), landscape=str(obj["landscape"]),
                       length_cv=obj.get("length_cv"), precision=str(obj.get("precision", "fp16")),
                       source=str(obj.get("source", "")))
        except (KeyError, TypeError, ValueError) as exc:
            raise ShardError(f"{path}: malformed shardkit cost model ({exc})") from None


def emulated_model(data_dir: str | os.PathLike, batch_size: int, comm: CommModel | None = None,
                   card: str = "h200") -> CostModel:
    """The emulated card's own compute model and its exchange: the shipped card's (``h200``) with the analytic
    exchange, or a card file's fit with its exchange figures (``comm`` where it states others), what
    ``--oracle emulated:<card>`` judges plans by. A card file's model prices the precision it measured (a GPU
    card others by the bytes they move: :meth:`shardkit_planner.sharder.ShardkitSharder.for_precision`)."""
    if not is_card_file(card):
        return CostModel(load_gpu_model(card), comm or CommModel(), int(batch_size), landscape=f"emulated:{card}",
                         length_cv=length_cvs(data_dir, batch_size), source=f"emulator ({card})")
    c = read_card(card)
    return CostModel(c.model, c.comm_model(comm), int(batch_size), landscape=f"emulated:{card}",
                     length_cv=length_cvs(data_dir, batch_size), precision=c.precision,
                     source=f"card {card} ({c.hardware}; {c.accuracy_line()})")


def usable_shards(cache, dataset, batch_size: int, *, hardware: str, precision: str = "fp16",
                  optimizer: str = EXACT_SGD, exclude_tables: set[int] | None = None
                  ) -> tuple[list[list], list[float], list[float]]:
    """The cache's shard measurements a fit may use: of ``dataset`` at ``batch_size`` on ``hardware``,
    whole-row tables only (table- or column-wise pieces), none in ``exclude_tables``; as
    ``(shards, fw_ms, bw_ms)``."""
    from shardcore.oracles.setting import dataset_digest

    exclude = exclude_tables or set()
    entries = cache.shard_entries(hardware=hardware, dataset=dataset_digest(dataset), batch_size=batch_size,
                                  precision=precision, optimizer=optimizer)
    shards, fw, bw = [], [], []
    for e in entries:
        ts = []
        for index, row, dim in e.tables:
            if not 0 <= index < dataset.num_tables or index in exclude:
                ts = None
                break
            base = dataset.tables[index]
            if row != base.row:
                ts = None
                break
            ts.append(base.with_dim(int(dim)))
        if ts:
            shards.append(ts)
            fw.append(e.fw_ms)
            bw.append(e.bw_ms)
    return shards, fw, bw


def fit_cost_model(cache, dataset, batch_size: int, *, hardware: str, precision: str = "fp16",
                   optimizer: str = EXACT_SGD, data_dir: str | os.PathLike | None = None,
                   exclude_tables: set[int] | None = None, comm_fallback: CommModel | None = None,
                   min_shards: int = 20) -> CostModel:
    """Fit the measured landscape's model on the cache's measurements of ``dataset`` at ``batch_size``.

    Only shards whose tables are whole-row (table- or column-wise pieces) and none of whose tables is
    in ``exclude_tables`` (e.g. the test tables) are used. The exchange is fitted on the cache's plan
    measurements by the same rule (:func:`exchange_samples`: no plan holding an excluded table), both
    phases at once (:func:`~shardcore.oracles.commmodel.fit_exchange_model`), once per device count
    (:attr:`CostModel.comm_by_devices`) and once over all of them (:attr:`CostModel.comm`, for other
    counts); with fewer than two sizes, ``comm_fallback`` (or an error) is used."""
    shards, fw, bw = usable_shards(cache, dataset, batch_size, hardware=hardware, precision=precision,
                                   optimizer=optimizer, exclude_tables=exclude_tables)
    if len(shards) < min_shards:
        raise ShardError(f"only {len(shards)} usable shard measurements at batch {batch_size} in the cache "
                         f"(need {min_shards}); collect some with collect_compute_cost_data.py --weights-precision {precision}")
    X, spec, default_cv, cvs = _fit_features(shards, batch_size, hardware, data_dir)
    params = fit_params({int(batch_size): (X, np.asarray(fw), np.asarray(bw))}, spec,
                        card="cpu" if spec is CPU_SPEC else "measured",
                        fitted_on=f"{len(shards)} shard measurements ({hardware})", known_tables=None,
                        default_cv=default_cv)
    by_n = exchange_samples(cache, dataset, batch_size, hardware=hardware, precision=precision, optimizer=optimizer,
                            exclude_tables=exclude_tables)
    link = "measured all-to-all (this machine)"
    per_n = {}
    for n, samples in sorted(by_n.items()):
        try:
            per_n[n] = fit_exchange_model(samples, link=f"{link}, {n} devices")
        except ShardError:
            pass
    try:
        comm = fit_exchange_model([x for samples in by_n.values() for x in samples], link=link)
        comm_src = (f"{sum(map(len, by_n.values()))} measured exchanges of plans outside the excluded tables "
                    f"(per device count: {', '.join(f'{n}: {len(by_n[n])}' for n in per_n) or 'none'})")
    except ShardError:
        if comm_fallback is None:
            raise ShardError("the cache holds no plan measurements at two or more sizes to fit the exchange; "
                             "measure some plans (eval.py) first") from None
        comm, comm_src = comm_fallback, "the given exchange model (no plan measurements)"
    return CostModel(GpuComputeModel(params, SHIPPED), comm, int(batch_size), landscape=MEASURED, length_cv=cvs,
                     precision=precision, comm_by_devices=per_n or None,
                     source=f"fitted: compute on {len(shards)} shards, comm on {comm_src}")


def exchange_plans(cache, dataset, batch_size: int, *, hardware: str, precision: str = "fp16",
                   optimizer: str = EXACT_SGD, exclude_tables: set[int] | None = None, held_out: bool = False):
    """The cache's measured plans of two or more devices that an exchange fit may use, each with its
    pieces per device as ``(index, row, dim)``: whole-row pieces (table- and column-wise, as the cache
    stores them) none of whose tables is in ``exclude_tables`` (``held_out``: the others, those holding
    one of them)."""
    from shardcore.oracles.setting import dataset_digest

    exclude = exclude_tables or set()
    for p in cache.plan_entries(hardware=hardware, dataset=dataset_digest(dataset), batch_size=batch_size,
                                precision=precision, optimizer=optimizer):
        pieces = [[(int(i), int(r), int(d)) for i, r, d in s] for s in p.shards]
        if any(not 0 <= i < dataset.num_tables or r != dataset.tables[i].row for s in pieces for i, r, _d in s):
            continue
        if any(i in exclude for s in pieces for i, _r, _d in s) != held_out or len(pieces) < 2:
            continue
        yield p, pieces


def exchange_samples(cache, dataset, batch_size: int, *, hardware: str, precision: str = "fp16",
                     optimizer: str = EXACT_SGD, exclude_tables: set[int] | None = None,
                     held_out: bool = False) -> dict[int, list]:
    """The cache's measured exchanges a fit may use, per device count: of the plans of
    :func:`exchange_plans`; per device ``(pooled bytes, id bytes, fw_ms, bw_ms)`` (each all-to-all's max of bytes sent and
    received; :func:`~shardcore.oracles.commmodel.fit_exchange_model`'s samples)."""
    out: dict[int, list] = {}
    for p, pieces in exchange_plans(cache, dataset, batch_size, hardware=hardware, precision=precision,
                                    optimizer=optimizer, exclude_tables=exclude_tables, held_out=held_out):
        n = len(pieces)
        dims = np.array([sum(d for _i, _r, d in s) for s in pieces], dtype=float)
        ids = np.array([sum(piece_id_width(dataset.tables[i].with_dim(d)) for i, _r, d in s) for s in pieces])
        pooled = np.maximum(*[np.asarray(x, dtype=float) for x in zip(*remote_bytes(dims.astype(int), batch_size))])
        idb = np.maximum(*id_bytes(ids, batch_size))
        out.setdefault(n, []).extend((float(a), float(b), float(c[1]), float(c[2]))
                                     for a, b, c in zip(pooled, idb, p.device_costs_ms))
    return out


def _fit_features(shards, batch_size: int, hardware: str, data_dir) -> tuple:
    """The fit's feature matrix of ``shards``, its spec (the CPU family on a CPU fingerprint), the default
    bag-length CV and the dataset's CVs (None without lookup data)."""
    from shardcore.oracles.setting import is_cpu_hardware

    cvs = length_cvs(data_dir, batch_size) if data_dir is not None else None
    default_cv = float(np.median(cvs)) if cvs else DEFAULT_CV
    spec = CPU_SPEC if is_cpu_hardware(hardware) else DEFAULT_SPEC
    X = device_features(shards, int(batch_size), spec, lambda t: cvs[t.index] if cvs else default_cv)
    return X, spec, default_cv, cvs


def compute_fit_errors(cache, dataset, batch_size: int, *, hardware: str, precision: str = "fp16",
                       optimizer: str = EXACT_SGD, data_dir: str | os.PathLike | None = None,
                       exclude_tables: set[int] | None = None, folds: int = 5, min_shards: int = 20) -> dict:
    """How well :func:`fit_cost_model`'s compute fit follows the shards it may use (MAPE %):
    ``in_fw``, ``in_bw``, ``in_total`` in-sample; ``cv_total`` cross-validated by table: fold ``k``
    predicts the shards holding a table whose index is ``k`` mod ``folds``, fitted on the shards holding
    none (a fold with fewer than ``min_shards`` to fit on is skipped); ``shards`` and ``cv_predictions``
    (how many shards were predicted held out)."""
    shards, fw, bw = usable_shards(cache, dataset, batch_size, hardware=hardware, precision=precision,
                                   optimizer=optimizer, exclude_tables=exclude_tables)
    if len(shards) < min_shards:
        raise ShardError(f"only {len(shards)} usable shard measurements at batch {batch_size} in the cache (need {min_shards})")
    X = _fit_features(shards, batch_size, hardware, data_dir)[0]
    fw, bw = np.asarray(fw, dtype=float), np.asarray(bw, dtype=float)

    def fitted(keep):
        return X @ fit_weights(X[keep], fw[keep]), X @ fit_weights(X[keep], bw[keep])

    pf, pb = fitted(np.ones(len(shards), dtype=bool))
    out = {"shards": len(shards), "in_fw": mape(pf, fw), "in_bw": mape(pb, bw), "in_total": mape(pf + pb, fw + bw)}
    pred, true = [], []
    for k in range(int(folds)):
        held = np.array([any(t.index % folds == k for t in s) for s in shards])
        if (~held).sum() >= min_shards and held.any():
            pf, pb = fitted(~held)
            pred.append((pf + pb)[held])
            true.append((fw + bw)[held])
    out["cv_predictions"] = int(sum(len(p) for p in pred))
    out["cv_total"] = mape(np.concatenate(pred), np.concatenate(true)) if pred else math.nan
    return out


def exchange_fit_errors(cache, dataset, batch_size: int, model: CostModel, *, hardware: str, precision: str = "fp16",
                        optimizer: str = EXACT_SGD, exclude_tables: set[int] | None = None) -> dict[int, dict]:
    """How well ``model``'s exchange follows the cache's measured exchanges, per device count: per-device
    MAPE (%) of the forward and backward phases on the plans the fit may use (``in_fw``, ``in_bw``, over
    ``in_devices``) and on the plans holding an excluded table (``held_fw``, ``held_bw``, over
    ``held_devices``: held out, e.g. the test plans), each as :meth:`CostModel.comm_for` prices it."""
    allowed, held = (exchange_samples(cache, dataset, batch_size, hardware=hardware, precision=precision,
                                      optimizer=optimizer, exclude_tables=exclude_tables, held_out=h)
                     for h in (False, True))
    out: dict[int, dict] = {}
    for n in sorted(set(allowed) | set(held)):
        comm = model.comm_for(n)
        lat, slope = comm.latency_us * 1e-3, 1e-6 / comm.bandwidth_gbps
        row = {"latency_us": comm.latency_us, "bandwidth_gbps": comm.bandwidth_gbps, "own": n in (model.comm_by_devices or {})}
        for name, samples in (("in", allowed.get(n, [])), ("held", held.get(n, []))):
            a = np.asarray(samples, dtype=float).reshape(-1, 4)
            row[f"{name}_devices"] = len(a)
            row[f"{name}_fw"] = mape(2 * lat + (a[:, 0] + a[:, 1]) * slope, a[:, 2]) if len(a) else math.nan
            row[f"{name}_bw"] = mape(lat + a[:, 0] * slope, a[:, 3]) if len(a) else math.nan
        out[n] = row
    return out


def mape(pred: Sequence[float], true: Sequence[float]) -> float:
    p, t = np.asarray(pred, dtype=float), np.asarray(true, dtype=float)
    keep = t > 0
    if not keep.any():
        return math.nan
    return float(100.0 * np.mean(np.abs(p[keep] - t[keep]) / t[keep]))
