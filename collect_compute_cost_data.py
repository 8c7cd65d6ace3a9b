#!/usr/bin/env python3
"""Collect NeuroShard's compute cost data: random shards measured on the hardware oracle.

  python collect_compute_cost_data.py --gpu_devices 0,1,2,3 --max_tables 15 --max_mem 4 \\
      --max_dim 128 --dataset_dir data/dlrm_datasets --out_dir data/cost_data/compute

Each sample is a shard of 1..--max_tables tables of the dataset (every table, as the original; --pool
train keeps to the training pool of tools/gen_tasks.py's seeded split, so its test tables stay unseen) with dims drawn from
--max_dim, --max_dim/2, .., 4 and at most --max_mem GB of weights; its forward and backward compute
are measured (and stored in the measurement cache, which also answers shards measured before).
Rows go to <out_dir>/compute_costs.csv; an existing file is appended to until it holds --data_size
samples (resumable; Ctrl-C loses at most one chunk).
"""

import argparse

from neuroshard import config
from neuroshard.cli import add_collection_args
from neuroshard.collect import check_compute_args, collect_compute
from shardcore.cli.common import ArgumentParser as OneLineParser
from shardcore.cli.common import add_device_args, add_memory_args, add_oracle_args, device_ids, open_evaluator, run_main
from shardcore.cli.common import serve_if_torchrun_rank
from shardcore.cli.common import check_outputs
from shardcore.processes import output_lock


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_device_args(p, default_ndevices=1)
    add_memory_args(p, default_max_memory=config.COLLECTION.max_mem_gb,
                    default_precision=config.COLLECTION.weights_precision)
    add_collection_args(p, "compute")
    p.add_argument("--out_dir", "--out-dir", dest="out_dir", default=config.COMPUTE_DATA_DIR,
                   help="output directory (default %(default)s)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_oracle_args(p)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    served = serve_if_torchrun_rank(args)   # torchrun ranks other than 0 measure, nothing else
    if served is not None:
        return served
    check_compute_args(args.max_tables, args.max_memory, args.max_dim)
    check_outputs(args, {}, folders={"--out_dir": (args.out_dir, [config.COMPUTE_CSV, config.META_JSON])})
    with output_lock(args.out_dir, "--out_dir"), open_evaluator(args, args.dataset_dir, device_ids(args)) as ev:
        print(f"measuring on {ev.info.device_type} ({ev.ndevices} device(s), batch {ev.batch_size}, {ev.optimizer}, "
              f"{ev.precision}); workers up in {ev.info.startup_s:.1f} s")
        stats = collect_compute(ev, args.out_dir, args.data_size, max_tables=args.max_tables,
                                max_mem_gb=args.max_memory, max_dim=args.max_dim, pool=args.pool,
                                pool_seed=args.pool_seed, train_fraction=args.train_fraction, seed=args.seed,
                                from_cache=args.from_cache, progress=not args.quiet,
                                group_tables=args.group_tables, group_shards=args.group_shards,
                                whole_share=args.whole_share, pf_augment=args.pf_augment)
    print(f"{stats.path}: {stats.total} shards ({stats.added} added, {stats.from_cache} of them from the "
          f"measurement cache) in {stats.seconds:.1f} s")


if __name__ == "__main__":
    run_main(main)
