"""The measurements an emulated GPU is fitted on and judged by: the folder's manifest
(``data/gpu_measurements/manifest.json``: each card's parameter file, each batch's shard, plan and piece
files, the gpu_check runs, the task sets), the shipped model of a card (:func:`load_gpu_model`), its
measured range and replica law (:data:`SHIPPED`, what a :class:`~shardcore.oracles.emulated.model.GpuComputeModel`
is given as its ``measured``), the held-out refits that judge a plan without its own tables
(:func:`heldout_model`), and the judges' errors on held-out measurements (:func:`judge_error`,
:func:`piece_bias`, :func:`model_error`). The compute model itself is :mod:`shardcore.oracles.emulated.model`.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import os
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from shardcore.errors import ShardError
from shardcore.tables import TableConfig

from .domain import Domain, domain_of
from .model import (DEFAULT_SPEC, FORMAT, OPTIONAL_TERMS, PIECE_DEVICE_KINDS, REPLICA_FEATURES,
                    GpuComputeModel, feature_names, fit_physical_weights, fit_weights, known_cv, known_index,
                    piece_device_kind, predict_devices, replica_law, shard_features, table_arrays)

ROOT = Path(__file__).resolve().parents[3]   # the repository root (shardcore/oracles/emulated/)


MEASUREMENTS_DIR = ROOT / "data" / "gpu_measurements"


def read_manifest(directory: str | os.PathLike = MEASUREMENTS_DIR) -> dict:
    """``manifest.json`` of the measurements folder: which file holds what (each card's parameter file,
    each batch's shard and plan files, the gpu_check runs and whether each enters the fit, the task
    sets). A new measurement run is one more entry there, not a change here."""
    path = Path(directory) / "manifest.json"
    try:
        obj = json.loads(path.read_text())
        if not isinstance(obj, dict) or obj.get("format") != "shardkit-gpu-measurements/1":
            raise ValueError("no format shardkit-gpu-measurements/1")
        missing = [k for k in ("cards", "batches", "runs", "task_sets") if k not in obj]
        if missing:
            raise ValueError(f"no {', '.join(missing)}")
    except (OSError, ValueError) as exc:
        raise ShardError(f"{path}: not a readable measurements manifest ({type(exc).__name__}: {exc})") from None
    return obj


MANIFEST = read_manifest()


MODEL_FILES = {card: c["model"] for card, c in MANIFEST["cards"].items()}


# the gpu_check runs of the manifest whose measurements enter the fit, per batch
FIT_RUNS = {int(b): tuple(r for r in MANIFEST["runs"] if r["in_fit"] and int(r["batch"]) == int(b))
            for b in MANIFEST["batches"]}


PIECE_FILES = {b: tuple(r["pieces"] for r in runs if r.get("pieces")) for b, runs in FIT_RUNS.items()}


MIN_REPLICA_DEVICES = 8


def piece_of(obj: Mapping, tables: Sequence[TableConfig], where: str = "piece") -> TableConfig:
    """A measured device's piece from its JSON (``tools/gpu_check_lib.shard_line``'s ``pieces``)."""
    from shardcore.plan import COLUMN_WISE, DATA_PARALLEL, ROW_WISE, TABLE_WISE, ShardPiece

    try:
        t = tables[int(obj["index"])]
        kind, rows, dim = str(obj["kind"]), int(obj["rows"]), int(obj["dim"])
        if kind in (TABLE_WISE, COLUMN_WISE):
            return t if dim == t.dim else t.with_dim(dim)
        if kind not in (ROW_WISE, DATA_PARALLEL):
            raise ValueError(kind)
        part = tuple(int(v) for v in obj["batch_part"]) if obj.get("batch_part") else None
        pf = t.pooling_factor * (rows / t.row if kind == ROW_WISE and t.row else 1.0)
        return ShardPiece(t.index, rows, dim, pf, t.bins, kind=kind, row_start=int(obj.get("row_start", 0)),
                          full_row=int(obj.get("full_row") or t.row), batch_part=part)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ShardError(f"{where}: not a measured piece ({type(exc).__name__}: {exc})") from None


@functools.lru_cache(maxsize=None)
def measured_piece_devices(card: str = "h200", batch: int = 65536) -> tuple:
    """Every line of the ``PIECE_FILES``: ``(pieces, fw_ms, bw_ms, task, plan devices, task set)``, the
    last three None for a device measured outside a plan (a random piece set); the task set is a
    :data:`TASK_FILES` key (the line's ``set``, a :data:`GPUCHECK_SETS` name; a line without one is of the
    test set of its device count)."""
    from shardcore.dataset import load_table_configs

    if card != "h200" or not PIECE_FILES.get(batch):
        return ()
    tables = load_table_configs(MEASUREMENTS_DIR / f"dlrm_b{batch}" / "table_configs.json")
    out = []
    for name in PIECE_FILES[batch]:
        with open(MEASUREMENTS_DIR / name) as fh:
            for k, line in enumerate(fh, 1):
                if line.strip():
                    obj = json.loads(line)
                    pieces = tuple(piece_of(p, tables, f"{name}:{k}") for p in obj["pieces"])
                    task = int(obj["task"]) if "task" in obj else None
                    n = plan_devices(obj) if task is not None else None
                    which = line_task_set(obj, f"{name}:{k}") if task is not None else None
                    out.append((pieces, float(obj["fw_ms"]), float(obj["bw_ms"]), task, n, which))
    return tuple(out)


def replica_devices(card: str = "h200", batch: int = 65536) -> tuple:
    """The measured devices holding data-parallel replicas: ``(pieces, fw_ms, bw_ms)`` each."""
    return tuple((pieces, fw, bw) for pieces, fw, bw, *_ in measured_piece_devices(card, batch)
                 if any(getattr(t, "kind", None) == "data_parallel" for t in pieces))


def fit_replica_weights(model: GpuComputeModel, exclude: frozenset = frozenset(), card: str = "h200",
                        batch: int = 65536) -> tuple[np.ndarray | bool, int]:
    """``(weights [2, 3] or False, devices)``: non-negative least squares, forward and backward apart, of
    ``measured - model's other kernel`` on :func:`replica_features` over the measured devices with
    replicas, leaving out the devices of the held-out task (every table in ``exclude``; a device of
    another task shares some tables with nearly every task, so a table-level hold-out would leave none;
    three weights of a traffic law, not a table's cost, are what such a device teaches). False with
    fewer than :data:`MIN_REPLICA_DEVICES` devices."""
    rows = [r for r in replica_devices(model.card if model.card != "?" else card, batch)
            if not (exclude and {t.index for t in r[0]} <= exclude)]
    return replica_law(model, rows, batch, MIN_REPLICA_DEVICES)


def model_path(card: str) -> Path:
    if card not in MODEL_FILES:
        raise ShardError(f"no emulated GPU {card!r}: choose one of {', '.join(MODEL_FILES)}")
    return MEASUREMENTS_DIR / MODEL_FILES[card]


def read_params(path: str | os.PathLike) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ShardError(f"GPU emulator parameters not found: {path} (run tools/fit_gpu_emulator.py)")
    try:
        obj = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ShardError(f"{path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise ShardError(f"{path}: not a GPU emulator parameter file")
    return obj


@functools.lru_cache(maxsize=None)
def load_gpu_model(card: str = "h200") -> GpuComputeModel:
    """The shipped emulated-GPU compute model of ``card`` (cached; ``"h200"`` only for now)."""
    return GpuComputeModel(read_params(model_path(card)), SHIPPED)


def synthetic_length_cv(num_tables: int = 856, seed: int = 0) -> dict:
    """The known-tables block of the default synthetic dataset: per table its index, hash size,
    expected pooling factor and the CV of its per-sample lookup counts. The generator draws a
    sample's count as Poisson(Gamma(k, pf / k)) (negative binomial), so CV^2 = 1 / pf + 1 / k."""
    from shardcore.data.dlrm import synthetic_table_specs

    specs = synthetic_table_specs(num_tables, seed)
    cv = [math.sqrt(1.0 / s.pooling_factor + 1.0 / s.dispersion) if s.pooling_factor > 0 else 0.0
          for s in specs]
    return {"source": f"tools/gen_dlrm_data.py --synthetic (seed {seed}, {num_tables} tables): "
                      "CV^2 = 1/pooling_factor + 1/dispersion of the generator's negative binomial",
            "index": list(range(num_tables)), "row": [int(s.row) for s in specs],
            "pooling_factor": [round(float(s.pooling_factor), 6) for s in specs],
            "cv": [round(float(c), 6) for c in cv]}


def read_shard_lines(path: str | os.PathLike, tables: Sequence[TableConfig], allow_wider: bool = False) -> list[dict]:
    """Shard lines ``{"tables": [[table_index, dim], ...], ...}`` of a JSONL file, each returned as
    its object plus ``"configs"`` (the TableConfigs, column-shard dims applied). A missing file, bad
    JSON (with its line number), an unknown table id or a dim that is not a positive multiple of 4
    no larger than the table's own dim raise a one-line :class:`ShardError`. ``allow_wider``
    accepts dims above the table's own (the shipped random shards re-dim tables up to 128)."""
    path = Path(path)
    if not path.is_file():
        raise ShardError(f"shard file not found: {path}")
    out = []
    with open(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ShardError(f"{where}: malformed JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("tables"), list):
                raise ShardError(f'{where}: expected an object with a "tables" list of [table_index, dim]')
            configs = []
            for item in obj["tables"]:
                if (not isinstance(item, list) or len(item) != 2
                        or not all(isinstance(v, int) and not isinstance(v, bool) for v in item)):
                    raise ShardError(f"{where}: each table must be [table_index, dim] (integers), got {item!r}")
                idx, dim = item
                if not 0 <= idx < len(tables):
                    raise ShardError(f"{where}: unknown table id {idx} (the table configs have {len(tables)} tables)")
                own = tables[idx].dim
                if dim < 4 or dim % 4 or (dim > own and not allow_wider):
                    bound = "" if allow_wider else f" no larger than the table's dim {own}"
                    raise ShardError(f"{where}: table {idx}: dim {dim} must be a positive multiple of 4{bound}")
                configs.append(tables[idx] if dim == own else tables[idx].with_dim(dim))
            if obj.get("predicted") or "oracle" in obj:
                raise ShardError(f"{where}: holds predictions (by {obj.get('oracle') or 'a cost model'}, written by "
                                 "tools/predict_shard_costs.py), not measurements; give the measured shard file")
            for key in ("fw_ms", "bw_ms"):
                v = obj.get(key)
                if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0
                                      or not math.isfinite(v)):
                    raise ShardError(f"{where}: {key} must be a non-negative number (and finite), got {v!r}")
            obj = dict(obj)
            obj["configs"] = configs
            out.append(obj)
    return out


# -- the shipped measurements ----------------------------------------------------------------------
SHARD_FILES = {int(b): tuple(v["shards"]) + tuple(r["shards"] for r in FIT_RUNS[int(b)])
               for b, v in MANIFEST["batches"].items()}


PLAN_FILES = {int(b): v["plans"] for b, v in MANIFEST["batches"].items()}


# tools/gpu_check.py runs: (name, shard file, summary, pieces file or None); the summary's plans (task by
# task, algorithms in list order, set by set) own the shard file's plan lines in order, one per non-empty
# device, except the devices with row-wise or data-parallel pieces: those are the pieces file's lines
GPUCHECK_RUNS = {b: tuple((r["name"], r["shards"], r["summary"], r.get("pieces")) for r in runs)
                 for b, runs in FIT_RUNS.items()}


# The task sets a gpu_check run may measure plans of (tools/gpu_check_lib.SHIPPED_SETS): the test sets, and
# the training-pool sets, whose tables no test task holds (gen_tasks.py's default split, seed 0), so the
# devices of their plans are cost-model data that no held-out judge of a test task ever has to leave out
TASK_FILES = {name: v["file"] for name, v in MANIFEST["task_sets"].items()}


GPUCHECK_SETS = {v["gpu_check"]: name for name, v in MANIFEST["task_sets"].items()}


# a piece line that names no set: the test set of its plan's device count
SET_OF_DEVICES = {int(v["devices"]): name for name, v in MANIFEST["task_sets"].items() if v.get("devices")}


def plan_devices(obj: Mapping) -> int:
    """The device count of the plan a measured plan device's line (gpu_check) belongs to: 4 or 8."""
    return 4 if " 4 plan devices" in obj["hardware"] else 8


def line_task_set(obj: Mapping, where: str = "shard line") -> str:
    """The :data:`TASK_FILES` key of a measured plan device's line: its ``set`` (a :data:`GPUCHECK_SETS`
    name), or for a line that names none, the test set of its plan's device count."""
    if "set" not in obj:
        return SET_OF_DEVICES[plan_devices(obj)]
    which = GPUCHECK_SETS.get(str(obj["set"]))
    if which is None:
        raise ShardError(f"{where}: unknown task set {obj['set']!r}")
    return which


def shard_key(configs: Sequence[TableConfig]) -> tuple:
    """Identity of a shard: its (table index, dim) pairs, order ignored."""
    return tuple(sorted((int(t.index), int(t.dim)) for t in configs))


def load_measurements(batch: int, directory: str | os.PathLike = MEASUREMENTS_DIR) -> dict:
    """The measured shards and plans of one batch size.

    Returns ``{"tables", "shards", "plans", "runs"}``. ``shards``: one dict per distinct shard
    (:func:`shard_key`) with ``configs``, ``fw_ms``/``bw_ms`` (the mean of its measurements),
    ``measured``: ``[(run, fw, bw), ...]``, ``kind`` (``random`` when it was measured as a random
    shard, else ``plan``) and ``tasks``: the (set, task) pairs whose plans use it. ``plans``: one
    dict per measured plan with ``source`` (``plans``: the shared plans file; else the gpu_check run),
    ``set``, ``task``, ``alg``, ``gpu_cost_ms`` (that run's compute cost: max over devices of
    fw + bw) and ``shards`` (indices into ``shards``; empty devices left out).

    The shared plans file holds no allocation: a device is matched to the shard of the shared plan
    shards file with its measured (fw, bw) whose tables all belong to the plan's task (unique for
    every device). A gpu_check run's shard file lists the non-empty devices of its summary's plans
    in order; each line's (fw, bw) is checked against the summary."""
    from shardcore.dataset import load_table_configs

    directory = Path(directory)
    tables = load_table_configs(directory / f"dlrm_b{batch}" / "table_configs.json")
    shards, index = [], {}

    def add(configs, run, fw, bw, kind):
        key = shard_key(configs)
        k = index.get(key)
        if k is None:
            k = index[key] = len(shards)
            shards.append({"configs": list(configs), "measured": [], "kind": kind, "tasks": set()})
        s = shards[k]
        s["measured"].append((run, float(fw), float(bw)))
        if kind == "random":
            s["kind"] = "random"
        return k

    task_tables = {}
    for set_name, rel in TASK_FILES.items():
        with open(directory / rel) as fh:
            task_tables[set_name] = [set(int(v) for v in line.split()[0].split(",")) for line in fh if line.strip()]
    # the shared plans file and its shard files
    own = {}
    for name in SHARD_FILES[batch]:
        if any(name == r[1] for r in GPUCHECK_RUNS[batch]):
            continue
        kind = "random" if "random" in name else "plan"
        for obj in read_shard_lines(directory / name, tables, allow_wider=True):
            k = add(obj["configs"], "plans", obj["fw_ms"], obj["bw_ms"], kind)
            if kind == "plan":
                own.setdefault(k, (float(obj["fw_ms"]), float(obj["bw_ms"])))
    plans = []
    by_fw = sorted((f, k) for k, (f, _) in own.items())   # the candidates of a device: a window of fw
    fws = [f for f, _ in by_fw]
    with open(directory / PLAN_FILES[batch]) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            p = json.loads(line)
            members = task_tables[p["set"]][p["task"]]
            devs = []
            for fw, bw in p["gpu_fw_bw_ms"]:
                tol = 1e-4 * max(1.0, fw)
                window = by_fw[bisect.bisect_left(fws, fw - tol):bisect.bisect_right(fws, fw + tol)]
                hits = [k for _, k in window if abs(own[k][1] - bw) <= 1e-4 * max(1.0, bw)
                        and all(t.index in members for t in shards[k]["configs"])]
                if len(hits) != 1:
                    raise ShardError(f"{PLAN_FILES[batch]}:{lineno}: a device matches {len(hits)} measured shards")
                devs.append(hits[0])
            plans.append({"source": "plans", "set": p["set"], "task": p["task"], "alg": p["alg"],
                          "gpu_cost_ms": float(p["gpu_cost_ms"]), "shards": devs})
    # the gpu_check runs
    partial = []   # plans with a device of pieces: their whole-table devices fit, the plan is not scored
    for run, shard_name, summary_name, pieces_name in GPUCHECK_RUNS[batch]:
        lines = read_shard_lines(directory / shard_name, tables, allow_wider=True)
        with open(directory / summary_name) as fh:
            summary = json.load(fh)
        pieces: dict[tuple, int] = {}   # (hardware, task, alg, fw, bw) of a device with pieces -> lines
        if pieces_name:
            with open(directory / pieces_name) as fh:
                for line in fh:
                    obj = json.loads(line) if line.strip() else {}
                    if "task" in obj:
                        key = (obj["hardware"], int(obj["task"]), obj["alg"], round(obj["fw_ms"], 6), round(obj["bw_ms"], 6))
                        pieces[key] = pieces.get(key, 0) + 1
        pos = 0
        random = ("random", "random_pieces")   # random_pieces: a special shard that drew whole tables only
        for obj in lines:
            if obj.get("kind") in random:
                add(obj["configs"], run, obj["fw_ms"], obj["bw_ms"], "random")
        plan_lines = [obj for obj in lines if obj.get("kind") not in random]
        for ts in summary["sets"]:
            set_name = GPUCHECK_SETS.get(ts["name"].split(" ")[0])
            if set_name is None:
                raise ShardError(f"{summary_name}: unknown task set {ts['name']!r}")
            for p in ts["plans"]:
                if "device_costs_ms" not in p:   # not placed (infeasible)
                    continue
                devs, cost, whole = [], 0.0, True
                for fw, _, _, bw in p["device_costs_ms"]:
                    if not fw > 0:
                        continue
                    key = (ts["hardware"], int(p["task"]), p["alg"], round(fw, 6), round(bw, 6))
                    if pieces.get(key):
                        pieces[key] -= 1
                        whole = False
                        cost = max(cost, fw + bw)
                        continue
                    if pos >= len(plan_lines):
                        raise ShardError(f"{shard_name}: fewer plan shards than the devices of {summary_name}")
                    obj = plan_lines[pos]
                    pos += 1
                    if abs(obj["fw_ms"] - fw) > 1e-6 * max(1.0, fw) or abs(obj["bw_ms"] - bw) > 1e-6 * max(1.0, bw):
                        raise ShardError(f"{shard_name}: plan shard {pos} does not match {summary_name} "
                                         f"({ts['name']} task {p['task']} {p['alg']})")
                    if not all(t.index in task_tables[set_name][p["task"]] for t in obj["configs"]):
                        raise ShardError(f"{shard_name}: plan shard {pos} has tables outside task {p['task']}")
                    devs.append(add(obj["configs"], run, fw, bw, "plan"))
                    cost = max(cost, fw + bw)
                (plans if whole else partial).append({"source": run, "set": set_name, "task": int(p["task"]),
                                                      "alg": p["alg"], "gpu_cost_ms": cost, "shards": devs})
        if pos != len(plan_lines):
            raise ShardError(f"{shard_name}: {len(plan_lines) - pos} plan shards more than the devices of {summary_name}")
    for p in plans + partial:
        for k in p["shards"]:
            shards[k]["tasks"].add((p["set"], p["task"]))
    for s in shards:
        s["fw_ms"] = float(np.mean([m[1] for m in s["measured"]]))
        s["bw_ms"] = float(np.mean([m[2] for m in s["measured"]]))
    runs = ["plans"] + [r[0] for r in GPUCHECK_RUNS[batch]]
    return {"tables": tables, "shards": shards, "plans": plans, "runs": runs}


def measurement_features(meas: dict, batch: int, spec: Mapping, known: Mapping[int, tuple],
                         default_cv: float) -> np.ndarray:
    shards = [s["configs"] for s in meas["shards"]]
    cv = [[known_cv(known, t, default_cv) for t in s] for s in shards]
    ta, shard_of = table_arrays(shards, cv)
    return shard_features(ta, shard_of, len(shards), batch, spec)


def default_cv_of(known: Mapping, tables: Sequence[TableConfig], batch: int) -> float:
    """The lookup-weighted median CV of the known tables (the fallback for unknown tables)."""
    idx = known_index(known)
    pairs = sorted((known_cv(idx, t, float("nan")), batch * t.pooling_factor) for t in tables if t.pooling_factor > 0)
    pairs = [(c, w) for c, w in pairs if c == c]
    if not pairs:
        return 0.7
    total = sum(w for _, w in pairs)
    acc = 0.0
    for c, w in pairs:
        acc += w
        if acc >= total / 2:
            return round(c, 6)
    return round(pairs[-1][0], 6)


# -- held-out fits: a judge that never saw the tables it judges ------------------------------------
class MeasuredLandscape:
    """One batch size's shipped measurements with their features, ready to be refitted on any subset
    of its shards (:meth:`fit`): the distinct shards (a shard measured more than once enters once,
    its measurements averaged), their known-CV feature rows ``X``, measured ``fw``/``bw`` ms and the
    table indices each holds (``tables``)."""

    def __init__(self, batch: int, directory: str | os.PathLike = MEASUREMENTS_DIR, spec: Mapping | None = None,
                 known: Mapping | None = None, default_cv: float | None = None):
        self.batch = int(batch)
        self.spec = dict(spec or DEFAULT_SPEC)
        self.known = known if known is not None else synthetic_length_cv()
        self.meas = load_measurements(self.batch, directory)
        self.default_cv = default_cv if default_cv is not None else default_cv_of(self.known, self.meas["tables"], self.batch)
        self.X = measurement_features(self.meas, self.batch, self.spec, known_index(self.known), self.default_cv)
        self.fw = np.array([s["fw_ms"] for s in self.meas["shards"]])
        self.bw = np.array([s["bw_ms"] for s in self.meas["shards"]])
        self.tables = [frozenset(int(t.index) for t in s["configs"]) for s in self.meas["shards"]]

    def holding(self, tables: "frozenset[int] | set[int]") -> np.ndarray:
        """Mask of the shards that hold at least one of ``tables``."""
        tables = frozenset(tables)
        return np.array([not s.isdisjoint(tables) for s in self.tables], dtype=bool)

    def within(self, tables: "frozenset[int] | set[int]") -> np.ndarray:
        """Mask of the shards made only of ``tables`` (any device a plan of those tables could have)."""
        tables = frozenset(tables)
        return np.array([s <= tables for s in self.tables], dtype=bool)

    def held_out(self, tables: "frozenset[int] | set[int]", rule: str = "tables") -> np.ndarray:
        """Mask of the shards a fit held out on ``tables`` by ``rule`` (:data:`HOLDOUT_RULES`) never sees."""
        if rule not in HOLDOUT_RULES:
            raise ShardError(f"hold-out rule must be one of {', '.join(HOLDOUT_RULES)}, got {rule!r}")
        return self.holding(tables) if rule == "tables" else self.within(tables)

    def fit(self, rows: np.ndarray, ncols: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(fw weights, bw weights) fitted on the shards ``rows`` (a mask or indices), on the first
        ``ncols`` features (default all; the core features come first, see :data:`OPTIONAL_TERMS`)."""
        X = self.X[rows] if ncols is None else self.X[rows][:, :ncols]
        return fit_weights(X, self.fw[rows]), fit_weights(X, self.bw[rows])


@functools.lru_cache(maxsize=None)
def card_domain(card: str) -> Domain:
    """The domain of ``card``'s shipped measurements (every batch's shards; shardcore.oracles.emulated.domain)."""
    return domain_of(card, [t for land in measured_landscapes(card) for s in land.meas["shards"] for t in s["configs"]])


@functools.lru_cache(maxsize=None)
def physical_weights(card: str) -> np.ndarray:
    """``[2, 3]``: per phase (forward, backward) the cost of each byte beyond the measured range on
    :data:`~shardcore.oracles.emulated.domain.PHYSICAL_FEATURES` (the constant and the lookups' bytes
    0): the distinct rows' bytes, read by the forward and read and written back by the backward, at the
    median bandwidth the bandwidth-bound measured shards of ``card`` (over 100 MB of distinct rows)
    achieved above the launch floor (the 1st percentile of the measured costs)."""
    land = measured_landscapes(card)[0]
    return fit_physical_weights([s["configs"] for s in land.meas["shards"]], land.fw, land.bw, land.batch)


@functools.lru_cache(maxsize=4)
def measured_landscapes(card: str = "h200") -> tuple[MeasuredLandscape, ...]:
    """The shipped measurements of ``card``, one :class:`MeasuredLandscape` per batch size (largest
    first), loaded once per process."""
    if card not in MODEL_FILES:
        raise ShardError(f"no emulated GPU {card!r}: choose one of {', '.join(MODEL_FILES)}")
    known = synthetic_length_cv()
    out, default_cv = [], None
    for batch in sorted(SHARD_FILES, reverse=True):
        land = MeasuredLandscape(batch, MEASUREMENTS_DIR, DEFAULT_SPEC, known, default_cv)
        default_cv = land.default_cv
        out.append(land)
    return tuple(out)


def measured_tables(card: str = "h200") -> dict:
    """``{index: (hash size, pooling factor)}`` of the tables the shipped measurements hold (the
    default synthetic dataset's): a table of another dataset is "measured" only when its index, hash
    size (within 2%) and pooling factor (within 15%) match, the rule of :func:`known_cv`."""
    land = measured_landscapes(card)[0]
    return {int(t.index): (float(t.row), float(t.pooling_factor)) for t in land.meas["tables"]}


def judge_pool(size: int, card: str = "h200") -> list[int]:
    """At most ``size`` measured tables that hold the most measured shards (largest batch) entirely:
    shards taken greedily, the one adding the fewest new tables first (ties: file order). Tasks drawn
    from the *other* tables leave a held-out refit (:func:`heldout_model`) at least those shards, where
    300+ random tables would leave it too few to fit (the cluster tasks of ``tools/gen_tasks.py
    --judge-pool``)."""
    land = measured_landscapes(card)[0]
    shards = [frozenset(int(t) for t in s) for s in land.tables]
    holders: dict = {}
    for i, s in enumerate(shards):
        for t in s:
            holders.setdefault(t, []).append(i)
    missing = np.array([len(s) for s in shards], dtype=float)   # tables of each shard not yet in the pool
    pool: set = set()
    while True:
        open_ = np.where(missing > 0, missing, np.inf)
        best = int(np.argmin(open_))                             # the fewest new tables (ties: file order)
        if not np.isfinite(open_[best]) or len(pool) + open_[best] > size:
            return sorted(pool)
        for t in shards[best] - pool:
            pool.add(t)
            missing[holders[t]] -= 1


def seen_tables(tables: Sequence[TableConfig], card: str = "h200") -> frozenset[int]:
    """The indices of ``tables`` that are tables of the shipped measurements (see
    :func:`measured_tables`); only those can have been seen by a fit."""
    ref = measured_tables(card)
    out = set()
    for t in tables:
        r = ref.get(int(t.index))
        if r is None:
            continue
        row, pf = r
        if 0.98 * row <= t.row <= row * 1.0001 and (
                (pf == 0 and t.pooling_factor == 0) or (pf > 0 and abs(t.pooling_factor - pf) <= 0.15 * pf)):
            out.add(int(t.index))
    return frozenset(out)


def _fold_of(tables: frozenset, folds: int) -> int:
    """A fixed split of the shards into ``folds`` parts by their tables, independent of numpy's or
    Python's hash seeds."""
    import zlib

    return zlib.crc32(",".join(str(i) for i in sorted(tables)).encode()) % folds


def _parse_subset(subset: str) -> tuple[int, int] | None:
    """``"all"`` -> None; ``"drop:k/K"`` (leave out fold k of K) -> (k, K)."""
    if subset == "all":
        return None
    try:
        kind, _, frac = subset.partition(":")
        k, folds = (int(v) for v in frac.split("/"))
        if kind == "drop" and folds >= 2 and 0 <= k < folds:
            return k, folds
    except ValueError:
        pass
    raise ShardError(f"held-out subset must be 'all' or 'drop:k/K' (0 <= k < K, K >= 2), got {subset!r}")


# What a held-out fit of a plan with tables T never sees. "tables": every measured shard that holds one of T
# (the judge never saw the plan's tables, the default); "devices": every measured shard made only of T --
# no device that any plan of those tables could have -- while T's tables are seen in shards that mix them
# with other tables, as the learned methods' training oracle saw them (it excludes only the tables of the
# plans it labels, the training tables).
HOLDOUT_RULES = ("tables", "devices")


def _fit_rows(land: MeasuredLandscape, exclude: frozenset, subset: str, rule: str = "tables") -> np.ndarray:
    """The shards a held-out fit uses: those ``rule`` does not hold out for ``exclude``, less the dropped fold."""
    rows = ~land.held_out(exclude, rule)
    drop = _parse_subset(subset)
    if drop is not None:
        rows &= np.array([_fold_of(s, drop[1]) != drop[0] for s in land.tables], dtype=bool)
    return rows


@functools.lru_cache(maxsize=256)
def heldout_model(exclude: frozenset, card: str = "h200", subset: str = "all", rule: str = "tables") -> GpuComputeModel:
    """The emulated ``card`` refitted, exactly as the shipped parameters are fitted, on every measured
    shard that holds none of the tables ``exclude`` (``rule="devices"``: on every measured shard not made
    only of them, see :data:`HOLDOUT_RULES`; ``subset``: ``"all"`` of those shards, or ``"drop:k/K"``:
    without the k-th of K fixed folds of them, a model that is not that judge). Cached per process (a
    fit takes a fraction of a second)."""
    lands = measured_landscapes(card)
    base = read_params(model_path(card))
    # Two shards per weight at least. Where the largest batch's set has too few for the full feature
    # set, the held-out fit keeps the core features only (the optional terms of DEFAULT_SPEC dropped),
    # as a parameter file without them would (a DLRM-100 task's tables leave 133-167 of 2,765 shards).
    spec = dict(base.get("spec") or DEFAULT_SPEC)
    ncols = len(feature_names(spec))
    first = int(_fit_rows(lands[0], exclude, subset, rule).sum())
    if first < 2 * ncols:
        core = {k: v for k, v in spec.items() if k not in OPTIONAL_TERMS}
        if first >= 2 * len(feature_names(core)):
            spec, ncols = core, len(feature_names(core))
    sets = {}
    used = []
    for land in lands:
        rows = _fit_rows(land, exclude, subset, rule)
        if rows.sum() < 2 * ncols:
            if land is lands[0]:
                raise ShardError(f"held-out emulator: only {int(rows.sum())} measured shards at batch {land.batch} "
                                 f"are left without the {len(exclude)} excluded tables' "
                                 f"{'shards' if rule == 'tables' else 'own shards'} (need {2 * ncols})")
            # a smaller batch's set (the launch-bound floor) that cannot be refitted without the excluded
            # tables is left out: above its batch the largest set alone predicts (it binds for ~2% of shards)
            used.append(f"batch {land.batch}: left out ({int(rows.sum())} shards hold none of them)")
            continue
        wf, wb = land.fit(rows, ncols)
        sets[str(land.batch)] = {"shards": int(rows.sum()), "fw": [float(v) for v in wf], "bw": [float(v) for v in wb]}
        used.append(f"batch {land.batch}: {int(rows.sum())} of {len(rows)} shards")
    if ncols < land.X.shape[1]:
        used.append(f"core features only ({ncols})")
    params = dict(base)
    params["spec"] = spec
    params["features"] = feature_names(spec)
    params["sets"] = sets
    which = "holding" if rule == "tables" else "made only of"
    params["fitted_on"] = (f"{base.get('fitted_on', '?')} -- refitted without the shards {which} {len(exclude)} "
                           f"held-out tables ({subset}: {'; '.join(used)})")
    params["heldout"] = {"tables": sorted(exclude), "subset": subset, "rule": rule}
    return GpuComputeModel(params, SHIPPED)


@functools.lru_cache(maxsize=256)
def judge_error(exclude: frozenset, card: str = "h200", pieces: bool = False, rule: str = "tables",
                ndevices: int | None = None):
    """The held-out error of the judge of a plan with tables ``exclude`` (the fit of
    :func:`heldout_model` by ``rule``): measured / predicted fw+bw of every measured plan shard that fit
    never saw (holding one of those tables, or by the "devices" rule made only of them; all such shards
    when fewer than 30 are plan shards), divided by their median (a common scale moves every plan
    alike). Empty when none of them was measured.

    ``pieces=True``: ``(that array, {kind: array})``, for each :data:`PIECE_DEVICE_KINDS` the
    :func:`piece_judge_error` of devices of that kind (each predicted by the judge of its own task by
    the same rule) divided by the same median, so that a bias of the judge on such devices relative to
    whole-table shards stays in it; ``ndevices``: only devices of plans with that many devices, for a kind
    with at least :data:`MIN_BIAS_DEVICES` of them (else all of that kind)."""
    land = measured_landscapes(card)[0]
    held = land.held_out(exclude, rule)
    plan = held & np.array([s["kind"] == "plan" for s in land.meas["shards"]], dtype=bool)
    rows = plan if plan.sum() >= 30 else held
    if not rows.any():
        return (np.zeros(0), {k: np.zeros(0) for k in PIECE_DEVICE_KINDS}) if pieces else np.zeros(0)
    wf, wb = heldout_model(exclude, card, rule=rule).weights[land.batch]
    pred = land.X[rows] @ wf + land.X[rows] @ wb
    ratio = (land.fw[rows] + land.bw[rows]) / pred
    med = float(np.median(ratio))
    if not pieces:
        return ratio / med
    return ratio / med, {k: _piece_pool(k, card, land.batch, rule=rule, ndevices=ndevices) / med
                         for k in PIECE_DEVICE_KINDS}


MIN_BIAS_DEVICES = 20     # piece_bias: measured devices of a kind needed to state the model's bias on it


def _piece_pool(kind: str, card: str, batch: int, exclude: frozenset = frozenset(), rule: str = "tables",
                ndevices: int | None = None) -> np.ndarray:
    """:func:`piece_judge_error` of ``kind``'s devices in plans of ``ndevices`` devices where at least
    :data:`MIN_BIAS_DEVICES` were measured, else of every plan's."""
    r = piece_judge_error(kind, card, batch, exclude, rule=rule, ndevices=ndevices) if ndevices else np.zeros(0)
    return r if len(r) >= MIN_BIAS_DEVICES else piece_judge_error(kind, card, batch, exclude, rule=rule)


def _piece_errors(exclude: frozenset, card: str, batch: int, ndevices: int | None = None) -> dict[str, np.ndarray]:
    """``{kind: ratios}``: the :func:`piece_judge_error` of the measured devices of each
    :data:`PIECE_DEVICE_KINDS` outside the task of tables ``exclude`` (a device whose tables all lie in
    ``exclude`` is that task's own, as in :func:`fit_replica_weights`), for kinds with at least
    :data:`MIN_BIAS_DEVICES` of them. ``ndevices``: those of plans with that many devices where a kind
    has at least :data:`MIN_BIAS_DEVICES` of them, else (another device count, or too few) all of them."""
    out = {}
    for kind in PIECE_DEVICE_KINDS:
        r = _piece_pool(kind, card, batch, exclude, ndevices=ndevices)
        if len(r) >= MIN_BIAS_DEVICES:
            out[kind] = r
    return out


def piece_bias(exclude: frozenset, card: str = "h200", batch: int = 65536,
               ndevices: int | None = None) -> dict[str, float]:
    """``{kind: factor}``: the median of :func:`_piece_errors`: how far the fitted model, unbiased on
    whole-table shards by its least squares, under- (> 1) or over-prices a device holding such pieces.
    On the H200's measured plan devices: with row-wise blocks 1.024, with replicas 0.997; by the plan's
    device count (``ndevices``), replica devices 0.989 in 4-device plans (180 devices) and 1.008 in
    8-device ones (232), the replica law's cost per replica included (without it 0.977 and 1.020: a law
    fitted on both device counts prices a quarter of the batch high and an eighth low)."""
    return {kind: float(np.median(r)) for kind, r in _piece_errors(exclude, card, batch, ndevices).items()}


def piece_spread(exclude: frozenset, card: str = "h200", batch: int = 65536,
                 ndevices: int | None = None) -> dict[str, np.ndarray]:
    """``{kind: ratios}``: :func:`_piece_errors` divided by their median: the fitted model's error on
    such a device once :func:`piece_bias` has corrected its bias (on the H200's plan devices: sd 4.6% on
    devices with replicas, 3.8% with row-wise blocks, against 2.9% on whole-table shards; replica
    devices of 4- and 8-device plans apart, 4.1% and 4.2%)."""
    return {kind: r / float(np.median(r)) for kind, r in _piece_errors(exclude, card, batch, ndevices).items()}


def piece_judge_error(kind: str, card: str = "h200", batch: int = 65536, exclude: frozenset = frozenset(),
                      rule: str = "tables", ndevices: int | None = None) -> np.ndarray:
    """measured / predicted fw+bw of every measured plan device of ``kind`` (:func:`piece_device_kind`:
    holding data-parallel replicas; holding row-wise blocks and no replica; the fitted runs of
    ``tools/gpu_check.py``), each predicted whole (its shard kernel and replica kernel,
    :func:`predict_devices`) by the judge of its own task: :func:`heldout_model` without the task's
    tables, so neither the device's shards nor, in the replica law (:func:`fit_replica_weights`), the
    task's devices were seen (:func:`piece_error_rows`; ``rule="devices"``: by the judge held out by
    that rule, which never saw the task's own devices). Not normalised. ``exclude``: devices whose
    tables all lie in it are left out; ``ndevices``: only devices of plans with that many devices (the
    replica law without its cost per replica priced a 4-device plan's replica device about 2% high and
    an 8-device one 2% low, with it about 1%: docs/oracles.md)."""
    return np.asarray([r for k, tables, r, n in piece_error_rows(card, batch, rule)
                       if k == kind and not (exclude and tables <= exclude)
                       and (ndevices is None or n == ndevices)], dtype=float)


PIECE_ERROR_FILES = {card: c["piece_errors"] for card, c in MANIFEST["cards"].items()}   # tied to the parameter file by digest


@functools.lru_cache(maxsize=None)
def piece_error_rows(card: str = "h200", batch: int = 65536, rule: str = "tables") -> tuple:
    """``(kind, tables, measured / predicted, devices of its plan)`` of every measured plan device holding
    pieces (see :func:`piece_judge_error`). Read from :data:`PIECE_ERROR_FILES` when that file was written
    for the current parameter file (its ``params_sha256``; ``tools/fit_gpu_emulator.py`` writes both) and
    replica law (its ``replica_features``), else
    computed (a held-out refit per measured task: ~15 s on 2 cores; always for ``rule="devices"``)."""
    import hashlib

    name = PIECE_ERROR_FILES.get(card)
    if rule == "tables" and name and (MEASUREMENTS_DIR / name).is_file() and model_path(card).is_file():
        obj = json.loads((MEASUREMENTS_DIR / name).read_text())
        digest = hashlib.sha256(model_path(card).read_bytes()).hexdigest()
        if (obj.get("params_sha256") == digest and int(obj.get("batch", -1)) == int(batch)
                and obj.get("replica_features") == list(REPLICA_FEATURES)
                and all(len(row) == 4 for row in obj["devices"])):
            return tuple((str(k), frozenset(int(i) for i in t), float(r), int(n)) for k, t, r, n in obj["devices"])
    return compute_piece_error_rows(card, batch, rule)


def compute_piece_error_rows(card: str = "h200", batch: int = 65536, rule: str = "tables") -> tuple:
    """:func:`piece_error_rows` computed from the measurements and the current fit."""
    from shardcore.dataset import load_table_configs
    from shardcore.tasks import load_tasks

    devices = [d for d in measured_piece_devices(card, batch) if d[3] is not None]
    if not devices:
        return ()
    tables = load_table_configs(MEASUREMENTS_DIR / f"dlrm_b{batch}" / "table_configs.json")
    tasks = {which: load_tasks(MEASUREMENTS_DIR / TASK_FILES[which], num_tables=len(tables))
             for which in sorted({d[5] for d in devices})}
    out = []
    for pieces, fw, bw, task, n, which in devices:
        kind = piece_device_kind(getattr(t, "kind", "table_wise") for t in pieces)
        if kind is None:
            continue
        judge = heldout_model(frozenset(t.index for t in tasks[which][task].tables(tables)), card, rule=rule)
        pred = float(predict_devices(judge, [list(pieces)], batch)[0].sum())
        out.append((kind, frozenset(t.index for t in pieces), (fw + bw) / pred, int(n)))
    return tuple(out)


def piece_errors_json(card: str = "h200", batch: int = 65536) -> str:
    """The :data:`PIECE_ERROR_FILES` content for the current parameter file (computed afresh)."""
    import hashlib

    rows = compute_piece_error_rows(card, batch)
    return json.dumps({"about": "measured / predicted fw+bw of the measured H200 plan devices holding row-wise "
                                "blocks or data-parallel replicas, each predicted by the held-out judge of its own "
                                "task (shardcore.oracles.emulated.emulator.piece_judge_error), each row [kind, tables, ratio, "
                                "devices of its plan]; written by "
                                "tools/fit_gpu_emulator.py for the parameter file of this digest",
                       "params_sha256": hashlib.sha256(model_path(card).read_bytes()).hexdigest(), "batch": batch,
                       "replica_features": list(REPLICA_FEATURES),
                       "devices": [[k, sorted(t), round(r, 6), n] for k, t, r, n in rows]}) + "\n"


MIN_PLAN_TABLES = 8     # model_error's shards: those of at least this many tables, like a plan's devices


@functools.lru_cache(maxsize=256)
def model_error(exclude: frozenset, card: str = "h200", subset: str = "all", folds: int = 5) -> np.ndarray:
    """The cross-validated error of the fit :func:`heldout_model` ``(exclude, card, subset)`` on its own
    shards (never on a shard that holds an excluded table): measured / predicted fw+bw of each shard
    from a refit without its fold (``folds`` fixed folds), divided by their median. What a planner may
    know of its model's error without looking at the tables it plans."""
    land = measured_landscapes(card)[0]
    idx = np.flatnonzero(_fit_rows(land, exclude, subset))
    X = land.X
    if (folds - 1) * len(idx) // folds < 2 * X.shape[1]:   # too few shards per fold: the core features
        spec = read_params(model_path(card)).get("spec") or DEFAULT_SPEC   # (as heldout_model falls back)
        X = X[:, :len(feature_names({k: v for k, v in spec.items() if k not in OPTIONAL_TERMS}))]
    fold = np.array([_fold_of(land.tables[i] | {-1}, folds) for i in idx])   # a split unlike the subset's
    ratio = np.zeros(len(idx))
    for k in range(folds):
        test = fold == k
        if not test.any() or (~test).sum() < 2 * X.shape[1]:
            continue
        wf, wb = land.fit(idx[~test], X.shape[1])
        pred = X[idx[test]] @ wf + X[idx[test]] @ wb
        ratio[test] = (land.fw[idx[test]] + land.bw[idx[test]]) / pred
    big = np.array([len(land.tables[i]) >= MIN_PLAN_TABLES for i in idx])   # shards shaped like plan devices
    keep = (ratio > 0) & big if ((ratio > 0) & big).sum() >= 30 else ratio > 0
    ratio = ratio[keep]
    return ratio / np.median(ratio) if len(ratio) else ratio


class ShippedMeasurements:
    """The shipped measurements as a compute model's :class:`~shardcore.oracles.emulated.model.MeasuredCard`:
    a shipped card's domain and physical weights, the replica law fitted on its measured devices."""

    def domain(self, card: str) -> Domain | None:
        return card_domain(card) if card in MODEL_FILES else None

    def physical_weights(self, card: str) -> np.ndarray:
        return physical_weights(card)

    def fit_replica_weights(self, model: GpuComputeModel, exclude: frozenset) -> tuple:
        return fit_replica_weights(model, exclude)


SHIPPED = ShippedMeasurements()
