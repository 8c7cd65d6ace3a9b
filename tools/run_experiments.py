#!/usr/bin/env python3
"""Reproduce the paper-style results: task sets, learned methods, every algorithm measured side by side.

  python tools/run_experiments.py --scale small        # about 35-45 min on a 2-core CPU, training included
  python tools/run_experiments.py                      # full scale: DLRM-20/50/100 (4), DLRM-40/80/160 (8)

Steps: (1) generate the task sets from the dataset (one train/test split of its tables shared by
every set: test tasks hold only tables never seen in training) into <out-dir>/tasks/; (2) train the
learned methods (train_dreamshard.py, train_neuroshard.py, train_autoshard.py as subprocesses, logs
in <out-dir>/logs/) on the train split of one set per device count, or load a checkpoint
(--<method>-model, or one a previous run left in --models-dir); a method whose package or script is
missing, or whose training fails, is skipped with a note; (3) measure every algorithm on every test
task, one evaluator session per task set; (4) write <out-dir>/measurements.csv, results.md (the
DreamShard paper's table: mean±std, % over random, best in bold), costs.png, breakdown.png and
summary.json. Outputs are rewritten after every task set, so an interrupted run keeps its numbers.

Scales: full (DLRM-20/50/100 on 4 devices, DLRM-40/80/160 on 8, 50 test tasks; each method
trained with its script's defaults on DLRM-50 (4) and DLRM-80 (8)); small (DLRM-20/50 on 4,
DLRM-40/80 on 8, 5 test tasks; short training on DLRM-50 (4) only, 12 min cap per training);
tiny (a smoke test on 2 devices). --task-sets, --num-test, ... override a scale's choices.
"""

import argparse
import os
import sys


from shardcore.cli.common import add_memory_args, add_oracle_args, run_main
from shardcore.argtypes import name_list, positive_float, positive_int, nonnegative_int, seed_int
from shardcore.dataset import DEFAULT_DATA_DIR
from shardcore.errors import ShardError
from experiments.config import SCALES, ExperimentConfig, all_algs, learned_methods, parse_task_sets
from experiments.pipeline import run_experiments
from shardcore import registry
from shardcore.cli.common import ArgumentParser as OneLineParser


def task_sets_arg(text: str):
    try:
        return parse_task_sets(text)
    except ShardError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", choices=sorted(SCALES), default="full",
                   help="preset task sets, task counts and training lengths (default full; small for a "
                        "CPU run under an hour; tiny for a smoke test)")
    p.add_argument("--data-dir", "--data_dir", dest="data_dir", default=DEFAULT_DATA_DIR,
                   help=f"processed dataset directory (default {DEFAULT_DATA_DIR})")
    p.add_argument("--out-dir", default="results", help="where the outputs go (default results)")
    p.add_argument("--models-dir", default=None,
                   help="where learned models are trained to / looked for: <dir>/<method>_<N>dev/ "
                        "(default models/experiments/<scale>)")
    p.add_argument("--algs", type=name_list, default=None,
                   help=f"comma-separated algorithms (default all: {','.join(all_algs())}); also naive")
    p.add_argument("--task-sets", type=task_sets_arg, default=None, metavar="T:D,...",
                   help="task sets to evaluate as tables-per-task:devices, e.g. 20:4,50:4,40:8 "
                        "(default: the scale's)")
    p.add_argument("--train-sets", type=task_sets_arg, default=None, metavar="T:D,...",
                   help="sets whose train split trains the learned methods, at most one per device count "
                        "(default: the scale's, e.g. 50:4)")
    p.add_argument("--num-train", type=nonnegative_int, default=None, metavar="N",
                   help="training tasks per set (default: the scale's; 50 full, 20 small)")
    p.add_argument("--num-test", type=positive_int, default=None, metavar="N",
                   help="test tasks per set, all measured (default: the scale's; 50 full, 5 small)")
    add_memory_args(p)
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the random baseline and of training (default 0)")
    p.add_argument("--task-seed", type=seed_int, default=0,
                   help="seed of task generation and of the train/test table split (default 0; NeuroShard's "
                        "cost data use the split of seed 0)")
    p.add_argument("--breakdown-set", type=task_sets_arg, default=None, metavar="T:D",
                   help="task set of breakdown.png (default: the last task set)")
    t = p.add_argument_group("learned methods")
    t.add_argument("--skip-train", action="store_true",
                   help="never train: use given or existing checkpoints, skip methods without one")
    t.add_argument("--retrain", action="store_true",
                   help="train again even where --models-dir holds a finished checkpoint")
    t.add_argument("--train-timeout", type=positive_float, default=-1.0, metavar="S",
                   help="stop a training run after S seconds (DreamShard then uses its newest checkpoint; "
                        "default: the scale's, 720 s at small, none at full)")
    specs = registry.available()
    for m in learned_methods():
        t.add_argument(f"--{m}-model", default=None, metavar="PT",
                       help=f"use this {m} checkpoint for every task set instead of training"
                            + (specs[m].model_help if m in specs else ""))
        t.add_argument(f"--{m}-args", default="", metavar="'FLAGS'",
                       help=f"extra flags for train_{m}.py, appended after the scale's; write them with '=', e.g. "
                            f"--{m}-args='--seed 3'")
    p.add_argument("--repeats", type=positive_int, default=None, metavar="N",
                   help="measure every plan in N interleaved rounds and keep the medians (default 3 on the "
                        "measured oracle, whose rounds differ by a few percent; 1 on an emulated one)")
    p.add_argument("--quiet", action="store_true", help="do not echo the training scripts' output (it is logged)")
    add_oracle_args(p)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    algs = args.algs
    if args.breakdown_set is not None and len(args.breakdown_set) != 1:
        raise ShardError("--breakdown-set takes one T:D")
    if args.num_train is not None and args.num_train < 0:
        raise ShardError("--num-train must be >= 0")
    cfg = ExperimentConfig(
        data_dir=args.data_dir, out_dir=args.out_dir, models_dir=args.models_dir, scale=args.scale,
        task_sets=args.task_sets, train_sets=args.train_sets, num_train=args.num_train, num_test=args.num_test,
        algs=algs, max_memory=args.max_memory, precision=args.weights_precision, seed=args.seed,
        task_seed=args.task_seed, batch_size=args.batch_size, bench_iters=args.bench_iters,
        warmup_iters=args.warmup_iters, optimizer=args.optimizer, cache_path=args.cache_path,
        no_cache=args.no_cache, timeout=args.timeout, skip_train=args.skip_train, retrain=args.retrain,
        oracle=args.oracle, comm_bandwidth=args.comm_bandwidth, comm_latency=args.comm_latency,
        emulator_fit=args.emulator_fit, repeats=args.repeats,
        model_paths={m: getattr(args, f"{m}_model") for m in learned_methods()},
        train_args={m: getattr(args, f"{m}_args") for m in learned_methods()},
        train_timeout_s=args.train_timeout,
        breakdown_set=args.breakdown_set[0] if args.breakdown_set else None, quiet=args.quiet,
        command=["python", os.path.relpath(os.path.abspath(__file__))] + list(argv if argv is not None else sys.argv[1:]))
    run_experiments(cfg)


if __name__ == "__main__":
    run_main(main)
