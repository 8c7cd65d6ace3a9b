#!/usr/bin/env python3
"""How well a DreamShard cost network predicts measured plans it never saw.

Reads the measured plans of an ``eval.py --out`` file (any algorithms, typically test tasks), asks
the checkpoint's cost network for each plan's per-device and overall costs, and prints the mean
absolute percentage error (MAPE) of the plan cost and of the per-device forward compute, backward
compute and communication costs.

  python tools/dreamshard_cost_accuracy.py --model models/dreamshard/best.pt \\
      --results results.jsonl --task-path data/dlrm_tasks_50/test.txt
"""

import argparse
import os


import numpy as np

from dreamshard.sharder import DreamShardModel
from shardcore.cli.common import run_main
from shardcore.dataset import DEFAULT_DATA_DIR, load_dataset
from shardcore.errors import ShardError
from shardcore.evaluation.compare import check_record, record_pricing
from shardcore.oracles.factory import check_same_pricing
from shardcore.plan import Plan
from shardcore.evaluation.report import format_table
from shardcore.tasks import load_tasks
from shardcore.cli.common import ArgumentParser as OneLineParser
from shardcore.io import parse_json, read_text


def mape(pred, true) -> float:
    pred, true = np.asarray(pred, dtype=float), np.asarray(true, dtype=float)
    keep = true > 0
    return float(np.mean(np.abs(pred[keep] - true[keep]) / true[keep]) * 100) if keep.any() else float("nan")


def main(argv=None):
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="DreamShard checkpoint")
    p.add_argument("--results", required=True, help="eval.py --out file with measured plans (cost_ms)")
    p.add_argument("--task-path", required=True, help="the task file those results were measured on")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="dataset directory (default %(default)s)")
    args = p.parse_args(argv)
    model = DreamShardModel.load(args.model)
    tables = load_dataset(args.data_dir, with_lookups=False).tables
    tasks = load_tasks(args.task_path, num_tables=len(tables))
    if not os.path.isfile(args.results):
        raise ShardError(f"results file not found: {args.results}")
    rows = []
    for lineno, line in enumerate(read_text(args.results, "JSON-lines results file").splitlines(), start=1):
        if line.strip():
            where = f"{args.results}:{lineno}"
            rows.append(check_record(parse_json(line, where), where))
    rows = [r for r in rows if r.get("cost_ms") is not None]
    if not rows:
        raise ShardError(f"{args.results}: no measured plans (run eval.py without --plan-only)")
    check_same_pricing({f"{r['alg']} task {r['task']}": record_pricing(r) for r in rows}, args.results)
    pred_all, true_all, pred_dev, true_dev = [], [], [], []
    for r in rows:
        if r["task"] >= len(tasks):
            raise ShardError(f"{args.results}: task {r['task']} is not in {args.task_path}")
        plan = Plan(tuple(r["allocation"]), len(r["device_costs_ms"]), tuple(r["splits"]) if r.get("splits") else None)
        dev, overall = model.predict(tasks[r["task"]].tables(tables), plan)
        pred_all.append(overall)
        true_all.append(r["cost_ms"])
        for d, c in enumerate(r["device_costs_ms"]):
            pred_dev.append(dev[d].tolist())
            true_dev.append([c[0], c[3], c[1] + c[2]])
    pred_dev, true_dev = np.array(pred_dev), np.array(true_dev)
    print(f"{len(rows)} measured plans from {args.results}; model {args.model}")
    print(format_table(["quantity", "MAPE %", "mean measured ms", "mean predicted ms"], [
        ["plan cost", f"{mape(pred_all, true_all):.1f}", f"{np.mean(true_all):.2f}", f"{np.mean(pred_all):.2f}"],
        ["device forward compute", f"{mape(pred_dev[:, 0], true_dev[:, 0]):.1f}",
         f"{true_dev[:, 0].mean():.2f}", f"{pred_dev[:, 0].mean():.2f}"],
        ["device backward compute", f"{mape(pred_dev[:, 1], true_dev[:, 1]):.1f}",
         f"{true_dev[:, 1].mean():.2f}", f"{pred_dev[:, 1].mean():.2f}"],
        ["device communication", f"{mape(pred_dev[:, 2], true_dev[:, 2]):.1f}",
         f"{true_dev[:, 2].mean():.2f}", f"{pred_dev[:, 2].mean():.2f}"],
    ]))


if __name__ == "__main__":
    run_main(main)
