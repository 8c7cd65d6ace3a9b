#!/usr/bin/env python3
"""Generate sharding tasks (train.txt and test.txt) over disjoint train/test table pools.

DreamShard style:  python tools/gen_tasks.py --T 50 --out-dir data/dlrm_tasks_50
NeuroShard style:  python tools/gen_tasks.py --T-range 10,60 --max-dim 128 --max-mem 1 --out-dir data/ns_tasks
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from shardcore.cli import int_list, positive_float, positive_int, run_main  # noqa: E402
from shardcore.dataset import DEFAULT_DATA_DIR, load_dataset  # noqa: E402
from shardcore.errors import ShardError  # noqa: E402
from shardcore.tasks import save_tasks  # noqa: E402
from shardcore.taskgen import TaskSpec, generate_tasks, halving_dims  # noqa: E402
from shardcore.cli import ArgumentParser as OneLineParser, nonnegative_int  # noqa: E402
from shardcore.io import check_output_dir  # noqa: E402
from shardcore.tables import dim_problem  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", "--data_dir", default=DEFAULT_DATA_DIR,
                   help=f"processed dataset directory with table_configs.json (default {DEFAULT_DATA_DIR})")
    p.add_argument("--out-dir", "--out_dir", default=None,
                   help="where train.txt and test.txt go (default data/dlrm_tasks_<T>)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--T", type=positive_int, default=None, help="tables per task (default 50)")
    size.add_argument("--T-range", "--T_range", type=int_list, default=None, metavar="MIN,MAX",
                      help="draw the number of tables per task uniformly from MIN..MAX")
    p.add_argument("--num-train", type=nonnegative_int, default=50, help="number of training tasks (default 50)")
    p.add_argument("--num-test", type=nonnegative_int, default=50, help="number of test tasks (default 50)")
    p.add_argument("--train-fraction", type=float, default=0.5,
                   help="share of the dataset's tables in the training pool; the rest form the "
                        "disjoint test pool (default 0.5)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ns = p.add_argument_group("NeuroShard style (writes 'ids dims' lines)")
    dims = ns.add_mutually_exclusive_group()
    dims.add_argument("--dims", type=int_list, default=None, help="dims to draw from per table, e.g. 128,64,32,16,8,4")
    dims.add_argument("--max-dim", "--max_dim", type=positive_int, default=None,
                      help="shorthand for --dims MAX,MAX/2,..,4")
    ns.add_argument("--max-mem", "--max_mem", type=positive_float, default=None, metavar="GB",
                    help="per-device memory cap: keep only tasks whose tables each fit one device and "
                         "whose total fits --ndevices x GB")
    ns.add_argument("--ndevices", type=positive_int, default=4, help="devices assumed by --max-mem (default 4)")
    ns.add_argument("--weights-precision", choices=["fp16", "fp32"], default="fp16",
                    help="bytes per weight counted by --max-mem (default fp16)")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.T_range is not None:
        if len(args.T_range) != 2:
            raise ShardError(f"--T-range takes MIN,MAX, got {args.T_range}")
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
    if args.max_mem is not None and dims is None:
        raise ShardError("--max-mem selects NeuroShard-style tasks: give --dims or --max-dim too")
    out_dir = args.out_dir or os.path.join("data", f"dlrm_tasks_{t_max if t_min == t_max else f'{t_min}_{t_max}'}")
    check_output_dir(out_dir, "--out-dir")
    tables = load_dataset(args.data_dir, with_lookups=False).tables
    spec = TaskSpec(t_min=t_min, t_max=t_max, num_train=args.num_train, num_test=args.num_test,
                    train_fraction=args.train_fraction, seed=args.seed, dims=dims,
                    max_mem_gb=args.max_mem, ndevices=args.ndevices, precision=args.weights_precision)
    train, test = generate_tasks(tables, spec)
    save_tasks(os.path.join(out_dir, "train.txt"), train)
    save_tasks(os.path.join(out_dir, "test.txt"), test)
    style = "NeuroShard (ids dims)" if dims else "DreamShard (ids)"
    print(f"wrote {len(train)} train and {len(test)} test tasks, {t_min}..{t_max} tables each, "
          f"{style} style, to {out_dir}/")


if __name__ == "__main__":
    run_main(main)
