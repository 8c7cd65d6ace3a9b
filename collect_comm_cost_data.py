#!/usr/bin/env python3
"""Collect NeuroShard's communication cost data: real all-to-alls with random per-device loads and
random start delays.

  python collect_comm_cost_data.py --gpu_devices 0,1,2,3 --T_range 10,60 --sleep_range 0,200 \\
      --max_dim 128 --out_dir data/cost_data/comm_4

Each sample deals T tables (--T_range) with dims from --max_dim, --max_dim/2, .., 4 to the devices
with random imbalance, and lets every device start its forward all-to-all after a random delay
from --sleep_range (ms) that mimics imbalanced compute; per device the forward and backward
exchange times are measured. Rows go to <out_dir>/comm_costs.csv (one directory per device count);
an existing file is appended to until it holds --data_size samples.
"""

import argparse
import os

from neuroshard import config
from neuroshard.cli import add_collection_args
from neuroshard.collect import check_comm_args, collect_comm
from shardcore.cli.common import ArgumentParser as OneLineParser
from shardcore.cli.common import add_device_args, add_oracle_args, device_ids, num_devices, open_evaluator, run_main
from shardcore.cli.common import serve_if_torchrun_rank
from shardcore.errors import ShardError
from shardcore.cli.common import check_outputs
from shardcore.processes import output_lock


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_device_args(p, default_ndevices=4)
    add_collection_args(p, "comm")
    p.add_argument("--out_dir", "--out-dir", dest="out_dir", default=None,
                   help="output directory (default data/cost_data/comm_<number of devices>)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_oracle_args(p)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    served = serve_if_torchrun_rank(args)   # torchrun ranks other than 0 measure, nothing else
    if served is not None:
        return served
    ids = device_ids(args)
    ndevices = num_devices(args)
    if ndevices < 2:
        raise ShardError("communication needs at least 2 devices (--gpu_devices 0,1,...)")
    out_dir = args.out_dir or os.path.join(config.COST_DATA_DIR, f"comm_{ndevices}")
    check_comm_args(args.T_range, args.sleep_range, args.max_dim)
    check_outputs(args, {}, folders={"--out_dir": (out_dir, [config.COMM_CSV, config.META_JSON])})
    with output_lock(out_dir, "--out_dir"), open_evaluator(args, args.dataset_dir, ids) as ev:
        print(f"measuring on {ev.info.device_type} ({ev.ndevices} devices, batch {ev.batch_size}); "
              f"workers up in {ev.info.startup_s:.1f} s")
        stats = collect_comm(ev, out_dir, args.data_size, t_range=args.T_range, sleep_range=args.sleep_range,
                             max_dim=args.max_dim, seed=args.seed, from_cache=args.from_cache,
                             progress=not args.quiet)
    print(f"{stats.path}: {stats.total} samples ({stats.added} added, {stats.from_cache} of them from the "
          f"measurement cache) in {stats.seconds:.1f} s")


if __name__ == "__main__":
    run_main(main)
