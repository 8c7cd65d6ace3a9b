"""A calibrated card: an emulated device fitted on measurements of the hardware a user has, one JSON file
(:data:`~shardcore.planning.CARD_FORMAT`), named as a landscape with ``--oracle emulated:<card file>``.

``tools/calibrate.py`` measures a designed set of shards on this machine through the measured oracle
(:mod:`shardcore.oracles.emulated.calibration`), sweeps its exchanges, and writes the card; the shipped H200
is one card in the same format (``tools/calibrate.py --export h200``, ``data/cards/h200.json``: the shipped
fit, nothing refitted). A card holds:

- **what it stands for**: the hardware in words and the measured oracle's fingerprint (device, torch and
  fbgemm versions), the device kind (``cpu`` or ``cuda``), the batch, weights precision and optimizer the
  shards were measured at;
- **the measurements**: every measured device's pieces (a dataset table's index, its piece kind, rows and
  dim; the tables' configs once, in ``tables``) and its forward and backward milliseconds, each in a
  ``group`` (shards drawn from one pool of tables) of a ``kind`` (``table``, ``multi``, ``column``,
  ``row``, ``replica``);
- **the compute model**: :class:`~shardcore.oracles.emulated.model.GpuComputeModel` parameters
  (``format`` shardkit-gpu-emulator-1; the CPU feature family on a CPU card, the GPU family on a CUDA one),
  fitted by the one fit every model of measured devices uses (:func:`fit_card_params`: the feature rows
  of :func:`~shardcore.oracles.emulated.model.device_features`, non-negative least squares on the relative
  error; a GPU card's data-parallel kernels by its replica law), and the physical weights that price a
  table beyond the measured range (:func:`~shardcore.oracles.emulated.model.fit_physical_weights`);
- **the domain** (:class:`~shardcore.oracles.emulated.domain.Domain`): the ranges of the tables measured;
  a table outside is priced as the domain machinery prices it, and every output says so in one line;
- **the exchange**: latency (us) and bandwidth (GB/s) fitted by least squares to the all-to-alls (and
  all-reduces) measured over a sweep of message sizes, or, with one device or a modelled exchange, the
  stated figures of :class:`~shardcore.oracles.commmodel.CommModel` and why;
- **its accuracy** (:func:`card_accuracy`): the held-out MAPE of forward + backward on its own
  measurements, each device predicted by a fit that never saw any of its tables (folds of whole groups,
  every training device sharing no table with the fold), and the rank agreement (Spearman) of predicted
  and measured within each group, where a planner's choices lie.

A card is read once per file state (:func:`read_card`), every problem a one-line
:class:`~shardcore.errors.ShardError` naming the file.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from shardcore.errors import ShardError
from shardcore.oracles.commmodel import CommModel
from shardcore.oracles.setting import PRECISIONS, normalize_optimizer
from shardcore.planning import CARD_FORMAT, EMULATED_CARDS
from shardcore.plan import DATA_PARALLEL, ROW_WISE, ShardPiece
from shardcore.tables import TableConfig

from .domain import Domain, domain_of
from .model import (BYTES_PER_WEIGHT, FORMAT, GpuComputeModel, _is_cpu, device_features, fit_params,
                    fit_physical_weights, predict_devices, replica_law, spec_for, weight_bytes)

KINDS = ("table", "multi", "column", "row", "replica")
FOLDS = 5                 # the accuracy's folds of whole groups
MIN_FIT_DEVICES = 3       # a fold is refitted on at least this many devices, else left unpredicted
MIN_RANK_SHARDS = 3       # a group ranks at least this many shards
DOMAIN_FIELDS = ("max_rows", "max_pooling", "min_dim", "max_dim", "few_lookup_max_rows")
FOREIGN = {FORMAT: "a GPU emulator parameter file (its model alone)",
           "shardkit-planner-cost-1": "a shardkit cost model (tools/fit_shardkit_model.py)",
           "shardkit-gpu-measurements/1": "the GPU measurements' manifest"}


def _problem(where: str, what: str) -> ShardError:
    return ShardError(f"{where}: {what}")


def _num(obj: Mapping, key: str, where: str, *, integer: bool = False, positive: bool = False):
    v = obj.get(key) if isinstance(obj, Mapping) else None
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if ok and integer:
        ok = float(v) == int(v)
    if ok and positive:
        ok = v > 0
    if not ok:
        kind = "a whole number" if integer else "a number"
        raise _problem(where, f"{key} must be {kind}{' > 0' if positive else ''}, got {v!r}")
    return int(v) if integer else float(v)


# -- a measured device's pieces as JSON ------------------------------------------------------------------
def piece_json(p: TableConfig) -> dict:
    """A measured piece: its table's index and dim; a row block its rows and first row, a replica its
    batch part (its table's config is the card's ``tables`` entry)."""
    kind = getattr(p, "kind", "table_wise")
    out = {"index": int(p.index), "dim": int(p.dim)}
    if kind == ROW_WISE:
        out.update(kind=ROW_WISE, rows=int(p.row), row_start=int(p.row_start))
    elif kind == DATA_PARALLEL:
        out.update(kind=DATA_PARALLEL, batch_part=[int(v) for v in p.batch_part])
    return out


def piece_of_json(obj, tables: Mapping[int, TableConfig], where: str) -> TableConfig:
    """The piece of :func:`piece_json`, made as a plan makes it (:meth:`shardcore.plan.Sharding.pieces`)."""
    if not isinstance(obj, Mapping):
        raise _problem(where, f"a piece must be an object, got {obj!r}")
    index, dim = _num(obj, "index", where, integer=True), _num(obj, "dim", where, integer=True, positive=True)
    t = tables.get(index)
    if t is None:
        raise _problem(where, f"table {index} is not in the card's tables")
    if dim > t.dim:
        raise _problem(where, f"table {index}: dim {dim} is above the table's {t.dim}")
    kind = obj.get("kind", "table_wise")
    if kind in ("table_wise", "column_wise"):
        return t if dim == t.dim else t.with_dim(dim)
    if kind == ROW_WISE:
        rows, start = _num(obj, "rows", where, integer=True, positive=True), _num(obj, "row_start", where, integer=True)
        if not (0 <= start and start + rows <= t.row):
            raise _problem(where, f"table {index}: rows {start}..{start + rows - 1} outside its {t.row} rows")
        return ShardPiece(t.index, rows, dim, t.pooling_factor * rows / t.row, t.bins, None, kind=ROW_WISE,
                          row_start=start, full_row=t.row)
    if kind == DATA_PARALLEL:
        part = obj.get("batch_part")
        if not (isinstance(part, list) and len(part) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                  for v in part) and 0 <= part[0] < part[1]):
            raise _problem(where, f"table {index}: batch_part must be [j, n] with 0 <= j < n, got {part!r}")
        return ShardPiece(t.index, t.row, dim, t.pooling_factor, t.bins, t.length_cv, kind=DATA_PARALLEL,
                          full_row=t.row, batch_part=(part[0], part[1]))
    raise _problem(where, f"unknown piece kind {kind!r}")


class MeasuredDevice:
    """One measured device of a card: its pieces, forward and backward ms, kind and group."""

    __slots__ = ("pieces", "fw_ms", "bw_ms", "kind", "group")

    def __init__(self, pieces, fw_ms: float, bw_ms: float, kind: str, group: int):
        self.pieces, self.fw_ms, self.bw_ms, self.kind, self.group = tuple(pieces), float(fw_ms), float(bw_ms), kind, int(group)

    @property
    def tables(self) -> frozenset:
        return frozenset(int(p.index) for p in self.pieces)

    @property
    def has_replicas(self) -> bool:
        return any(getattr(p, "kind", None) == DATA_PARALLEL for p in self.pieces)

    def to_json(self) -> dict:
        return {"group": self.group, "kind": self.kind, "pieces": [piece_json(p) for p in self.pieces],
                "fw_ms": round(self.fw_ms, 6), "bw_ms": round(self.bw_ms, 6)}


# -- the one fit of measured devices --------------------------------------------------------------------
def _cv_of(tables: Mapping[int, TableConfig]):
    def cv(t: TableConfig) -> float:
        base = tables.get(int(t.index))
        return math.nan if base is None or base.length_cv is None else float(base.length_cv)
    return cv


def fit_card_params(devices: Sequence[MeasuredDevice], tables: Mapping[int, TableConfig], batch: int, spec: Mapping,
                    *, name: str, fitted_on: str, precision: str = "fp16") -> dict:
    """The compute model of ``devices`` (:class:`GpuComputeModel` parameters): forward and backward weights
    by non-negative least squares on the relative error of :func:`device_features` (a CPU family prices a
    device's replica kernel by its features at the slice, so every device enters; a GPU family fits the
    devices without replicas, then its replica law on those with them, :func:`replica_law`)."""
    cv_of = _cv_of(tables)
    nbytes = BYTES_PER_WEIGHT if _is_cpu(spec) else weight_bytes(precision)
    rows = [d for d in devices if _is_cpu(spec) or not d.has_replicas]
    if not rows:
        raise ShardError("a card's compute fit needs measured devices without data-parallel replicas")
    X = device_features([d.pieces for d in rows], batch, spec, cv_of, nbytes)
    cvs = [c for c in (cv_of(t) for t in tables.values()) if c == c]
    params = fit_params({int(batch): (X, np.array([d.fw_ms for d in rows]), np.array([d.bw_ms for d in rows]))},
                        spec, card=name, fitted_on=fitted_on, known_tables=None,
                        default_cv=float(np.median(cvs)) if cvs else 0.7)
    if not _is_cpu(spec):
        reps = [(d.pieces, d.fw_ms, d.bw_ms) for d in devices if d.has_replicas]
        law, _ = replica_law(GpuComputeModel(params), reps, batch)
        if law is not False:
            params["replica_weights"] = [[float(v) for v in row] for row in law]
    return params


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Rank correlation of ``a`` and ``b`` (average ranks for ties); NaN where either is constant."""
    def ranks(x):
        x = np.asarray(x, dtype=float)
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=float)
        for v in np.unique(x):
            tie = x == v
            r[tie] = r[tie].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    if len(ra) < 2 or ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


def card_accuracy(devices: Sequence[MeasuredDevice], tables: Mapping[int, TableConfig], batch: int, spec: Mapping,
                  precision: str = "fp16", folds: int = FOLDS) -> dict:
    """How well the card's fit predicts devices it never saw. The groups are dealt into ``folds`` folds
    (group ``g`` into fold ``g mod folds``); each fold's devices are predicted by the fit
    (:func:`fit_card_params`) on every device that shares no table with any of them, so no prediction ever
    saw a table it prices. ``mape_pct``: mean |predicted - measured| / measured of fw + bw over the predicted
    devices (``by_kind``: per kind); ``spearman_within_groups``: the rank correlation of predicted and
    measured fw + bw within each group of at least :data:`MIN_RANK_SHARDS` predicted devices (shards of
    one table pool: a planner's alternatives), averaged over the groups weighted by their size;
    ``error_ratios``: every measured / predicted over their median (the spread a planner may draw from)."""
    groups = sorted({d.group for d in devices})
    k = min(int(folds), len(groups))
    out = {"method": f"{k} folds of whole groups, each predicted by a fit on the devices sharing none of its tables",
           "devices": len(devices), "predicted": 0, "mape_pct": None, "by_kind": {}, "spearman_within_groups": None,
           "groups_ranked": 0, "error_ratios": []}
    if k < 2:
        out["method"] = "not computed: fewer than two groups of shards"
        return out
    fold_of = {g: i % k for i, g in enumerate(groups)}
    pred = np.full(len(devices), np.nan)
    for f in range(k):
        test = [i for i, d in enumerate(devices) if fold_of[d.group] == f]
        seen = frozenset().union(*(devices[i].tables for i in test))
        train = [d for d in devices if d.tables.isdisjoint(seen)]
        if len(train) < MIN_FIT_DEVICES or not any(not d.has_replicas for d in train):
            continue
        params = fit_card_params(train, tables, batch, spec, name="fold", fitted_on="fold", precision=precision)
        model = GpuComputeModel(params)
        cv_of = _cv_of(tables)
        p = predict_devices(model, [devices[i].pieces for i in test], batch, cv_of, precision=precision).sum(1)
        pred[test] = p
    meas = np.array([d.fw_ms + d.bw_ms for d in devices])
    ok = np.isfinite(pred) & (pred > 0) & (meas > 0)
    if not ok.any():
        out["method"] += "; no fold had enough devices to refit"
        return out
    err = np.abs(pred - meas) / meas
    out["predicted"] = int(ok.sum())
    out["mape_pct"] = round(100.0 * float(err[ok].mean()), 3)
    for kind in KINDS:
        sel = ok & np.array([d.kind == kind for d in devices])
        if sel.any():
            out["by_kind"][kind] = {"devices": int(sel.sum()), "mape_pct": round(100.0 * float(err[sel].mean()), 3)}
    rhos, weights = [], []
    for g in groups:
        sel = ok & np.array([d.group == g for d in devices])
        if sel.sum() >= MIN_RANK_SHARDS:
            rho = spearman(pred[sel], meas[sel])
            if rho == rho:
                rhos.append(rho)
                weights.append(int(sel.sum()))
    if rhos:
        out["spearman_within_groups"] = round(float(np.average(rhos, weights=weights)), 4)
        out["groups_ranked"] = len(rhos)
    ratio = meas[ok] / pred[ok]
    out["error_ratios"] = [round(float(r), 6) for r in ratio / np.median(ratio)]
    return out


# -- building a card from measured devices --------------------------------------------------------------
def build_card(devices: Sequence[MeasuredDevice], tables: Mapping[int, TableConfig], *, name: str, hardware: str,
               fingerprint: str, device_type: str, software: Mapping, batch_size: int, precision: str,
               optimizer: str, exchange: Mapping, calibration: Mapping, dataset: Mapping) -> dict:
    """The card (JSON object) of ``devices`` measured at ``batch_size``: the fit, its domain, its physical
    weights, its accuracy, and what the caller measured of the exchange (``exchange``) and how
    (``calibration``, ``dataset``)."""
    if not devices:
        raise ShardError("no measured devices to fit a card on")
    spec = spec_for(device_type, len(devices))
    used = {int(p.index) for d in devices for p in d.pieces}
    tables = {i: tables[i] for i in sorted(used)}
    params = fit_card_params(devices, tables, batch_size, spec, name=name, precision=precision,
                             fitted_on=f"{len(devices)} devices measured on {hardware}")
    whole = [d for d in devices if not d.has_replicas]
    phys = fit_physical_weights([d.pieces for d in whole], np.array([d.fw_ms for d in whole]),
                                np.array([d.bw_ms for d in whole]), batch_size,
                                BYTES_PER_WEIGHT if device_type == "cpu" else weight_bytes(precision))
    dom = domain_of(name, [p for d in devices for p in d.pieces])
    return {"format": CARD_FORMAT, "name": name, "hardware": hardware, "fingerprint": fingerprint,
            "device_type": device_type, "software": dict(software), "batch_size": int(batch_size),
            "precision": precision, "optimizer": optimizer, "dataset": dict(dataset),
            "calibration": dict(calibration), "exchange": dict(exchange),
            "domain": {f: getattr(dom, f) for f in DOMAIN_FIELDS},
            "physical_weights": [[float(v) for v in row] for row in phys],
            "model": params,
            "accuracy": card_accuracy(devices, tables, batch_size, spec, precision),
            "tables": [t.to_json() for t in tables.values()],
            "measurements": [d.to_json() for d in devices]}


def exchange_block(source: str, comm: CommModel, note: str, all_to_all: Mapping | None = None,
                   all_reduce: Mapping | None = None) -> dict:
    """A card's ``exchange``: the figures the card's exchange model uses (``latency_us``,
    ``bandwidth_gbps``, ``link``), whether they were ``measured`` here or stay ``modelled``, why
    (``note``), and the sweeps' samples and fits."""
    return {"source": source, "latency_us": float(comm.latency_us), "bandwidth_gbps": float(comm.bandwidth_gbps),
            "link": comm.link, "note": note, "all_to_all": dict(all_to_all) if all_to_all else None,
            "all_reduce": dict(all_reduce) if all_reduce else None}


# -- the shipped H200 as a card --------------------------------------------------------------------------
def export_shipped(card: str = "h200") -> dict:
    """The shipped ``card`` (its fit on every measurement of ``data/gpu_measurements/``) as a card: the
    same parameters, replica law, domain and physical weights, the exchange model's stated figures, and the
    shipped cross-validated accuracy (folds of shards, :func:`~shardcore.oracles.emulated.measurements.model_error`'s
    split) with the within-task rank agreement of the measured plans' devices. Its measurements stay in
    that folder (``measurements`` is empty; ``measured_in`` names it)."""
    from shardcore.oracles.emulated import measurements as M
    from shardcore.oracles.commmodel import DEFAULT_LINK

    model = M.load_gpu_model(card)
    params = dict(M.read_params(M.model_path(card)))
    params["replica_weights"] = [[float(v) for v in row] for row in model.replica_weights]
    dom = M.card_domain(card)
    land = M.measured_landscapes(card)[0]
    idx = np.arange(len(land.tables))
    fold = np.array([M._fold_of(land.tables[i] | {-1}, FOLDS) for i in idx])
    pred = np.full(len(idx), np.nan)
    for k in range(FOLDS):
        test = fold == k
        wf, wb = land.fit(~test)
        pred[test] = land.X[test] @ wf + land.X[test] @ wb
    meas = land.fw + land.bw
    err = np.abs(pred - meas) / meas
    rhos, weights = [], []
    for task in sorted({t for s in land.meas["shards"] for t in s["tasks"]}):
        sel = np.array([task in s["tasks"] for s in land.meas["shards"]])
        if sel.sum() >= MIN_RANK_SHARDS:
            rho = spearman(pred[sel], meas[sel])
            if rho == rho:
                rhos.append(rho)
                weights.append(int(sel.sum()))
    ratio = meas / pred
    accuracy = {"method": f"{FOLDS} folds of the measured shards (a split by their table sets), each predicted by "
                          "the fit on the others, at batch " + str(land.batch),
                "devices": len(idx), "predicted": len(idx), "mape_pct": round(100.0 * float(err.mean()), 3),
                "by_kind": {}, "spearman_within_groups": round(float(np.average(rhos, weights=weights)), 4) if rhos else None,
                "groups_ranked": len(rhos), "groups": "the devices of each measured task's plans",
                "error_ratios": [round(float(r), 6) for r in M.model_error(frozenset(), card)]}
    measured = str(M.MANIFEST["cards"][card].get("measured", card))
    software = {k: m.group(1) for k, m in (("torch", re.search(r"torch ([^,\s]+)", measured)),
                                          ("fbgemm", re.search(r"(fbgemm-gpu [^,\s]+)", measured))) if m}
    comm = CommModel()
    return {"format": CARD_FORMAT, "name": card, "hardware": measured.split(", measured")[0],
            "fingerprint": measured, "device_type": "cuda", "software": software, "batch_size": int(land.batch),
            "precision": "fp16", "optimizer": "exact_sgd",
            "dataset": {"source": "data/gpu_measurements/dlrm_b65536 (the default synthetic dataset, seed 0)",
                        "tables": len(land.meas["tables"])},
            "calibration": {"how": "the shipped fit (tools/fit_gpu_emulator.py), exported by tools/calibrate.py --export"},
            "exchange": exchange_block("modelled", comm, f"the exchange model's stated figures ({DEFAULT_LINK}); "
                                                         "not measured with this card"),
            "domain": {f: getattr(dom, f) for f in DOMAIN_FIELDS},
            "physical_weights": [[float(v) for v in row] for row in M.physical_weights(card)],
            "model": params, "accuracy": accuracy, "tables": [], "measurements": [],
            "measured_in": "data/gpu_measurements/ (manifest.json)"}


# -- reading a card --------------------------------------------------------------------------------------
class Card:
    """A card file read and checked (see the module notes); a compute model's
    :class:`~shardcore.oracles.emulated.model.MeasuredCard` (its domain, physical weights; its replica law
    is in its parameters)."""

    def __init__(self, obj: Mapping, path: str = "card"):
        where = str(path)
        self.path = where
        self.obj = dict(obj)
        for key in ("name", "hardware", "device_type", "precision", "optimizer"):
            if not isinstance(obj.get(key), str) or not obj.get(key):
                raise _problem(where, f"{key} must be a non-empty string")
        self.name, self.hardware = obj["name"], obj["hardware"]
        self.device_type = obj["device_type"]
        if self.device_type not in ("cpu", "cuda"):
            raise _problem(where, f"device_type must be cpu or cuda, got {self.device_type!r}")
        self.batch_size = _num(obj, "batch_size", where, integer=True, positive=True)
        if obj["precision"] not in PRECISIONS:
            raise _problem(where, f"precision must be one of {', '.join(PRECISIONS)}, got {obj['precision']!r}")
        self.precision = obj["precision"]
        try:
            self.optimizer = normalize_optimizer(obj["optimizer"])
        except ShardError as exc:
            raise _problem(where, str(exc)) from None
        d = obj.get("domain")
        if not isinstance(d, Mapping):
            raise _problem(where, "domain must be an object")
        self._domain = Domain(self.name, _num(d, "max_rows", where, integer=True, positive=True),
                              _num(d, "max_pooling", where), _num(d, "min_dim", where, integer=True, positive=True),
                              _num(d, "max_dim", where, integer=True, positive=True),
                              _num(d, "few_lookup_max_rows", where, integer=True), (self.precision,))
        phys = obj.get("physical_weights")
        if not (isinstance(phys, list) and len(phys) == 2 and all(
                isinstance(row, list) and len(row) == 3 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                                and math.isfinite(v) for v in row) for row in phys)):
            raise _problem(where, "physical_weights must be 2 x 3 finite numbers (forward, backward)")
        self._physical = np.asarray(phys, dtype=float)
        ex = obj.get("exchange")
        if not isinstance(ex, Mapping) or ex.get("source") not in ("measured", "modelled"):
            raise _problem(where, "exchange must be an object with source measured or modelled")
        try:
            self._comm = CommModel(_num(ex, "bandwidth_gbps", where, positive=True), _num(ex, "latency_us", where),
                                   f"{self.hardware}: {ex.get('link') or 'the card'}",
                                   "fitted" if ex["source"] == "measured" else "analytic")
        except ShardError as exc:
            raise _problem(where, f"exchange: {exc}") from None
        acc = obj.get("accuracy")
        if not isinstance(acc, Mapping):
            raise _problem(where, "accuracy must be an object")
        ratios = acc.get("error_ratios") or []
        if not (isinstance(ratios, list) and all(isinstance(r, (int, float)) and not isinstance(r, bool)
                                                 and math.isfinite(r) and r > 0 for r in ratios)):
            raise _problem(where, "accuracy.error_ratios must be a list of positive numbers")
        if not isinstance(obj.get("tables"), list):
            raise _problem(where, "tables must be a list of table configs")
        self.tables = {}
        for k, t in enumerate(obj["tables"]):
            table = TableConfig.from_json(t, f"{where}: tables[{k}]")
            self.tables[table.index] = table
        meas = obj.get("measurements")
        if not isinstance(meas, list):
            raise _problem(where, "measurements must be a list")
        self.devices = []
        for k, m in enumerate(meas):
            at = f"{where}: measurements[{k}]"
            if not isinstance(m, Mapping) or not isinstance(m.get("pieces"), list) or not m["pieces"]:
                raise _problem(at, "must be an object with a non-empty pieces list")
            if m.get("kind") not in KINDS:
                raise _problem(at, f"kind must be one of {', '.join(KINDS)}, got {m.get('kind')!r}")
            pieces = [piece_of_json(p, self.tables, at) for p in m["pieces"]]
            fw, bw = _num(m, "fw_ms", at), _num(m, "bw_ms", at)
            if fw < 0 or bw < 0:
                raise _problem(at, "fw_ms and bw_ms must be >= 0")
            self.devices.append(MeasuredDevice(pieces, fw, bw, m["kind"], _num(m, "group", at, integer=True)))
        params = obj.get("model")
        if not isinstance(params, Mapping):
            raise _problem(where, "model must be an object of GPU emulator parameters")
        try:
            self.model = GpuComputeModel(params, self)
            self.model.replica_weights   # noqa: B018 - checked now (2 x 4 finite), not at the first replica
        except ShardError as exc:
            raise _problem(where, f"model: {exc}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise _problem(where, f"model: malformed parameters ({type(exc).__name__}: {exc})") from None
        if _is_cpu(self.model.spec) != (self.device_type == "cpu"):
            raise _problem(where, f"model: a {self.device_type} card needs the {self.device_type} feature family")

    # -- MeasuredCard ------------------------------------------------------------------------------------
    def domain(self, card: str | None = None) -> Domain:
        """The measured range, named ``card`` (how the landscape names the card) in its notes."""
        return self._domain if card is None else Domain(card, *[getattr(self._domain, f) for f in DOMAIN_FIELDS],
                                                          self._domain.precisions)

    def physical_weights(self, card: str | None = None) -> np.ndarray:
        return self._physical

    def fit_replica_weights(self, model: GpuComputeModel, exclude: frozenset) -> tuple:
        """A card's replica law is in its parameters (none: its shard model prices a replica kernel)."""
        return False, 0

    # -- what the card says ------------------------------------------------------------------------------
    @property
    def accuracy(self) -> dict:
        return dict(self.obj["accuracy"])

    @property
    def exchange(self) -> dict:
        return dict(self.obj["exchange"])

    @property
    def measured_shards(self) -> int:
        return len(self.devices) or int(self.obj["model"].get("sets", {}).get(str(self.batch_size), {}).get("shards", 0))

    def comm_model(self, given: CommModel | None = None) -> CommModel:
        """The card's exchange (``latency_us + bytes / bandwidth_gbps`` for every collective), unless
        ``given`` states other figures than :class:`CommModel`'s defaults (the flags that set them); its
        hosts, where it has any, are ``given``'s."""
        if given is None:
            return self._comm
        default = CommModel()
        if (given.bandwidth_gbps, given.latency_us) != (default.bandwidth_gbps, default.latency_us):
            return given
        import dataclasses

        return dataclasses.replace(self._comm, devices_per_host=given.devices_per_host,
                                   inter_bandwidth_gbps=given.inter_bandwidth_gbps,
                                   inter_latency_us=given.inter_latency_us)

    def error_ratios(self) -> np.ndarray | None:
        """Held-out measured / predicted of its devices over their median (None: not computed)."""
        r = self.obj["accuracy"].get("error_ratios") or []
        return np.asarray(r, dtype=float) if r else None

    def accuracy_line(self) -> str:
        acc = self.obj["accuracy"]
        if acc.get("mape_pct") is None:
            return f"accuracy not computed ({acc.get('method', '?')})"
        rho = acc.get("spearman_within_groups")
        return (f"held-out MAPE {acc['mape_pct']:.1f}% over {acc.get('predicted', '?')} devices"
                + (f", within-group Spearman {rho:.2f} ({acc.get('groups_ranked')} groups)" if rho is not None else ""))

    def check_setting(self, optimizer: str, precision: str, where: str) -> str | None:
        """A one-line error unless the card prices ``optimizer`` and ``precision``; the note where it prices
        another precision than it measured (a GPU card, by the bytes moved)."""
        if normalize_optimizer(optimizer) != self.optimizer:
            raise ShardError(f"{where} was measured with {self.optimizer} only; got {normalize_optimizer(optimizer)}")
        return self.precision_note(precision, where)

    def precision_note(self, precision: str, where: str) -> str | None:
        """None where the card measured ``precision``; a GPU card's note where it prices another by the bytes
        moved; a one-line error on a CPU card (its model prices the precision it was measured in only)."""
        if precision == self.precision:
            return None
        if self.device_type == "cpu":
            raise ShardError(f"{where} was measured with {self.precision} weights on a CPU, whose model prices only "
                             f"the precision it was measured in; calibrate a card with --weights-precision {precision}")
        return f"{precision} compute derived from {self.precision} measurements by bytes moved, not measured"


@functools.lru_cache(maxsize=16)
def _read(path: str, mtime_ns: int, size: int) -> Card:
    try:
        with open(path, "rb") as fh:
            obj = json.loads(fh.read().decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise ShardError(f"{path}: not a card: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ShardError(f"{path}: not a readable card ({type(exc).__name__}: {exc})") from None
    found = obj.get("format") if isinstance(obj, dict) else None
    if found != CARD_FORMAT:
        what = FOREIGN.get(found) if isinstance(found, str) else None
        if what is None and isinstance(found, str) and found.startswith("shardkit-card/"):
            what = f"a card of another format version ({found})"
        raise ShardError(f"{path}: not a card ({what or f'format {found!r}'}; expected format {CARD_FORMAT}, "
                         "written by tools/calibrate.py)")
    return Card(obj, path)


def read_card(path: str | os.PathLike) -> Card:
    """The card file at ``path``, read and checked once per state of the file (a one-line error otherwise)."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        raise ShardError(f"{path}: no such card file (tools/calibrate.py writes one)") from None
    if not p.is_file():
        raise ShardError(f"{path}: not a card file (a directory or device)")
    return _read(str(p), st.st_mtime_ns, st.st_size)


def card_model(card: str) -> GpuComputeModel:
    """The compute model of an emulated landscape's card: the shipped one (``h200``) or a card file's."""
    if card in EMULATED_CARDS:
        from .measurements import load_gpu_model

        return load_gpu_model(card)
    return read_card(card).model


def write_card(obj: Mapping, path: str | os.PathLike) -> None:
    """Write a card atomically, after checking it reads back as one."""
    from shardcore.io import atomic_open

    text = json.dumps(obj, indent=1) + "\n"
    Card(json.loads(text), str(path))      # what is written is a card
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path) as fh:
        fh.write(text)
