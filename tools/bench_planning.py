#!/usr/bin/env python3
"""Planning time and peak memory of every algorithm as tables and devices grow (no hardware).

  python tools/bench_planning.py                       # tables 50..856 on 4 devices; 4..128 devices, 400 tables
  python tools/bench_planning.py --dreamshard-model models/dreamshard/best.pt --tables 50,100 --devices 4,8

Each algorithm plans in a fresh process. Time: median of up to --repeats calls per size. Memory: the
rise of the process's peak resident set size (VmHWM, reset through /proc/self/clear_refs) during one
call above the resident size just before it, so native (torch, numpy) and Python allocations both
count; where the kernel lacks that reset, tracemalloc's peak (Python and numpy only) is used and the
output says so. Tables are drawn at random from the dataset (nested sets; a size above the dataset's
table count means all its tables); the per-device cap is raised to --headroom x the task's memory /
devices where needed, so every task is feasible. Once one size takes longer than --time-limit, the
larger sizes of that sweep are skipped. Learned methods use --<method>-model, else the newest
checkpoint in --models-dir (as left by tools/run_experiments.py), else they are skipped with a note.
Writes <out-dir>/planning_tables.csv, planning_devices.csv, planning.md and planning.png (log axes).
"""

import argparse
import os
import sys


from shardcore.argtypes import MAX_DEVICES, device_count, int_list, name_list, nonnegative_int, positive_float, positive_int, seed_int
from shardcore.cli.common import check_outputs, run_main
from shardcore.dataset import DEFAULT_DATA_DIR
from shardcore.errors import ShardError
from shardcore.processes import output_lock
from experiments.config import learned_methods
from experiments.planning import DEFAULT_DEVICE_COUNTS, DEFAULT_TABLE_SIZES, BenchConfig, bench_planning
from shardcore.tables import PRECISION_BYTES
from shardcore.topology import DEFAULT_MAX_MEMORY_GB
from shardcore.cli.common import ArgumentParser as OneLineParser


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", "--data_dir", dest="data_dir", default=DEFAULT_DATA_DIR,
                   help=f"processed dataset directory (default {DEFAULT_DATA_DIR}); only table configs are read")
    p.add_argument("--out-dir", default="results", help="where the outputs go (default results)")
    p.add_argument("--algs", type=name_list, default=None,
                   help="comma-separated algorithms (default: every baseline of the paper, torchrec, and "
                        "the learned methods that have a checkpoint)")
    p.add_argument("--tables", type=int_list, default=list(DEFAULT_TABLE_SIZES), metavar="N,...",
                   help="table counts of the first sweep (default 50,100,200,400,856; capped at the "
                        "dataset's table count)")
    p.add_argument("--tables-ndevices", type=device_count, default=4, metavar="D",
                   help="devices in the table sweep (default 4)")
    p.add_argument("--devices", type=int_list, default=list(DEFAULT_DEVICE_COUNTS), metavar="D,...",
                   help="device counts of the second sweep (default 4,8,16,32,64,128)")
    p.add_argument("--devices-tables", type=positive_int, default=400, metavar="N",
                   help="tables in the device sweep (default 400, capped at the dataset's count)")
    p.add_argument("--max-memory", "--max_mem", dest="max_memory", type=positive_float, default=DEFAULT_MAX_MEMORY_GB,
                   metavar="GiB", help="the usual per-device cap, raised per task where needed (default %(default)g)")
    p.add_argument("--headroom", type=positive_float, default=1.5,
                   help="a raised cap is this multiple of the task's memory / devices (default 1.5)")
    p.add_argument("--weights-precision", choices=sorted(PRECISION_BYTES), default="fp16",
                   help="weight precision counted toward the cap (default fp16)")
    p.add_argument("--repeats", type=positive_int, default=3, help="planning calls per size, median kept (default 3)")
    p.add_argument("--time-limit", type=positive_float, default=30.0, metavar="S",
                   help="skip an algorithm's larger sizes once one size takes longer than S seconds; a call "
                        "still running after max(4 S, S + 60) s is stopped (default 30)")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the table draws and the random baseline (default 0)")
    p.add_argument("--devices-per-host", type=nonnegative_int, default=0, metavar="G",
                   help="devices form hosts of G (where there are more than G): shardkit and TorchRec plan for them "
                        "(default 0: one host)")
    p.add_argument("--models-dir", default="models/experiments/small",
                   help="where to look for learned checkpoints (<dir>/<method>_<N>dev/, as written by "
                        "tools/run_experiments.py; default models/experiments/small)")
    for m in learned_methods():
        p.add_argument(f"--{m}-model", default=None, metavar="PT", help=f"{m} checkpoint to time")
    p.add_argument("--quiet", action="store_true", help="fewer messages")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    algs = args.algs
    if min(args.tables) < 1 or min(args.devices) < 1:
        raise ShardError("--tables and --devices take positive counts")
    if max(args.devices) > MAX_DEVICES:
        raise ShardError(f"--devices {max(args.devices)}: at most {MAX_DEVICES} devices are planned for")
    if args.headroom < 1:
        raise ShardError(f"--headroom must be at least 1, got {args.headroom:g}")
    check_outputs(args, {}, folders={"--out-dir": (args.out_dir, ["planning_tables.csv", "planning_devices.csv",
                                                                  "planning.md", "planning.png"])})
    cfg = BenchConfig(
        data_dir=args.data_dir, out_dir=args.out_dir, algs=algs, table_sizes=tuple(args.tables),
        tables_ndevices=args.tables_ndevices, device_counts=tuple(args.devices), devices_tables=args.devices_tables,
        max_memory=args.max_memory, headroom=args.headroom, precision=args.weights_precision,
        repeats=args.repeats, time_limit_s=args.time_limit, seed=args.seed, devices_per_host=args.devices_per_host,
        model_paths={m: getattr(args, f"{m}_model") for m in learned_methods()}, models_dir=args.models_dir,
        quiet=args.quiet,
        command=["python", os.path.relpath(os.path.abspath(__file__))] + list(argv if argv is not None else sys.argv[1:]))
    with output_lock(args.out_dir, "--out-dir"):   # one run at a time rewrites its tables and figure
        bench_planning(cfg)


if __name__ == "__main__":
    run_main(main)
