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


from tqdm import tqdm

from neuroshard import config
from neuroshard.cli import check_cost_model_outputs, cost_model_config, cost_model_parser, first_samples
from neuroshard.collect import load_comm_data
from neuroshard.checkpoints import save_model
from neuroshard.curve import write_curve
from neuroshard.fitting import fit_comm_model
from shardcore.cli.common import run_main
from shardcore.io import check_finite


def build_parser() -> argparse.ArgumentParser:
    return cost_model_parser(__doc__, config.COMM_DATA_DIR, "communication data",
                             [("fw_out_path", config.FW_COMM_MODEL, "forward model output (default %(default)s)"),
                              ("bw_out_path", config.BW_COMM_MODEL, "backward model output (default %(default)s)")],
                             config.comm_model_config(), what="communication models")


def train(args) -> None:
    check_cost_model_outputs(args, ("fw_out_path", "bw_out_path"))
    cfg = cost_model_config(args, config.comm_model_config())
    dims, delays, fw, bw, setting = load_comm_data(args.data_dir)
    dims, delays, fw, bw = first_samples(args.num_samples, dims, delays, fw, bw)
    print(f"{len(dims)} all-to-all samples from {args.data_dir}")
    fitted = []   # both fitted before either is written: a refused model leaves both files as they were
    for kind, targets, path in (("fw_comm", fw, args.fw_out_path), ("bw_comm", bw, args.bw_out_path)):
        with tqdm(total=cfg.epochs, desc=kind, unit="epoch", disable=args.quiet, dynamic_ncols=True) as bar:
            fitted.append((kind, path, *fit_comm_model(kind, dims, targets, delays, cfg, setting=setting,
                                                       progress=bar)))
    for kind, path, model, _ in fitted:   # both checked finite before either is written
        check_finite(model.state(), f"{path}: not saved", "training diverged; lower the learning rate")
    for kind, path, model, res in fitted:
        save_model(model, path)
        what = "forward" if kind == "fw_comm" else "backward"
        print(f"{what}: best epoch {res.best_epoch} (validation MAPE {res.val_mape:.2f}%), "
              f"held-out test MAPE {res.test_mape['per_device']:.2f}% per device ({res.num_test} samples); "
              f"wrote {path}")
    stem = os.path.join(os.path.dirname(args.fw_out_path) or ".", "comm")
    curve = write_curve({kind: res for kind, _, _, res in fitted}, f"{stem}_train_log.csv", f"{stem}_train_curve.png")
    print(f"learning curves: {', '.join(str(p) for p in curve)}")


def main(argv=None):
    train(build_parser().parse_args(argv))


if __name__ == "__main__":
    run_main(main)
