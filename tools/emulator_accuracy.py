#!/usr/bin/env python3
"""How well the emulated-GPU compute model predicts real H200 shards and plans it did not see.

Held-out figures from the shipped measurements (data/gpu_measurements/, NVIDIA H200, measured
2026-11-26), the model refitted for every split exactly as tools/fit_gpu_emulator.py fits it:

- shard MAPE of fw, bw and fw+bw, 10-fold cross-validation over shards (fixed permutation, seed 0);
- the same with whole tasks held out (each of the 20 test tasks: fitted without any shard of that
  task's plans; the task's tables may still occur in other tasks' shards);
- within-task Spearman rank correlation between the predicted plan cost (max over the plan's
  devices of predicted fw+bw) and the measured GPU plan cost, task held out, averaged over tasks;
- "unknown CV": the same predictions when the bag-length CV of every table is unknown (the
  fallback any dataset other than the default synthetic one gets);
- batch 4096: its own parameter set held out the same way, and the batch-65536 set extrapolated.

Held-out rows evaluate one batch's own parameter set alone; the "shipped fit, in-sample" rows use
the shipped model as the oracle does (the larger of the two sets' predictions, see
shardcore/emulator.py).

  python tools/emulator_accuracy.py [--out accuracy.json]
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

from shardcore import io  # noqa: E402
from shardcore.cli import make_parser, run_main  # noqa: E402
from shardcore.dataset import load_table_configs  # noqa: E402
from shardcore.emulator import (DEFAULT_SPEC, MEASUREMENTS_DIR, GpuComputeModel, default_cv_of,  # noqa: E402
                                fit_weights, known_index, load_measurements, measurement_features,
                                read_params, model_path, synthetic_length_cv)
from shardcore.errors import ShardError  # noqa: E402
from shardcore.report import format_table  # noqa: E402

CARD_LINE = "NVIDIA H200, measured 2026-11-26"
KFOLD = 10


def mape(pred, true) -> float:
    pred, true = np.asarray(pred, float), np.asarray(true, float)
    return float(np.mean(np.abs(pred - true) / true) * 100)


def spearman(a, b) -> float:
    def ranks(x):
        x = np.asarray(x, float)
        order = np.argsort(x, kind="mergesort")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=float)
        for v in np.unique(x):  # ties: mean rank
            m = x == v
            r[m] = r[m].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


class Landscape:
    """One batch size's measurements with their features (known CV, and unknown CV)."""

    def __init__(self, batch: int, directory, spec, known, default_cv):
        self.batch = batch
        self.meas = load_measurements(batch, directory)
        self.X = measurement_features(self.meas, batch, spec, known_index(known), default_cv)
        self.X_unknown = measurement_features(self.meas, batch, spec, {}, default_cv)
        self.fw = np.array([s["fw_ms"] for s in self.meas["shards"]])
        self.bw = np.array([s["bw_ms"] for s in self.meas["shards"]])
        self.kind = np.array([s["kind"] for s in self.meas["shards"]])
        self.tasks = sorted({(p["set"], p["task"]) for p in self.meas["plans"]})

    def fit(self, rows):
        return fit_weights(self.X[rows], self.fw[rows]), fit_weights(self.X[rows], self.bw[rows])

    def kfold(self, X=None):
        """Held-out (fw, bw) predictions of every shard, 10-fold."""
        X = self.X if X is None else X
        n = len(self.fw)
        fold = np.random.default_rng(0).permutation(n) % KFOLD
        pred = np.zeros((n, 2))
        for k in range(KFOLD):
            wf, wb = self.fit(fold != k)
            pred[fold == k, 0] = X[fold == k] @ wf
            pred[fold == k, 1] = X[fold == k] @ wb
        return pred

    def by_task(self, X=None):
        """Per held-out task: its shards' (index, fw, bw predictions) and its plans' (predicted,
        measured) costs."""
        X = self.X if X is None else X
        out = []
        for key in self.tasks:
            held = np.array([key in s["tasks"] for s in self.meas["shards"]])
            wf, wb = self.fit(~held)
            pf, pb = X @ wf, X @ wb
            plans = [p for p in self.meas["plans"] if (p["set"], p["task"]) == key]
            pred_plan = [max(pf[k] + pb[k] for k in p["shards"]) for p in plans]
            out.append({"task": key, "shards": np.flatnonzero(held), "pf": pf[held], "pb": pb[held],
                        "pred_plan": pred_plan, "meas_plan": [p["gpu_cost_ms"] for p in plans]})
        return out


def shard_row(name, pred, fw, bw):
    return [name, len(fw), f"{mape(pred[:, 0], fw):.2f}", f"{mape(pred[:, 1], bw):.2f}",
            f"{mape(pred[:, 0] + pred[:, 1], fw + bw):.2f}"]


def evaluate(directory=MEASUREMENTS_DIR, params_path=None) -> dict:
    """Every figure of the report, as a dict (rows of the printed tables included)."""
    spec = dict(DEFAULT_SPEC)
    known = synthetic_length_cv()
    default_cv = default_cv_of(known, load_table_configs(os.path.join(directory, "dlrm_b65536", "table_configs.json")), 65536)
    big = Landscape(65536, directory, spec, known, default_cv)
    small = Landscape(4096, directory, spec, known, default_cv)
    res = {"card": CARD_LINE, "shard_rows": [], "plan_rows": [], "figures": {}}
    fig = res["figures"]

    for land, label in ((big, "b65536"), (small, "b4096")):
        for xname, X in (("", land.X), (" unknown CV", land.X_unknown)):
            pred = land.kfold(X)
            res["shard_rows"].append(shard_row(f"{label} 10-fold, all shards{xname}", pred, land.fw, land.bw))
            fig[f"{label}_kfold{xname.replace(' ', '_')}"] = {
                "fw": mape(pred[:, 0], land.fw), "bw": mape(pred[:, 1], land.bw),
                "fw+bw": mape(pred.sum(1), land.fw + land.bw)}
            if xname == "" and (land.kind == "random").any():
                for kind in ("plan", "random"):
                    sel = land.kind == kind
                    res["shard_rows"].append(shard_row(f"{label} 10-fold, {kind} shards", pred[sel], land.fw[sel], land.bw[sel]))
            tasks = land.by_task(X)
            idx = np.concatenate([t["shards"] for t in tasks])
            pt = np.stack([np.concatenate([t["pf"] for t in tasks]), np.concatenate([t["pb"] for t in tasks])], 1)
            res["shard_rows"].append(shard_row(f"{label} task held out, plan shards{xname}", pt, land.fw[idx], land.bw[idx]))
            fig[f"{label}_by_task{xname.replace(' ', '_')}"] = {
                "fw": mape(pt[:, 0], land.fw[idx]), "bw": mape(pt[:, 1], land.bw[idx]),
                "fw+bw": mape(pt.sum(1), land.fw[idx] + land.bw[idx])}
            rhos = [spearman(t["pred_plan"], t["meas_plan"]) for t in tasks]
            plan_mape = mape(np.concatenate([t["pred_plan"] for t in tasks]),
                             np.concatenate([t["meas_plan"] for t in tasks]))
            nplans = sum(len(t["meas_plan"]) for t in tasks)
            res["plan_rows"].append([f"{label} task held out{xname}", len(tasks), nplans,
                                     f"{np.nanmean(rhos):.3f}", f"{np.nanmin(rhos):.3f}",
                                     sum(1 for r in rhos if r >= 0.9), f"{plan_mape:.2f}"])
            fig[f"{label}_spearman{xname.replace(' ', '_')}"] = {
                "mean": float(np.nanmean(rhos)), "min": float(np.nanmin(rhos)),
                "per_task": {f"{s}:{t}": r for (s, t), r in zip(land.tasks, rhos)}, "plan_mape": plan_mape}

    # the shipped parameters: in-sample, and batch 65536's set extrapolated to batch 4096
    model = GpuComputeModel(read_params(params_path or model_path("h200")))
    for land, label in ((big, "b65536"), (small, "b4096")):
        pred = model.predict_many([s["configs"] for s in land.meas["shards"]], land.batch)
        res["shard_rows"].append(shard_row(f"{label} shipped fit, in-sample", pred, land.fw, land.bw))
        fig[f"{label}_in_sample"] = {"fw": mape(pred[:, 0], land.fw), "bw": mape(pred[:, 1], land.bw),
                                     "fw+bw": mape(pred.sum(1), land.fw + land.bw)}
    wf, wb = model.weights[65536]
    pred = np.stack([small.X @ wf, small.X @ wb], 1)
    res["shard_rows"].append(shard_row("b4096 by the b65536 set (extrapolated)", pred, small.fw, small.bw))
    fig["b4096_extrapolated"] = {"fw": mape(pred[:, 0], small.fw), "bw": mape(pred[:, 1], small.bw),
                                 "fw+bw": mape(pred.sum(1), small.fw + small.bw)}
    rhos = []
    for key in small.tasks:
        plans = [p for p in small.meas["plans"] if (p["set"], p["task"]) == key]
        rhos.append(spearman([max(pred[k].sum() for k in p["shards"]) for p in plans], [p["gpu_cost_ms"] for p in plans]))
    res["plan_rows"].append(["b4096 by the b65536 set (extrapolated)", len(rhos), len(small.meas["plans"]),
                             f"{np.nanmean(rhos):.3f}", f"{np.nanmin(rhos):.3f}", sum(1 for r in rhos if r >= 0.9), "-"])
    fig["b4096_extrapolated_spearman"] = {"mean": float(np.nanmean(rhos))}
    return res


def main(argv=None):
    p = make_parser(__doc__)
    p.add_argument("--measurements", default=str(MEASUREMENTS_DIR), metavar="DIR",
                   help="folder with the measured shards, plans, table configs and tasks (default %(default)s)")
    p.add_argument("--params", default=None, metavar="FILE",
                   help="parameter file for the in-sample rows (default the shipped h200_emulator.json)")
    p.add_argument("--out", default=None, metavar="FILE", help="also write every figure as JSON (atomically)")
    args = p.parse_args(argv)
    if not os.path.isdir(args.measurements):
        raise ShardError(f"measurement folder not found: {args.measurements}")
    res = evaluate(args.measurements, args.params)
    print(f"Emulated-GPU compute model vs real shards ({CARD_LINE}); MAPE in %")
    print(format_table(["split", "shards", "fw", "bw", "fw+bw"], res["shard_rows"]))
    print()
    print("Plans: within-task Spearman of predicted vs measured GPU plan cost (max device fw+bw)")
    print(format_table(["split", "tasks", "plans", "mean rho", "min rho", "tasks rho>=0.9", "plan MAPE %"],
                       res["plan_rows"]))
    if args.out:
        io.write_json(args.out, {"card": res["card"], "figures": res["figures"]})
        print(f"wrote {args.out}")


if __name__ == "__main__":
    run_main(main)
