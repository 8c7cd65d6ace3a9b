#!/usr/bin/env python3
"""How well the emulated-GPU compute model predicts real H200 shards and plans it did not see.

Held-out figures from the shipped measurements (data/gpu_measurements/, NVIDIA H200; its manifest.json
names every file and which gpu_check runs enter the fit), the model refitted for every split exactly as
tools/fit_gpu_emulator.py fits it. At batch 65536 the shards of all fitted files (shared plan and random
shards, the fitted gpu_check runs' devices of whole tables and column pieces) enter once per distinct
shard, their measurements averaged; plans come from the shared plans file and from every fitted
gpu_check run (its plans without row-wise or data-parallel pieces), each plan's measured compute cost
being its own run's max device fw+bw.

- shard MAPE of fw, bw and fw+bw, 10-fold cross-validation over distinct shards (fixed permutation,
  seed 0), all shards and per class (shard_classes: the widest table's dim <= 16 / 17-64 / >= 128,
  plan / random shards, random shards of 1-5 / >= 6 tables, random shards <= 16 / >= 32 wide), with
  known and with unknown CV;
- leave one task out: each of the 20 test tasks fitted without any shard of that task's plans (of
  every run; the task's tables may still occur in other tasks' and random shards): the held-out
  shards' MAPE, and per plan source the within-task Spearman rank correlation between the predicted
  plan cost (max over the plan's devices of predicted fw+bw) and the measured one (mean, min,
  tasks with rho >= 0.9) and the plan-cost MAPE;
- continuity: fitted on the original files only (shared plan + random shards), tested on the gpu_check
  runs' shards not in those files and on their plans;
- "unknown CV": the same predictions when the bag-length CV of every table is unknown (what any
  dataset other than the default synthetic one gets: its effect averaged over the spec's cv_prior);
- batch 4096: its own parameter set held out the same way, and the batch-65536 set extrapolated;
- the judged plans: every plan of the gpu_check runs whose plans are shipped (the manifest's runs with
  ``plans``: shardkit's beside the anchors'), re-scored whole (compute and the modelled all-to-alls, as
  measured) by the emulated H200 with its held-out judge, against its measured cost: per run, set and
  planner the means and the mean signed and absolute error -- how kind the judge is to each planner;
- what the held-out judge lacks: the whole-table plan devices of the runs in no fit, predicted by each
  task's judge, by it on the core features only, refitted on a random half and quarter of its shards, and
  by the full fit (which has seen the tables in the fitted runs): the judge's error against the data it is
  fitted on.

Held-out rows evaluate one batch's own parameter set alone; the "shipped fit, in-sample" rows use
the shipped model as the oracle does (the larger of the two sets' predictions, see
shardcore/oracles/emulated/emulator.py).

  python tools/emulator_accuracy.py [--out accuracy.json]
"""

import dataclasses
import math
import os


import numpy as np

from shardcore import io
from shardcore.cli.common import check_out_file, make_parser, run_main
from shardcore.evaluation.report import spearman
from shardcore.dataset import load_table_configs
from shardcore.oracles.emulated.emulator import (DEFAULT_SPEC, MANIFEST, MEASUREMENTS_DIR, GpuComputeModel, default_cv_of,
                                fit_weights, known_index, load_measurements, measurement_features,
                                read_params, model_path, synthetic_length_cv)
from shardcore.errors import ShardError
from shardcore.evaluation.report import format_table

CARD_LINE = "NVIDIA H200, measured (data/gpu_measurements/)"
KFOLD = 10


def mape(pred, true) -> float:
    pred, true = np.asarray(pred, float), np.asarray(true, float)
    return float(np.mean(np.abs(pred - true) / true) * 100)


class Landscape:
    """One batch size's measurements (distinct shards, their measurements averaged) with their
    features (known CV, and unknown CV)."""

    def __init__(self, batch: int, directory, spec, known, default_cv):
        self.batch = batch
        self.meas = load_measurements(batch, directory)
        self.X = measurement_features(self.meas, batch, spec, known_index(known), default_cv)
        # unknown CV: every table's CV NaN, its effect averaged over the spec's cv_prior (the model's
        # treatment of a table it does not know; the default CV where the spec has no prior); the tables'
        # own length_cv hidden too (the shipped configs carry the generator's)
        blind = {**self.meas, "shards": [{**s, "configs": [dataclasses.replace(t, length_cv=None) for t in s["configs"]]}
                                         for s in self.meas["shards"]]}
        self.X_unknown = measurement_features(blind, batch, spec, {},
                                              math.nan if spec.get("cv_prior") else default_cv)
        self.fw = np.array([s["fw_ms"] for s in self.meas["shards"]])
        self.bw = np.array([s["bw_ms"] for s in self.meas["shards"]])
        self.kind = np.array([s["kind"] for s in self.meas["shards"]])
        self.maxdim = np.array([max(t.dim for t in s["configs"]) for s in self.meas["shards"]])
        self.ntables = np.array([len(s["configs"]) for s in self.meas["shards"]])
        self.runs = [set(m[0] for m in s["measured"]) for s in self.meas["shards"]]
        self.tasks = sorted({(p["set"], p["task"]) for p in self.meas["plans"]})
        self.sources = [r for r in self.meas["runs"] if any(p["source"] == r for p in self.meas["plans"])]

    def fit(self, rows):
        return fit_weights(self.X[rows], self.fw[rows]), fit_weights(self.X[rows], self.bw[rows])

    def kfold(self, X=None):
        """Held-out (fw, bw) predictions of every distinct shard, 10-fold (fixed permutation)."""
        X = self.X if X is None else X
        n = len(self.fw)
        fold = np.random.default_rng(0).permutation(n) % KFOLD
        pred = np.zeros((n, 2))
        for k in range(KFOLD):
            wf, wb = self.fit(fold != k)
            pred[fold == k, 0] = X[fold == k] @ wf
            pred[fold == k, 1] = X[fold == k] @ wb
        return pred

    def leave_task_out(self, X=None):
        """Per task: the model fitted without any shard of that task's plans (of every source),
        the held-out (fw, bw) predictions of those shards: ``{task: (shard indices, [n, 2])}``."""
        X = self.X if X is None else X
        out = {}
        for key in self.tasks:
            held = np.array([key in s["tasks"] for s in self.meas["shards"]])
            wf, wb = self.fit(~held)
            out[key] = (np.flatnonzero(held), np.stack([X[held] @ wf, X[held] @ wb], 1))
        return out

    def plan_scores(self, source, shard_cost):
        """Within-task Spearman of the predicted plan costs (max device of ``shard_cost(task)``,
        a dict shard index -> predicted fw+bw) against ``source``'s measured plan costs."""
        rhos, pred, meas = [], [], []
        for key in self.tasks:
            plans = [p for p in self.meas["plans"] if p["source"] == source and (p["set"], p["task"]) == key]
            if not plans:
                continue
            cost = shard_cost(key)
            pp = [max(cost[k] for k in p["shards"]) for p in plans]
            mp = [p["gpu_cost_ms"] for p in plans]
            rhos.append(spearman(pp, mp))
            pred += pp
            meas += mp
        return rhos, mape(pred, meas), len(pred)


# classes of shards (each reported where it has shards): by the widest table's dim (the fused kernel's
# thread layout follows it), measured as a plan's device or as a random shard, and random shards by size
# (1-5 tables: 0.15-0.7 ms, near the launch floor, measured with 7-10 iterations)
def shard_classes(land) -> list[tuple[str, np.ndarray]]:
    r = land.kind == "random"
    return [("widest dim <= 16", land.maxdim <= 16), ("widest dim 17-64", (land.maxdim > 16) & (land.maxdim < 128)),
            ("widest dim >= 128", land.maxdim >= 128), ("plan shards", ~r), ("random shards", r),
            ("random, 1-5 tables", r & (land.ntables <= 5)), ("random, >= 6 tables", r & (land.ntables >= 6)),
            ("random, widest dim <= 16", r & (land.maxdim <= 16)), ("random, widest dim >= 32", r & (land.maxdim >= 32))]


def class_slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_").replace("__", "_")


def shard_row(name, pred, fw, bw):
    return [name, len(fw), f"{mape(pred[:, 0], fw):.2f}", f"{mape(pred[:, 1], bw):.2f}",
            f"{mape(pred[:, 0] + pred[:, 1], fw + bw):.2f}"]


def _mapes(pred, fw, bw) -> dict:
    return {"fw": mape(pred[:, 0], fw), "bw": mape(pred[:, 1], bw), "fw+bw": mape(pred.sum(1), fw + bw)}


def _plan_row(res, name, land, source, rhos, plan_mape, nplans):
    algs = len({p["alg"] for p in land.meas["plans"] if p["source"] == source})
    res["plan_rows"].append([name, f"{source} ({algs} algs)", len(rhos), nplans, f"{np.nanmean(rhos):.3f}",
                             f"{np.nanmin(rhos):.3f}", sum(1 for r in rhos if r >= 0.9), f"{plan_mape:.2f}"])
    return {"mean": float(np.nanmean(rhos)), "min": float(np.nanmin(rhos)), "plans": nplans,
            "tasks_ge_0.9": sum(1 for r in rhos if r >= 0.9), "plan_mape": plan_mape,
            "per_task": [float(r) for r in rhos]}


def piece_rows(res: dict, directory=MEASUREMENTS_DIR) -> None:
    """(d) the devices with row-wise blocks or data-parallel replicas (the fitted runs' pieces): each predicted
    by a judge that never saw its tables (row-wise) or its own task (replicas: every measured replica
    device shares tables with nearly every task; the replica factor is refitted without the task)."""
    import json

    from shardcore.oracles.emulated.emulator import PIECE_FILES, heldout_model, piece_of, predict_devices

    tables = load_table_configs(os.path.join(directory, "dlrm_b65536", "table_configs.json"))
    tasks = []
    for name in ("dlrm_tasks_50_test.txt", "dlrm_tasks_100_test.txt"):
        with open(os.path.join(directory, "tasks", name)) as fh:
            tasks += [frozenset(int(v) for v in line.split()[0].split(",")) for line in fh if line.strip()]
    rows: dict[str, list] = {"data-parallel": [], "row-wise": []}
    for fname in PIECE_FILES[65536]:
        path = os.path.join(directory, fname)
        if not os.path.isfile(path):
            continue
        with open(path) as fh:
            for k, line in enumerate(fh, 1):
                obj = json.loads(line)
                pieces = [piece_of(p, tables, f"{fname}:{k}") for p in obj["pieces"]]
                ids = frozenset(t.index for t in pieces)
                dp = any(getattr(t, "kind", None) == "data_parallel" for t in pieces)
                own = [t for t in tasks if ids <= t] if dp else []
                judge = heldout_model(own[0] if own else ids)
                pred = predict_devices(judge, [pieces], 65536)[0]
                rows["data-parallel" if dp else "row-wise"].append((pred, obj["fw_ms"], obj["bw_ms"]))
    for cls, got in rows.items():
        if not got:
            continue
        pred = np.array([g[0] for g in got])
        fw, bw = np.array([g[1] for g in got]), np.array([g[2] for g in got])
        held = "task held out" if cls == "data-parallel" else "tables held out"
        res["shard_rows"].append(shard_row(f"b65536 devices with {cls} pieces, {held}", pred, fw, bw))
        res["figures"][f"b65536_pieces_{class_slug(cls)}"] = _mapes(pred, fw, bw)


# random row-block / replica devices measured at several batch slices (gpu_check --special-shards): every
# run's pieces file that holds such devices (those of a fitted run are in the replica law's fit, the others not)
SLICE_RUNS = tuple((r["name"], r["pieces"]) for r in MANIFEST["runs"] if r.get("pieces"))


def slice_rows(res: dict, directory=MEASUREMENTS_DIR, runs=SLICE_RUNS) -> None:
    """(d') the random devices with data-parallel replicas of ``runs``, by the replicas' batch slice, each
    predicted by the judge held out by its tables (its own device left out of the replica law's fit too):
    how the replica law carries to slices it was not fitted at."""
    import json

    from shardcore.oracles.emulated.emulator import heldout_model, piece_of, predict_devices

    tables = load_table_configs(os.path.join(directory, "dlrm_b65536", "table_configs.json"))
    for run, fname in runs:
        path = os.path.join(directory, fname)
        if not os.path.isfile(path):
            continue
        by_slice: dict[int, list] = {}
        with open(path) as fh:
            for k, line in enumerate(fh, 1):
                obj = json.loads(line)
                if obj.get("kind") != "random_pieces":
                    continue
                pieces = [piece_of(p, tables, f"{fname}:{k}") for p in obj["pieces"]]
                parts = {t.batch_part for t in pieces if getattr(t, "kind", None) == "data_parallel"}
                if not parts:
                    continue
                judge = heldout_model(frozenset(t.index for t in pieces))
                by_slice.setdefault(next(iter(parts))[1], []).append(
                    (predict_devices(judge, [pieces], 65536)[0], obj["fw_ms"], obj["bw_ms"]))
        for n, got in sorted(by_slice.items()):
            pred = np.array([g[0] for g in got])
            fw, bw = np.array([g[1] for g in got]), np.array([g[2] for g in got])
            ratio = float(np.median((fw + bw) / pred.sum(1)))
            res["shard_rows"].append(shard_row(f"b65536 random replica devices, slice 1/{n} ({run}), tables held out; "
                                               f"median measured/predicted {ratio:.3f}", pred, fw, bw))
            res["figures"][f"b65536_random_replicas_slice{n}_{run}"] = {**_mapes(pred, fw, bw), "median_ratio": ratio,
                                                                        "devices": len(got)}


# gpu_check runs whose plans are shipped: (summary, {set name: the eval.py --out plans file}, the summary of
# a run that measured some of its plans again on a machine of the same speed, or None: such a plan counts at
# the lower of its two costs, as tools/shardkit_compare.py --repeat counts it)
JUDGED_RUNS = tuple((r["summary"], dict(r["plans"]),
                     next((q["summary"] for q in MANIFEST["runs"] if q["name"] == r.get("repeat")), None))
                    for r in MANIFEST["runs"] if r.get("plans"))


def judged_plan_rows(res: dict, directory=MEASUREMENTS_DIR, runs=JUDGED_RUNS) -> None:
    """(e) every measured plan of ``runs`` re-scored by the emulated H200's held-out judges (held out by
    the plan's tables, ``--oracle emulated:h200``'s default, and by its devices, ``--emulator-fit
    devices``), plan cost against plan cost; and the stressed judge's expected slowest device of the same
    plans (tools/shardkit_compare.py's, its default pools; "-" where the records carry no table ids)."""
    import json

    from shardcore.oracles.emulated.emulator import GPUCHECK_SETS, TASK_FILES
    from shardcore.oracles.factory import open_oracle
    from shardcore.evaluation.compare import record_plan
    from shardcore.tasks import load_tasks
    from tools.shardkit_compare import apply_repeat, gpu_check_sets, gpu_set_name, stressed_costs

    data = os.path.join(directory, "dlrm_b65536")
    tables = load_table_configs(os.path.join(data, "table_configs.json"))
    for summary_name, plan_files, repeat in runs:
        if not os.path.isfile(os.path.join(directory, summary_name)):
            continue
        with open(os.path.join(directory, summary_name)) as fh:
            summary = json.load(fh)
        again = {}
        if repeat and os.path.isfile(os.path.join(directory, repeat)):
            again = {gpu_set_name(label): recs for label, recs, _ in gpu_check_sets(os.path.join(directory, repeat))}
        for ts in summary["sets"]:
            plans = [p for p in ts["plans"] if p.get("cost_ms") is not None]
            if ts["name"] in again:
                plans = apply_repeat(ts["name"], plans, repeat, again[ts["name"]])[0]
            name = ts["name"].split(" ")[0]
            tasks = load_tasks(os.path.join(directory, TASK_FILES[GPUCHECK_SETS[name]]), num_tables=len(tables))
            lines = io.read_maybe_gzipped(os.path.join(directory, plan_files[name])).decode("utf-8").splitlines()
            records = {(r["task"], r["alg"]): r for r in map(json.loads, filter(str.strip, lines))}
            got: dict[str, list] = {}
            judged: dict[str, dict] = {}   # alg -> task -> the record with the current judge's device costs
            with open_oracle(data, int(ts["ndevices"]), oracle="emulated:h200") as judge, \
                    open_oracle(data, int(ts["ndevices"]), oracle="emulated:h200", emulator_fit="devices") as by_devices:
                for p in plans:
                    rec = records.get((p["task"], p["alg"]))
                    if rec is None:   # planned on the GPU machine (no record here)
                        continue
                    task = tasks[p["task"]].tables(tables)
                    shards = record_plan(rec, task).device_pieces
                    now = judge.evaluate(shards)
                    got.setdefault(p["alg"], []).append((p["cost_ms"], now.cost_ms, by_devices.evaluate(shards).cost_ms))
                    judged.setdefault(p["alg"], {})[p["task"]] = {**rec, "device_costs_ms": now.device_costs_ms}
            run = summary_name.split("_")[1]
            for alg, pairs in got.items():
                m, j, jd = np.array(pairs).T
                err, errd = 100.0 * (j / m - 1.0), 100.0 * (jd / m - 1.0)
                order = [p["task"] for p in plans if p["alg"] == alg and (p["task"], alg) in records]
                try:
                    st = stressed_costs(judged, [alg], order, tables, 1000)
                except ShardError:   # records written before they carried their tables' ids
                    st = None
                js = np.array([st[alg][t] for t in order]) if st else None
                errs = 100.0 * (js / m - 1.0) if js is not None else None
                label = alg.split("/")[-2] if alg.endswith(".pt") else alg
                res["judged_rows"].append([f"{run} {name}", label, len(m), f"{m.mean():.3f}", f"{j.mean():.3f}",
                                           f"{err.mean():+.1f}", f"{np.abs(err).mean():.1f}", f"{jd.mean():.3f}",
                                           f"{errd.mean():+.1f}", f"{np.abs(errd).mean():.1f}",
                                           f"{js.mean():.3f}" if js is not None else "-",
                                           f"{errs.mean():+.1f}" if errs is not None else "-"])
                res["figures"][f"judged_{run}_{name}_{label}"] = {"plans": len(m), "measured_ms": float(m.mean()),
                                                                   "judge_ms": float(j.mean()), "bias_pct": float(err.mean()),
                                                                   "mape_pct": float(np.abs(err).mean()),
                                                                   "devices_judge_ms": float(jd.mean()),
                                                                   "devices_bias_pct": float(errd.mean()),
                                                                   "devices_mape_pct": float(np.abs(errd).mean()),
                                                                   "stressed_judge_ms": float(js.mean()) if js is not None else None,
                                                                   "stressed_bias_pct": float(errs.mean()) if errs is not None else None}


# gpu_check runs in no fit (their whole-table plan devices test the judges on devices none of them saw)
UNSEEN_SHARD_FILES = tuple(r["shards"] for r in MANIFEST["runs"] if not r["in_fit"])


def unseen_device_rows(res: dict, directory=MEASUREMENTS_DIR, files=UNSEEN_SHARD_FILES, draws: int = 3) -> None:
    """(f) what the held-out judge lacks: the whole-table plan devices of ``files`` (measured on an H200,
    in no fit), each predicted (fw+bw) by the judge of its own task -- held out by the task's tables, as
    shipped; on the core features only; refitted on a random half and quarter of its shards (``draws``
    draws each); and by the full fit, which has seen the task's tables in the fitted runs' shards though never
    these devices. Per set: the devices' mean and spread of log(measured / predicted)."""
    from shardcore.oracles.emulated.emulator import (GPUCHECK_SETS, OPTIONAL_TERMS, TASK_FILES, MeasuredLandscape,
                                                     feature_names, line_task_set, read_shard_lines)
    from shardcore.tasks import load_tasks

    land = MeasuredLandscape(65536, directory)
    tables = land.meas["tables"]
    nfull = land.X.shape[1]
    ncore = len(feature_names({k: v for k, v in land.spec.items() if k not in OPTIONAL_TERMS}))
    by_set: dict[str, list] = {}
    for fname in files:
        path = os.path.join(directory, fname)
        if not os.path.isfile(path):
            continue
        for k, obj in enumerate(read_shard_lines(path, tables, allow_wider=True), 1):
            if "task" in obj:
                by_set.setdefault(line_task_set(obj, f"{fname}:{k}"), []).append(obj)
    if not by_set:
        return
    known = known_index(land.known)
    for which, objs in sorted(by_set.items()):
        tasks = load_tasks(os.path.join(directory, TASK_FILES[which]), num_tables=len(tables))
        errs: dict[str, list] = {}
        fitted: dict[str, list] = {}
        ndev = 0
        for ti, task in enumerate(tasks):
            mine = [o for o in objs if o["task"] == ti]
            if not mine:
                continue
            ndev += len(mine)
            X = measurement_features({"shards": [{"configs": o["configs"]} for o in mine]}, 65536, land.spec, known,
                                     land.default_cv)
            meas = np.array([o["fw_ms"] + o["bw_ms"] for o in mine])
            rows = np.flatnonzero(~land.holding(frozenset(t.index for t in task.tables(tables))))
            rng = np.random.default_rng(ti)
            fits = [("held out by the task's tables (the judge)", rows, None),
                    ("the same, core features only", rows, ncore)]
            for frac in (0.5, 0.25):
                fits += [(f"the same, a random {frac:g} of its shards", rng.choice(rows, int(frac * len(rows)), replace=False),
                          None) for _ in range(draws)]
            fits.append(("the full fit (has seen the tables, not these devices)", np.arange(len(land.fw)), nfull))
            for label, r, nc in fits:
                nc = nc or (nfull if len(r) >= 2 * nfull else ncore)   # heldout_model's rule
                wf, wb = land.fit(r, nc)
                errs.setdefault(label, []).extend(np.log(meas / (X[:, :nc] @ wf + X[:, :nc] @ wb)).tolist())
                fitted.setdefault(label, []).append(len(r))
        for label, e in errs.items():
            e = np.asarray(e)
            ape = np.abs(np.exp(e - np.median(e)) - 1.0)
            set_name = next(k for k, v in GPUCHECK_SETS.items() if v == which)
            res["unseen_rows"].append([set_name, label, ndev, f"{np.mean(fitted[label]):.0f}", f"{100 * e.mean():+.2f}",
                                       f"{100 * e.std():.2f}", f"{100 * ape.mean():.2f}"])
            res["figures"][f"unseen_{which}_{label}"] = {"shards_fitted": float(np.mean(fitted[label])),
                                                         "bias_pct": float(100 * e.mean()), "sd_pct": float(100 * e.std()),
                                                         "mape_pct": float(100 * ape.mean())}


def evaluate(directory=MEASUREMENTS_DIR, params_path=None, unknown_cv=True) -> dict:
    """Every figure of the report, as a dict (rows of the printed tables included)."""
    model = GpuComputeModel(read_params(params_path or model_path("h200")))   # a bad file stops it first
    spec = dict(DEFAULT_SPEC)
    known = synthetic_length_cv()
    default_cv = default_cv_of(known, load_table_configs(os.path.join(directory, "dlrm_b65536", "table_configs.json")), 65536)
    big = Landscape(65536, directory, spec, known, default_cv)
    small = Landscape(4096, directory, spec, known, default_cv)
    res = {"card": CARD_LINE, "shard_rows": [], "plan_rows": [], "judged_rows": [], "unseen_rows": [], "figures": {}}
    fig = res["figures"]

    for land, label in ((big, "b65536"), (small, "b4096")):
        variants = (("", land.X), (" unknown CV", land.X_unknown)) if unknown_cv else (("", land.X),)
        for xname, X in variants:
            tag = xname.replace(" ", "_")
            # (a) 10-fold over the distinct shards
            pred = land.kfold(X)
            res["shard_rows"].append(shard_row(f"{label} 10-fold, all shards{xname}", pred, land.fw, land.bw))
            fig[f"{label}_kfold{tag}"] = _mapes(pred, land.fw, land.bw)
            for cname, sel in shard_classes(land):
                if not sel.any() or sel.all():
                    continue
                res["shard_rows"].append(shard_row(f"{label} 10-fold, {cname}{xname}", pred[sel], land.fw[sel], land.bw[sel]))
                fig[f"{label}_kfold{tag}_{class_slug(cname)}"] = _mapes(pred[sel], land.fw[sel], land.bw[sel])
            if xname == "" and (land.kind == "random").any():    # the names of earlier reports
                for kind in ("plan", "random"):
                    sel = land.kind == kind
                    fig[f"{label}_kfold_{kind}"] = _mapes(pred[sel], land.fw[sel], land.bw[sel])
            # (b) leave one task out
            lto = land.leave_task_out(X)
            idx = np.concatenate([i for i, _ in lto.values()])
            pt = np.concatenate([p for _, p in lto.values()])
            res["shard_rows"].append(shard_row(f"{label} task held out, plan shards{xname}", pt, land.fw[idx], land.bw[idx]))
            fig[f"{label}_by_task{tag}"] = _mapes(pt, land.fw[idx], land.bw[idx])
            costs = {key: dict(zip(i.tolist(), p.sum(1).tolist())) for key, (i, p) in lto.items()}
            for source in land.sources:
                rhos, pm, n = land.plan_scores(source, lambda key: costs[key])
                fig[f"{label}_spearman_{source}{tag}"] = _plan_row(res, f"{label} task held out{xname}", land, source, rhos, pm, n)

    # (c) continuity: fitted on the original files only (shared plans + random shards), tested on the
    # gpu_check runs' shards and plans (shards also in the original files left out of the shard MAPE)
    orig = np.array(["plans" in r for r in big.runs])
    wf, wb = big.fit(orig)
    pred = np.stack([big.X @ wf, big.X @ wb], 1)
    new = ~orig
    res["shard_rows"].append(shard_row("b65536 original files only -> new runs' other shards", pred[new], big.fw[new], big.bw[new]))
    fig["b65536_original_only_new_shards"] = _mapes(pred[new], big.fw[new], big.bw[new])
    allcost = dict(enumerate(pred.sum(1).tolist()))
    for source in big.sources:
        if source == "plans":
            continue
        rhos, pm, n = big.plan_scores(source, lambda key: allcost)
        fig[f"b65536_original_only_spearman_{source}"] = _plan_row(res, "b65536 original files only", big, source, rhos, pm, n)

    piece_rows(res, directory)
    slice_rows(res, directory)
    judged_plan_rows(res, directory)
    unseen_device_rows(res, directory)

    # the shipped parameters: in-sample, and batch 65536's set extrapolated to batch 4096
    for land, label in ((big, "b65536"), (small, "b4096")):
        pred = model.predict_many([s["configs"] for s in land.meas["shards"]], land.batch)
        res["shard_rows"].append(shard_row(f"{label} shipped fit, in-sample", pred, land.fw, land.bw))
        fig[f"{label}_in_sample"] = _mapes(pred, land.fw, land.bw)
    wf, wb = model.weights[65536]
    pred = np.stack([small.X @ wf, small.X @ wb], 1)
    res["shard_rows"].append(shard_row("b4096 by the b65536 set (extrapolated)", pred, small.fw, small.bw))
    fig["b4096_extrapolated"] = _mapes(pred, small.fw, small.bw)
    allcost = dict(enumerate(pred.sum(1).tolist()))
    rhos, pm, n = small.plan_scores("plans", lambda key: allcost)
    fig["b4096_extrapolated_spearman"] = _plan_row(res, "b4096 by the b65536 set (extrapolated)", small, "plans", rhos, pm, n)
    return res


def main(argv=None):
    p = make_parser(__doc__)
    p.add_argument("--measurements", default=str(MEASUREMENTS_DIR), metavar="DIR",
                   help="folder with the measured shards, plans, table configs and tasks (default %(default)s)")
    p.add_argument("--params", default=None, metavar="FILE",
                   help="parameter file for the in-sample rows (default the shipped h200_emulator.json)")
    p.add_argument("--out", default=None, metavar="FILE", help="also write every figure as JSON (atomically)")
    args = p.parse_args(argv)
    check_out_file(args, args.out)   # before the figures are computed; never --params nor a measurement file
    if not os.path.isdir(args.measurements):
        raise ShardError(f"measurement folder not found: {args.measurements}")
    res = evaluate(args.measurements, args.params)
    print(f"Emulated-GPU compute model vs real shards ({CARD_LINE}); MAPE in %")
    print(format_table(["split", "shards", "fw", "bw", "fw+bw"], res["shard_rows"]))
    print()
    print(f"Plans: within-task Spearman of predicted vs measured GPU plan compute cost (max device fw+bw), "
          f"{CARD_LINE}")
    print(format_table(["split", "plans of", "tasks", "plans", "mean rho", "min rho", "tasks rho>=0.9", "plan MAPE %"],
                       res["plan_rows"]))
    if res["judged_rows"]:
        print()
        print(f"Plans re-scored whole (compute + modelled all-to-alls) by the emulated judges vs measured on the GPU, "
              f"{CARD_LINE}; error = judge / measured - 1; the judge held out by tables (the default) and by "
              f"devices (--emulator-fit devices), and the stressed judge's expected slowest device (tools/shardkit_compare.py's, "
              f"1000 draws, its pools per device count); a run measured again by another counts each plan "
              f"at the lower of its two costs")
        print(format_table(["run, set", "planner", "plans", "measured ms", "judge ms", "mean error %", "MAPE %",
                            "devices judge ms", "its mean error %", "its MAPE %", "stressed judge ms",
                            "its mean error %"], res["judged_rows"]))
    if res["unseen_rows"]:
        print()
        print("What the held-out judge lacks: the whole-table plan devices of the runs in no fit (NVIDIA H200), "
              "each predicted by fits for its own task; error = log(measured / predicted), in %; MAPE after "
              "the median (the machine's factor) is taken out")
        print(format_table(["set", "fit", "devices", "shards fitted", "mean error %", "sd %", "MAPE %"], res["unseen_rows"]))
    if args.out:
        io.write_json(args.out, {"card": res["card"], "figures": res["figures"]})
        print(f"wrote {args.out}")


if __name__ == "__main__":
    run_main(main)
