#!/usr/bin/env python3
"""Pre-train NeuroShard's compute cost model on collected shards.

  python train_compute_cost_model.py --data_dir data/cost_data/compute --epochs 300 \\
      --out_path models/neuroshard/compute.pt

A table MLP over the 21 standardised features, summed over the shard, and a head predicting the
shard's forward and backward compute (ms). The samples are split into train / validation / test;
the epoch with the best validation MAPE is kept and the held-out test MAPE is printed. --data_dir
takes one or more directories (or CSV files), comma-separated.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tqdm import tqdm  # noqa: E402

from neuroshard import config  # noqa: E402
from neuroshard.cli import (add_original_training_args, add_training_args, apply_original_training_args,  # noqa: E402
                            first_samples, training_config)
from neuroshard.collect import load_compute_data  # noqa: E402
from neuroshard.models import fit_compute_model, save_model  # noqa: E402
from shardcore.cli import run_main  # noqa: E402
from shardcore.cli import ArgumentParser as OneLineParser  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data_dir", "--data-dir", dest="data_dir", default=config.COMPUTE_DATA_DIR,
                   help="compute cost data directory or CSV, comma-separated for several (default %(default)s)")
    p.add_argument("--out_path", "--out-path", dest="out_path", default=config.COMPUTE_MODEL,
                   help="where the model goes (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split and the initial weights (default 0)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_training_args(p, config.compute_model_config(), what="compute model")
    add_original_training_args(p)
    return p


def train(args) -> None:
    apply_original_training_args(args, config.compute_model_config())
    cfg = training_config(args, config.compute_model_config(), seed=args.seed)
    shards, costs, setting = load_compute_data(args.data_dir)
    shards, costs = first_samples(args.num_samples, shards, costs)
    print(f"{len(shards)} shards from {args.data_dir} (mean {costs.sum(1).mean():.2f} ms, "
          f"{sum(map(len, shards)) / max(1, len(shards)):.1f} tables per shard)")
    with tqdm(total=cfg.epochs, desc="compute model", unit="epoch", disable=args.quiet, dynamic_ncols=True) as bar:
        model, res = fit_compute_model(shards, costs, cfg, setting=setting, progress=bar)
    save_model(model, args.out_path)
    t = res.test_mape
    print(f"best epoch {res.best_epoch} (validation MAPE {res.val_mape:.2f}%), {res.seconds:.1f} s")
    print(f"held-out test MAPE ({res.num_test} shards): total {t['total']:.2f}%, forward {t['fw']:.2f}%, "
          f"backward {t['bw']:.2f}%")
    print(f"wrote {args.out_path}")


def main(argv=None):
    train(build_parser().parse_args(argv))


if __name__ == "__main__":
    run_main(main)
