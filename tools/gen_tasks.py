#!/usr/bin/env python3
"""Generate sharding tasks (train.txt and test.txt), by default over disjoint train/test table pools.

DreamShard style:  python tools/gen_tasks.py --T 50 --out-dir data/dlrm_tasks_50
AutoShard style:   python tools/gen_tasks.py --T 50 --all-tables --out-dir data/as_tasks_50   # every table in both
NeuroShard style:  python tools/gen_tasks.py --T-range 10,61 --max-dim 128 --max-mem 1 --out-dir data/ns_tasks
NeuroShard's file: python tools/gen_tasks.py --data_size 100 --T_range 10,60 --max_mem 15 --max_dim 128 \
                       --out_dir data/tasks/4_gpu      # one data.txt, as NeuroShard's tools/gen_tasks.py

--T-range MIN,MAX has the original scripts' meaning: MAX is exclusive (80,81 gives 80 tables), and a
single number N gives exactly N. --max_mem (NeuroShard's spelling) keeps NeuroShard's meaning: the
whole task's weights, counted in fp32 unless --weights-precision is given; --max-mem is this
project's per-device cap (with --ndevices).
"""

import argparse
import os


from shardcore.argtypes import device_count, int_list, positive_float, positive_int, fraction, seed_int
from shardcore.cli.common import original_range, run_main
from shardcore.dataset import DEFAULT_DATA_DIR, load_dataset
from shardcore.errors import ShardError
from shardcore.tasks import save_tasks
from shardcore.data.taskgen import (TaskSpec, generate_single_pool_tasks, generate_tasks, generate_transfer_tasks,
                                   halving_dims)
from shardcore.cli.common import ArgumentParser as OneLineParser
from shardcore.argtypes import nonnegative_int
from shardcore.cli.common import check_outputs
from shardcore.tables import dim_problem


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", "--data_dir", default=DEFAULT_DATA_DIR,
                   help=f"processed dataset directory with table_configs.json (default {DEFAULT_DATA_DIR})")
    p.add_argument("--out-dir", "--out_dir", default=None,
                   help="where train.txt and test.txt go (default data/dlrm_tasks_<T>)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--T", type=positive_int, default=None, help="tables per task (default 50)")
    size.add_argument("--T-range", "--T_range", type=original_range, default=None, metavar="MIN,MAX",
                      help="number of tables per task drawn uniformly from MIN..MAX-1 (MAX exclusive, as the "
                           "original DreamShard/NeuroShard scripts: 80,81 gives 80); a single N gives N")
    p.add_argument("--num-train", type=nonnegative_int, default=50, help="number of training tasks (default 50)")
    p.add_argument("--num-test", type=nonnegative_int, default=50, help="number of test tasks (default 50)")
    p.add_argument("--train-fraction", type=fraction, default=0.5,
                   help="share of the dataset's tables in the training pool; the rest form the "
                        "disjoint test pool (default 0.5)")
    p.add_argument("--judge-pool", type=positive_int, default=None, metavar="K",
                   help="instead of --train-fraction: the training pool is the (at most) K tables of the dataset "
                        "that hold the most H200-measured shards entirely, the test pool every other table, so an "
                        "emulated judge refitted without a test task's tables (the held-out judge) keeps at least "
                        "those shards; for test tasks of hundreds of tables, which a random split leaves too few "
                        "shards to judge (the default dataset's tables only)")
    p.add_argument("--all-tables", action="store_true",
                   help="instead of disjoint pools: training and test tasks both drawn from every table of the "
                        "dataset (a test task's tables may be seen in training), as AutoShard's gen_dlrm_data.py "
                        "writes them without --transfer")
    p.add_argument("--seed", type=seed_int, default=0, help="random seed (default 0)")
    ns = p.add_argument_group("NeuroShard style (writes 'ids dims' lines)")
    dims = ns.add_mutually_exclusive_group()
    dims.add_argument("--dims", type=int_list, default=None, help="dims to draw from per table, e.g. 128,64,32,16,8,4")
    dims.add_argument("--max-dim", "--max_dim", type=positive_int, default=None,
                      help="shorthand for --dims MAX,MAX/2,..,4")
    mem = ns.add_mutually_exclusive_group()
    mem.add_argument("--max-mem", type=positive_float, default=None, metavar="GiB",
                     help="per-device memory cap: keep only tasks whose tables each fit one device and "
                          "whose total fits --ndevices x GiB")
    mem.add_argument("--max_mem", dest="total_mem", type=positive_float, default=None, metavar="GiB",
                     help="NeuroShard's flag, NeuroShard's meaning: keep only tasks whose tables together fit "
                          "GiB, counted in fp32 unless --weights-precision is given (its default was 15 for "
                          "4 devices)")
    ns.add_argument("--ndevices", type=device_count, default=4, help="devices assumed by --max-mem (default 4)")
    ns.add_argument("--weights-precision", choices=["fp16", "fp32"], default=None,
                    help="bytes per weight counted by the memory cap (default fp16 with --max-mem, fp32 with "
                         "--max_mem, as the original NeuroShard)")
    ns.add_argument("--data_size", "--data-size", dest="data_size", type=positive_int, default=None, metavar="N",
                    help="NeuroShard's single task file: write N tasks to <out-dir>/data.txt, table ids drawn "
                         "with replacement from all tables (a table may appear twice), dims from --max_dim "
                         "(default 128), --T_range (default 10,60) and --max_mem (default 15) as in NeuroShard; "
                         "--num-train/--num-test/--train-fraction do not apply")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.data_size is not None:
        return neuroshard_file(args)
    if args.T_range is not None:
        t_min, t_max = args.T_range
    else:
        t_min = t_max = args.T or 50
    if args.num_train < 0 or args.num_test < 0:
        raise ShardError("--num-train and --num-test must be >= 0")
    dims = tuple(args.dims) if args.dims else (halving_dims(args.max_dim) if args.max_dim else None)
    if dims is not None and min(dims) <= 0:
        raise ShardError(f"--dims must be positive, got {dims}")
    if dims is not None and any(dim_problem(d) for d in dims):
        raise ShardError(f"--dims: {next(dim_problem(d) for d in dims if dim_problem(d))}")
    if not 0 <= args.train_fraction <= 1:
        raise ShardError(f"--train-fraction must be in [0, 1], got {args.train_fraction}")
    if t_min < 1 or t_min > t_max:
        raise ShardError(f"--T-range takes MIN,MAX with 1 <= MIN <= MAX, got {t_min},{t_max}")
    if (args.max_mem is not None or args.total_mem is not None) and dims is None:
        raise ShardError("--max-mem / --max_mem select NeuroShard-style tasks: give --dims or --max-dim too")
    precision = args.weights_precision or ("fp32" if args.total_mem is not None else "fp16")
    out_dir = args.out_dir or os.path.join("data", f"dlrm_tasks_{t_max if t_min == t_max else f'{t_min}_{t_max}'}")
    check_outputs(args, {}, folders={"--out-dir": (out_dir, ["train.txt", "test.txt"])})
    if args.all_tables and (args.judge_pool is not None or dims is not None or args.max_mem is not None
                            or args.total_mem is not None or args.train_fraction != 0.5):
        raise ShardError("--all-tables draws AutoShard-style tasks from every table: it takes no --judge-pool, "
                         "--train-fraction, --dims/--max-dim or --max-mem")
    tables = load_dataset(args.data_dir, with_lookups=False).tables
    train_pool = None
    if args.judge_pool is not None:
        from shardcore.oracles.emulated.emulator import judge_pool, seen_tables

        train_pool = tuple(judge_pool(args.judge_pool))
        seen = seen_tables([tables[i] for i in train_pool if i < len(tables)])
        if len(seen) != len(train_pool):
            raise ShardError(f"--judge-pool: {args.data_dir}'s tables are not the H200-measured ones (the default "
                             "synthetic dataset's, tools/gen_dlrm_data.py); use --train-fraction")
    spec = TaskSpec(t_min=t_min, t_max=t_max, num_train=args.num_train, num_test=args.num_test,
                    train_fraction=args.train_fraction, seed=args.seed, dims=dims,
                    max_mem_gb=args.max_mem, ndevices=args.ndevices, precision=precision,
                    total_mem_gb=args.total_mem, train_pool=train_pool)
    if args.num_train == 0 and args.num_test == 0:
        raise ShardError("--num-train and --num-test are both 0: nothing to write")
    if args.all_tables:
        train, test = generate_transfer_tasks(len(tables), t_min, t_max, num_train=args.num_train,
                                              num_test=args.num_test, seed=args.seed)
    else:
        train, test = generate_tasks(tables, spec)
    kept = []
    for name, tasks, count in (("train.txt", train, args.num_train), ("test.txt", test, args.num_test)):
        if count == 0:   # 0 tasks asked: an existing file is left as it is, never emptied
            kept.append(name)
            continue
        save_tasks(os.path.join(out_dir, name), tasks)
    style = ("NeuroShard (ids dims)" if dims else "AutoShard (ids, every table in both)" if args.all_tables
             else "DreamShard (ids)")
    note = f" ({', '.join(kept)} not written: 0 tasks asked)" if kept else ""
    print(f"wrote {len(train)} train and {len(test)} test tasks, {t_min}..{t_max} tables each, "
          f"{style} style, to {out_dir}/{note}")


def neuroshard_file(args) -> None:
    """NeuroShard's tools/gen_tasks.py: one <out_dir>/data.txt of --data_size tasks over all tables."""
    if args.max_mem is not None:
        raise ShardError("--data_size writes NeuroShard's task file, whose cap is --max_mem (the whole task's "
                         "memory), not --max-mem (per device)")
    t_min, t_max = args.T_range if args.T_range is not None else ((args.T, args.T) if args.T else (10, 59))
    dims = tuple(args.dims) if args.dims else halving_dims(args.max_dim or 128)
    total = args.total_mem if args.total_mem is not None else 15.0
    precision = args.weights_precision or "fp32"
    if args.judge_pool is not None:
        raise ShardError("--judge-pool splits train and test tables; --data_size writes one pool's tasks")
    tables = load_dataset(args.data_dir, with_lookups=False).tables
    spec = TaskSpec(t_min=t_min, t_max=t_max, seed=args.seed, dims=dims, precision=precision, total_mem_gb=total)
    tasks = generate_single_pool_tasks(tables, args.data_size, spec)
    out_dir = args.out_dir or os.path.join("data", "tasks", "4_gpu")
    check_outputs(args, {}, folders={"--out-dir": (out_dir, ["data.txt"])})
    save_tasks(os.path.join(out_dir, "data.txt"), tasks)
    print(f"wrote {len(tasks)} NeuroShard-style tasks ({t_min}..{t_max} tables each, ids drawn from all "
          f"{len(tables)} tables with replacement, total memory <= {total:g} GiB in {precision}) to "
          f"{os.path.join(out_dir, 'data.txt')}")


if __name__ == "__main__":
    run_main(main)
