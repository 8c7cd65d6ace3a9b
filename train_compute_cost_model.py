#!/usr/bin/env python3
"""Pre-train NeuroShard's compute cost model on collected shards.

  python train_compute_cost_model.py --data_dir data/cost_data/compute --epochs 300 \\
      --out_path models/neuroshard/compute.pt

A table MLP over the 21 standardised features (22 with the bag-length CV, the default), summed over the shard, and a head predicting the
shard's forward and backward compute (ms). The samples are split into train / validation / test;
the epoch with the best validation MAPE is kept and the held-out test MAPE is printed. --data_dir
takes one or more directories (or CSV files), comma-separated.
"""

import argparse
import os


from tqdm import tqdm

from neuroshard import config
from neuroshard.cli import check_cost_model_outputs, cost_model_config, cost_model_parser, first_samples
from neuroshard.collect import load_compute_data
from neuroshard.checkpoints import save_model
from neuroshard.curve import write_curve
from neuroshard.fitting import fit_compute_model
from shardcore.cli.common import run_main


def build_parser() -> argparse.ArgumentParser:
    return cost_model_parser(__doc__, config.COMPUTE_DATA_DIR, "compute cost data",
                             [("out_path", config.COMPUTE_MODEL, "where the model goes (default %(default)s)")],
                             config.compute_model_config(), what="compute model")


def train(args) -> None:
    check_cost_model_outputs(args, ("out_path",))
    cfg = cost_model_config(args, config.compute_model_config())
    shards, costs, setting = load_compute_data(args.data_dir)
    shards, costs = first_samples(args.num_samples, shards, costs)
    print(f"{len(shards)} shards from {args.data_dir} (mean {costs.sum(1).mean():.2f} ms, "
          f"{sum(map(len, shards)) / max(1, len(shards)):.1f} tables per shard)")
    with tqdm(total=cfg.epochs, desc="compute model", unit="epoch", disable=args.quiet, dynamic_ncols=True) as bar:
        model, res = fit_compute_model(shards, costs, cfg, setting=setting, progress=bar)
    save_model(model, args.out_path)
    stem = os.path.splitext(args.out_path)[0]
    curve = write_curve({"compute": res}, f"{stem}_train_log.csv", f"{stem}_train_curve.png")
    t = res.test_mape
    print(f"best epoch {res.best_epoch} (validation MAPE {res.val_mape:.2f}%), {res.seconds:.1f} s")
    print(f"held-out test MAPE ({res.num_test} shards): total {t['total']:.2f}%, forward {t['fw']:.2f}%, "
          f"backward {t['bw']:.2f}%")
    print(f"wrote {args.out_path}; learning curve {', '.join(str(p) for p in curve)}")


def main(argv=None):
    train(build_parser().parse_args(argv))


if __name__ == "__main__":
    run_main(main)
