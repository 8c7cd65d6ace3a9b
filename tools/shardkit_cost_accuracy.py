#!/usr/bin/env python3
"""Held-out accuracy of shardkit's cost model on whole plans: predicted vs measured plan cost.

  python tools/shardkit_cost_accuracy.py --records results/shardkit/cpu_dlrm50.jsonl \
      --task-path data/dlrm_tasks_50/test.txt --data-dir data/dlrm_datasets \
      --model models/shardkit/cpu_cost_model.json
  python tools/shardkit_cost_accuracy.py --records emu.jsonl --task-path T --data-dir D --oracle emulated:h200

Every measured record of the eval.py --out files (any algorithm, every sharding type) is rebuilt as
its plan; the model predicts its per-device costs. Prints per algorithm and overall the MAPE of the
plan cost (the slowest device) and of the device costs, the medians of measured / modelled compute
and exchange per device (which part a bias is in), and the within-task Spearman correlation of plan
costs. Records of tasks whose tables the model was fitted on are not held out: fit the model
with --exclude-tasks naming the task file.
"""

import argparse


import numpy as np

from shardcore.cli.common import ArgumentParser as OneLineParser, run_main
from shardcore.dataset import DEFAULT_DATA_DIR, load_dataset
from shardcore.errors import ShardError
from shardcore.planning import DEFAULT_BATCH_SIZE
from shardcore.io import parse_json
from shardcore.oracles.factory import batch_size_int, check_same_pricing
from shardcore.evaluation.compare import check_record, record_plan, record_pricing
from shardcore.tasks import load_tasks


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", required=True, metavar="FILES", help="comma-separated eval.py --out files (measured)")
    p.add_argument("--task-path", required=True, help="the task file the records' task numbers index")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=f"dataset (default {DEFAULT_DATA_DIR})")
    p.add_argument("--model", default=None, metavar="JSON", help="a fitted shardkit cost model (measured landscape)")
    p.add_argument("--oracle", default=None, choices=["emulated:h200"],
                   help="use the emulated card's model instead of --model")
    p.add_argument("--batch-size", type=batch_size_int, default=None, metavar="B",
                   help="batch for --oracle emulated:h200 (default: the records')")
    p.add_argument("--algs", default=None, help="only these algorithms (comma-separated)")
    return p


def spearman(a, b) -> float:
    from shardcore.evaluation.report import spearman as sp

    return sp(a, b)


def main(argv=None):
    args = build_parser().parse_args(argv)
    from shardkit_planner.costmodel import CostModel, emulated_model, mape

    if (args.model is None) == (args.oracle is None):
        raise ShardError("give exactly one of --model and --oracle")
    ds = load_dataset(args.data_dir, with_lookups=False)
    tasks = load_tasks(args.task_path, num_tables=ds.num_tables)
    recs = []
    for path in args.records.split(","):
        try:
            with open(path, "rb") as fh:
                lines = fh.read().decode("utf-8").splitlines()
        except OSError as exc:
            raise ShardError(f"--records {path}: {exc.strerror}") from None
        for k, line in enumerate(lines, 1):
            if not line.strip():
                continue
            rec = check_record(parse_json(line, f"--records {path}:{k}"), f"--records {path}:{k}")
            if rec.get("cost_ms") is not None and rec.get("feasible"):
                recs.append(rec)
    if args.algs:
        keep = {a.strip() for a in args.algs.split(",")}
        recs = [r for r in recs if r["alg"] in keep]
    if not recs:
        raise ShardError("--records: no measured feasible plan in them")
    # one model judges them all: records priced another way (batch, oracle, exchange) would be judged wrongly
    check_same_pricing({f"{r['alg']} task {r['task']}": record_pricing(r) for r in recs}, "--records")
    batch = args.batch_size or int(recs[0].get("batch_size") or DEFAULT_BATCH_SIZE)
    model = CostModel.load(args.model) if args.model else emulated_model(args.data_dir, batch)
    rows = []
    for r in recs:
        t = int(r["task"])
        if not 0 <= t < len(tasks):
            raise ShardError(f"record of task {t}: not in {args.task_path} ({len(tasks)} tasks)")
        tables = tasks[t].tables(ds.tables)
        shards = record_plan(r, tables).device_pieces
        comp = model.shard_compute(shards)
        pred = model.shard_costs(shards)
        parts = np.asarray(r["device_costs_ms"], dtype=float)   # fw compute, fw exchange, bw exchange, bw compute
        true = parts.sum(axis=1)
        # per device measured / modelled, compute and exchange apart (devices with some of each)
        c_ok, x_ok = comp > 0, pred - comp > 0
        ratios = ((parts[:, 0] + parts[:, 3])[c_ok] / comp[c_ok],
                  (parts[:, 1] + parts[:, 2])[x_ok] / (pred - comp)[x_ok])
        rows.append((r["alg"], t, float(pred.max()), float(r["cost_ms"]), pred, true, ratios))
    print(f"{len(rows)} measured plans, model: {model.source} ({model.landscape}, batch {model.batch_size})")
    print("| alg | plans | plan-cost MAPE % | device-cost MAPE % | measured / modelled compute, median | "
          "measured / modelled exchange, median |")
    print("|---|---|---|---|---|---|")
    algs = sorted({a for a, *_ in rows}, key=lambda a: [x[0] for x in rows].index(a))
    for alg in algs + ["all"]:
        sel = [x for x in rows if alg == "all" or x[0] == alg]
        pm = mape([x[2] for x in sel], [x[3] for x in sel])
        dm = mape(np.concatenate([x[4] for x in sel]), np.concatenate([x[5] for x in sel]))
        med = [np.concatenate([x[6][k] for x in sel]) for k in (0, 1)]
        cr, xr = (f"{np.median(m):.3f}" if m.size else "-" for m in med)
        print(f"| {alg} | {len(sel)} | {pm:.2f} | {dm:.2f} | {cr} | {xr} |")
    # the machine's speed drifts over hours: one factor for the run, taken from the *other* tasks' plans
    scale = float(np.median([x[3] / x[2] for x in rows if x[2] > 0]))
    loo = []
    for x in rows:
        others = [y[3] / y[2] for y in rows if y[1] != x[1] and y[2] > 0]
        if others:
            loo.append((x[2] * float(np.median(others)), x[3]))
    if loo:
        print(f"measured / modelled plan cost, median over the plans: {scale:.3f} (the machine's speed during "
              f"this run against the fit's); with that factor taken from the other tasks' plans "
              f"(leave one task out): plan-cost MAPE {mape(*zip(*loo)):.2f}% over {len(loo)} plans")
    rhos = []
    for t in sorted({x[1] for x in rows}):
        sel = [x for x in rows if x[1] == t]
        if len(sel) >= 3:
            rhos.append(spearman([x[2] for x in sel], [x[3] for x in sel]))
    if rhos:
        print(f"within-task Spearman of plan costs: mean {np.nanmean(rhos):.3f} over {len(rhos)} tasks")


if __name__ == "__main__":
    run_main(main)
