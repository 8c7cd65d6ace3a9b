#!/usr/bin/env python3
"""Pre-train NeuroShard's forward and backward communication cost models.

  python train_comm_cost_model.py --data_dir data/cost_data/comm_4 --epochs 400 \\
      --fw_out_path models/neuroshard/fw_comm.pt --bw_out_path models/neuroshard/bw_comm.pt

Forward: each device's time from the per-device dim sums and start delays; backward: from the dim
sums. Per-device features plus pooled context over the devices make both permutation-equivariant
and independent of the device count (--data_dir may list directories of several device counts,
comma-separated). The epoch with the best validation MAPE is kept; held-out test MAPEs are printed.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tqdm import tqdm  # noqa: E402

from neuroshard import config  # noqa: E402
from neuroshard.cli import (add_original_training_args, add_training_args, apply_original_training_args,  # noqa: E402
                            first_samples, training_config)
from neuroshard.collect import load_comm_data  # noqa: E402
from neuroshard.models import fit_comm_model, save_model  # noqa: E402
from shardcore.cli import run_main  # noqa: E402
from shardcore.cli import ArgumentParser as OneLineParser  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data_dir", "--data-dir", dest="data_dir", default=config.COMM_DATA_DIR,
                   help="communication data directory or CSV, comma-separated for several (default %(default)s)")
    p.add_argument("--fw_out_path", "--fw-out-path", dest="fw_out_path", default=config.FW_COMM_MODEL,
                   help="forward model output (default %(default)s)")
    p.add_argument("--bw_out_path", "--bw-out-path", dest="bw_out_path", default=config.BW_COMM_MODEL,
                   help="backward model output (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split and the initial weights (default 0)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_training_args(p, config.comm_model_config(), what="communication models")
    add_original_training_args(p)
    return p


def train(args) -> None:
    apply_original_training_args(args, config.comm_model_config())
    cfg = training_config(args, config.comm_model_config(), seed=args.seed)
    dims, delays, fw, bw, setting = load_comm_data(args.data_dir)
    dims, delays, fw, bw = first_samples(args.num_samples, dims, delays, fw, bw)
    print(f"{len(dims)} all-to-all samples from {args.data_dir}")
    for kind, targets, path in (("fw_comm", fw, args.fw_out_path), ("bw_comm", bw, args.bw_out_path)):
        with tqdm(total=cfg.epochs, desc=kind, unit="epoch", disable=args.quiet, dynamic_ncols=True) as bar:
            model, res = fit_comm_model(kind, dims, targets, delays, cfg, setting=setting, progress=bar)
        save_model(model, path)
        what = "forward" if kind == "fw_comm" else "backward"
        print(f"{what}: best epoch {res.best_epoch} (validation MAPE {res.val_mape:.2f}%), "
              f"held-out test MAPE {res.test_mape['per_device']:.2f}% per device ({res.num_test} samples); "
              f"wrote {path}")


def main(argv=None):
    train(build_parser().parse_args(argv))


if __name__ == "__main__":
    run_main(main)
