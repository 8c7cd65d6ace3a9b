#!/usr/bin/env python3
"""Collect NeuroShard's compute cost data: random shards measured on the hardware oracle.

  python collect_compute_cost_data.py --gpu_devices 0,1,2,3 --max_tables 15 --max_mem 4 \\
      --max_dim 128 --dataset_dir data/dlrm_datasets --out_dir data/cost_data/compute

Each sample is a shard of 1..--max_tables tables from the dataset's training pool (the same seeded
train/test split as tools/gen_tasks.py; --pool all uses every table) with dims drawn from
--max_dim, --max_dim/2, .., 4 and at most --max_mem GB of weights; its forward and backward compute
are measured (and stored in the measurement cache, which also answers shards measured before).
Rows go to <out_dir>/compute_costs.csv; an existing file is appended to until it holds --data_size
samples (resumable; Ctrl-C loses at most one chunk).
"""

import argparse


from neuroshard import config
from shardcore.cli.common import serve_if_torchrun_rank
from shardcore.argtypes import fraction, seed_int
from shardcore.cli.common import add_device_args, device_ids
from neuroshard.collect import collect_compute
from shardcore.cli.common import add_memory_args, add_oracle_args, open_evaluator, run_main
from shardcore.argtypes import positive_int
from shardcore.dataset import DEFAULT_DATA_DIR
from shardcore.cli.common import ArgumentParser as OneLineParser
from neuroshard.collect import check_compute_args
from shardcore.io import check_output_dir


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data_size", "--data-size", dest="data_size", type=positive_int, default=config.COMPUTE_SAMPLES,
                   help="samples the output should hold; collection stops there (default %(default)s)")
    add_device_args(p, default_ndevices=1)
    p.add_argument("--max_tables", "--max-tables", dest="max_tables", type=positive_int, default=config.MAX_TABLES,
                   help="most tables in a shard (default %(default)s)")
    add_memory_args(p, default_max_memory=config.MAX_MEM_GB, default_precision="fp32")
    p.add_argument("--max_dim", "--max-dim", dest="max_dim", type=positive_int, default=config.MAX_DIM,
                   help="largest table dim; dims are max_dim, max_dim/2, .., 4 (default %(default)s)")
    p.add_argument("--dataset_dir", "--dataset-dir", "--data-dir", "--data_dir", dest="dataset_dir",
                   default=DEFAULT_DATA_DIR, help="processed dataset directory (default %(default)s)")
    p.add_argument("--out_dir", "--out-dir", dest="out_dir", default=config.COMPUTE_DATA_DIR,
                   help="output directory (default %(default)s)")
    p.add_argument("--pool", choices=["train", "test", "all"], default="train",
                   help="tables to draw from: the training pool of tools/gen_tasks.py's split (default), "
                        "its test pool, or all tables")
    p.add_argument("--train-fraction", type=fraction, default=config.TRAIN_FRACTION,
                   help="train pool share, as given to tools/gen_tasks.py (default %(default)s)")
    p.add_argument("--pool-seed", type=seed_int, default=config.POOL_SEED,
                   help="seed of the train/test split, as tools/gen_tasks.py's --seed (default %(default)s)")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the random shards (default 0)")
    p.add_argument("--from-cache", action="store_true",
                   help="also import every shard of the measurement cache (same setting, pool tables only)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_oracle_args(p)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    served = serve_if_torchrun_rank(args)   # torchrun ranks other than 0 measure, nothing else
    if served is not None:
        return served
    check_compute_args(args.max_tables, args.max_memory, args.max_dim)
    check_output_dir(args.out_dir, "--out_dir")
    with open_evaluator(args, args.dataset_dir, device_ids(args)) as ev:
        print(f"measuring on {ev.info.device_type} ({ev.ndevices} device(s), batch {ev.batch_size}, {ev.optimizer}, "
              f"{ev.precision}); workers up in {ev.info.startup_s:.1f} s")
        stats = collect_compute(ev, args.out_dir, args.data_size, max_tables=args.max_tables,
                                max_mem_gb=args.max_memory, max_dim=args.max_dim, pool=args.pool,
                                pool_seed=args.pool_seed, train_fraction=args.train_fraction, seed=args.seed,
                                from_cache=args.from_cache, progress=not args.quiet)
    print(f"{stats.path}: {stats.total} shards ({stats.added} added, {stats.from_cache} of them from the "
          f"measurement cache) in {stats.seconds:.1f} s")


if __name__ == "__main__":
    run_main(main)
