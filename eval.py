#!/usr/bin/env python3
"""Shard tasks with one or more algorithms and evaluate the plans.

  python eval.py --alg random,lookup_greedy --task-path data/dlrm_tasks_50/test.txt \\
      --gpu-devices 0,1,2,3 --max-memory 5 --plan-only

--alg takes baselines (random, naive, dim_greedy, size_greedy, lookup_greedy, size_lookup_greedy)
or a trained model's checkpoint (.pt); several comma-separated algorithms are evaluated side by side
on the same tasks. --plan-only plans without hardware: allocation, per-device memory, feasibility.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tqdm import tqdm  # noqa: E402

from shardcore import algorithms, report  # noqa: E402
from shardcore.cli import add_device_args, add_memory_args, device_ids, run_main  # noqa: E402
from shardcore.dataset import DEFAULT_DATA_DIR, load_dataset  # noqa: E402
from shardcore.errors import ShardError  # noqa: E402
from shardcore.evaluation import evaluate  # noqa: E402
from shardcore.io import atomic_open  # noqa: E402
from shardcore.tasks import load_tasks  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--alg", default="random",
                   help="algorithm(s), comma-separated: random, naive, dim_greedy, size_greedy, "
                        "lookup_greedy, size_lookup_greedy, or a model checkpoint path (default random)")
    p.add_argument("--task-path", "--task_path", default="data/dlrm_tasks_50/test.txt",
                   help="task file, one task per line (default data/dlrm_tasks_50/test.txt)")
    p.add_argument("--data-dir", "--data_dir", "--dataset_dir", dest="data_dir", default=DEFAULT_DATA_DIR,
                   help=f"processed dataset directory (default {DEFAULT_DATA_DIR})")
    add_device_args(p)
    add_memory_args(p)
    p.add_argument("--max-tasks", type=int, default=None, metavar="N", help="evaluate only the first N tasks")
    p.add_argument("--seed", type=int, default=0, help="seed of the random baseline (default 0)")
    p.add_argument("--plan-only", action="store_true",
                   help="plan without hardware: print allocations, per-device memory and feasibility")
    p.add_argument("--out", default=None, metavar="FILE.jsonl",
                   help="write one JSON object per task and algorithm (written atomically at the end)")
    p.add_argument("--quiet", action="store_true", help="no per-task lines, only the summary")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    devices = device_ids(args)
    ndevices = len(devices)
    names = [a.strip() for a in args.alg.split(",") if a.strip()]
    if not names:
        raise ShardError("--alg names no algorithm")
    if len(set(names)) != len(names):
        raise ShardError(f"--alg names an algorithm twice: {args.alg}")
    dataset = load_dataset(args.data_dir, with_lookups=False)
    tasks = load_tasks(args.task_path, num_tables=dataset.num_tables)
    if args.max_tasks is not None:
        tasks = tasks[: args.max_tasks]
    sharders = {name: algorithms.resolve(name, seed=args.seed) for name in names}

    if not args.plan_only:
        raise ShardError("hardware measurement needs the benchmark (not in this build): use --plan-only")

    def show(result, task):
        if args.quiet:
            return
        if result.feasible:
            mem = " ".join(f"{m:.3f}" for m in result.memory_gb)
            tqdm.write(f"task {result.task:3d} {result.alg:>20s}: feasible, memory GB [{mem}], "
                       f"allocation {result.allocation}")
        else:
            tqdm.write(f"task {result.task:3d} {result.alg:>20s}: {result.error}")

    print(f"{len(tasks)} tasks from {args.task_path}, {ndevices} devices, cap {args.max_memory:g} GB "
          f"({args.weights_precision}), algorithms: {', '.join(names)}")
    with tqdm(total=len(tasks) * len(sharders), desc="planning", unit="plan", disable=None) as bar:
        results = evaluate(tasks, dataset.tables, sharders, ndevices, args.max_memory,
                           args.weights_precision, on_result=show, progress=bar)
    print()
    print(report.plan_only_summary(results))
    if args.out:
        with atomic_open(args.out) as fh:
            for r in results:
                fh.write(json.dumps(r.to_json()) + "\n")
        print(f"wrote {len(results)} records to {args.out}")


if __name__ == "__main__":
    run_main(main)
