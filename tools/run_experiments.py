#!/usr/bin/env python3
"""Reproduce the paper-style results: task sets, learned methods, every algorithm measured side by side.

  python tools/run_experiments.py --scale small        # about an hour on a 2-core CPU, training included
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

from experiments.config import ExperimentConfig, add_experiment_args, learned_methods
from experiments.pipeline import run_experiments
from shardcore import registry
from shardcore.cli import algorithms
from shardcore.cli.common import ArgumentParser as OneLineParser
from shardcore.cli.common import add_memory_args, add_oracle_args, run_main
from shardcore.config import config_from_args
from shardcore.processes import output_lock
from shardcore.errors import ShardError
from shardcore.cli.common import check_outputs

DEFAULTS = ExperimentConfig()


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    t = p.add_argument_group("learned methods")
    add_experiment_args(p, t)
    add_memory_args(p, default_max_memory=DEFAULTS.max_memory, default_precision=DEFAULTS.precision)
    specs = registry.available()
    for m in learned_methods():
        t.add_argument(f"--{m}-model", default=None, metavar="PT",
                       help=f"use this {m} checkpoint for every task set instead of training"
                            + (specs[m].model_help if m in specs else ""))
        t.add_argument(f"--{m}-args", default="", metavar="'FLAGS'",
                       help=f"extra flags for train_{m}.py, appended after the scale's; write them with '=', e.g. "
                            f"--{m}-args='--seed 3'")
    add_oracle_args(p)
    algorithms.add_planner_args(p)   # each planner's own flags: --shardkit-time, --torchrec-time, ...
    return p


def check_train_args(args) -> None:
    """Every ``--<method>-args``, after the scale's flags for that method, parsed by its training script's
    own parser now: a flag it does not take, or a bad value, is one line before any task is written (a
    training that failed on it later was skipped with a note, and the run ended with status 0)."""
    import importlib.util
    import shlex

    specs = registry.available()
    for m in learned_methods():
        text = getattr(args, f"{m}_args", "") or ""
        if not text.strip() or m not in specs:
            continue
        spec = specs[m]
        try:
            flags = shlex.split(text)
        except ValueError as exc:
            raise ShardError(f"--{m}-args {text!r}: {exc}") from None
        loaded = importlib.util.spec_from_file_location(f"_check_{m}_train_script", spec.train_script)
        module = importlib.util.module_from_spec(loaded)
        loaded.loader.exec_module(module)
        parser = module.build_parser()
        parser.prog = spec.train_script.name

        def refuse(status=0, message=None, m=m, name=spec.train_script.name):
            said = " ".join(str(message or "").split()).removeprefix("error: ") or f"{name} exits with status {status}"
            raise ShardError(f"--{m}-args: {said}")

        parser.exit = refuse
        parser.print_help = parser.print_usage = lambda file=None: None
        parser.parse_args([*spec.scale_flags.get(args.scale, ()), *flags])


def main(argv=None):
    args = build_parser().parse_args(argv)
    check_outputs(args, {"--models-dir": args.models_dir}, dirs=["--models-dir"],
                  folders={"--out-dir": (args.out_dir, ["measurements.csv", "results.md", "costs.png",
                                                        "breakdown.png", "summary.json"])},
                  inputs={f"--{m}-model": getattr(args, f"{m}_model") for m in learned_methods()})
    check_train_args(args)   # a typo in --<method>-args is said now, not after the task sets, as a skipped method
    if args.breakdown_set is not None and len(args.breakdown_set) != 1:
        raise ShardError("--breakdown-set takes one T:D")
    if args.num_train is not None and args.num_train < 0:
        raise ShardError("--num-train must be >= 0")
    cfg = config_from_args(
        ExperimentConfig, args, max_memory=args.max_memory, precision=args.weights_precision,
        batch_size=args.batch_size, bench_iters=args.bench_iters, warmup_iters=args.warmup_iters,
        comm_iters=args.comm_iters,
        optimizer=args.optimizer, cache_path=args.cache_path, no_cache=args.no_cache, timeout=args.timeout,
        oracle=args.oracle, comm_bandwidth=args.comm_bandwidth, comm_latency=args.comm_latency,
        devices_per_host=args.devices_per_host or None, inter_host_bandwidth=args.inter_host_bandwidth,
        inter_host_latency=args.inter_host_latency,
        emulator_fit=args.emulator_fit,
        planner_args={n: c.to_dict() for n, c in algorithms.planner_configs(args).items()},
        model_paths={m: getattr(args, f"{m}_model") for m in learned_methods()},
        train_args={m: getattr(args, f"{m}_args") for m in learned_methods()},
        breakdown_set=args.breakdown_set[0] if args.breakdown_set else None,
        command=["python", os.path.relpath(os.path.abspath(__file__))] + list(argv if argv is not None else sys.argv[1:]))
    with output_lock(args.out_dir, "--out-dir"):   # two runs would interleave their tasks, logs and tables
        run_experiments(cfg)


if __name__ == "__main__":
    run_main(main)
