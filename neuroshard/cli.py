"""Command-line flags shared by the NeuroShard scripts (both the original underscore spellings,
e.g. ``--gpu_devices``, and the dashed ones, e.g. ``--gpu-devices``, are accepted)."""

from __future__ import annotations

import argparse
import math

from shardcore.cli import positive_float, positive_int
from shardcore.errors import ShardError

from . import config
from .config import ModelConfig, SearchConfig


def float_list(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number")
    if not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"expected finite numbers, got {text!r}")
    return values


def add_model_paths(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("NeuroShard models")
    g.add_argument("--compute-model", "--compute_model", dest="compute_model", default=None, metavar="PT",
                   help=f"compute cost model (default {config.COMPUTE_MODEL})")
    g.add_argument("--fw-comm-model", "--fw_comm_model", dest="fw_comm_model", default=None, metavar="PT",
                   help=f"forward communication cost model (default {config.FW_COMM_MODEL})")
    g.add_argument("--bw-comm-model", "--bw_comm_model", dest="bw_comm_model", default=None, metavar="PT",
                   help=f"backward communication cost model (default {config.BW_COMM_MODEL})")


def model_kwargs(args: argparse.Namespace) -> dict:
    return {"compute_model": args.compute_model, "fw_comm_model": args.fw_comm_model,
            "bw_comm_model": args.bw_comm_model}


def add_search_args(p: argparse.ArgumentParser) -> None:
    d = SearchConfig()
    g = p.add_argument_group("NeuroShard search")
    g.add_argument("--k", type=positive_int, default=None, help=f"beam width of the column-wise search (default {d.k})")
    g.add_argument("--n", type=positive_int, default=None,
                   help=f"split candidates per step: the n largest and n most costly tables (default {d.n})")
    g.add_argument("--max-length", "--max_length", dest="max_length", type=int, default=None,
                   help=f"most column-wise steps, 0 = table-wise only (default {d.max_length})")
    g.add_argument("--search-steps", "--search_steps", dest="search_steps", type=positive_int, default=None,
                   help=f"dim-sum caps tried by the table-wise search (default {d.search_steps})")
    g.add_argument("--cap-start", type=positive_float, default=None,
                   help=f"smallest dim-sum cap, x the mean dim sum per device (default {d.cap_start})")
    g.add_argument("--cap-end", type=positive_float, default=None,
                   help=f"largest dim-sum cap (default {d.cap_end})")
    g.add_argument("--no-column-wise", action="store_true", help="table-wise search only: never split a table")


def search_kwargs(args: argparse.Namespace) -> dict:
    out = {k: getattr(args, k) for k in ("k", "n", "max_length", "search_steps", "cap_start", "cap_end")
           if getattr(args, k) is not None}
    if args.no_column_wise:
        out["column_wise"] = False
    return out


def add_training_args(p: argparse.ArgumentParser, defaults: ModelConfig, prefix: str = "",
                      what: str = "") -> None:
    """``--epochs``, ``--lr``, sizes ... for one model (``prefix`` e.g. ``comm-`` when a script trains several)."""
    g = p.add_argument_group(f"{what or 'model'} training")
    dest = prefix.replace("-", "_")

    def add(name, **kw):
        names = [f"--{prefix}{name}"]
        if "-" in name or prefix:
            names.append(f"--{(prefix + name).replace('-', '_')}")
        g.add_argument(*dict.fromkeys(names), dest=dest + name.replace("-", "_"), **kw)

    add("epochs", type=positive_int, default=defaults.epochs, help=f"training epochs (default {defaults.epochs})")
    add("lr", type=positive_float, default=defaults.lr, help=f"learning rate (default {defaults.lr})")
    add("train-batch-size", type=positive_int, default=defaults.batch_size,
        help=f"samples per gradient step (default {defaults.batch_size})")
    add("hidden", type=positive_int, default=defaults.hidden, help=f"MLP width (default {defaults.hidden})")
    add("embed", type=positive_int, default=defaults.embed,
        help=f"pooled representation width (default {defaults.embed})")
    add("head-hidden", type=positive_int, default=defaults.head_hidden,
        help=f"head MLP width (default {defaults.head_hidden})")
    add("val-fraction", type=float, default=defaults.val_fraction,
        help=f"share of samples for model selection (default {defaults.val_fraction})")
    add("test-fraction", type=float, default=defaults.test_fraction,
        help=f"share of samples held out for the test MAPE (default {defaults.test_fraction})")


def training_config(args: argparse.Namespace, defaults: ModelConfig, prefix: str = "", seed: int = 0) -> ModelConfig:
    dest = prefix.replace("-", "_")
    cfg = ModelConfig(**defaults.to_dict())
    cfg.epochs = getattr(args, dest + "epochs")
    cfg.lr = getattr(args, dest + "lr")
    cfg.batch_size = getattr(args, dest + "train_batch_size")
    cfg.hidden = getattr(args, dest + "hidden")
    cfg.embed = getattr(args, dest + "embed")
    cfg.head_hidden = getattr(args, dest + "head_hidden")
    cfg.val_fraction = getattr(args, dest + "val_fraction")
    cfg.test_fraction = getattr(args, dest + "test_fraction")
    cfg.seed = seed
    if not (0 < cfg.val_fraction < 1 and 0 < cfg.test_fraction < 1 and cfg.val_fraction + cfg.test_fraction < 1):
        raise ShardError("--val-fraction and --test-fraction must be in (0, 1) and sum to less than 1")
    return cfg


def add_original_training_args(p: argparse.ArgumentParser) -> None:
    """NeuroShard's train_*_cost_model.py flags: ``--batch_size`` (= ``--train-batch-size``),
    ``--train_ratio``/``--valid_ratio`` (the test share is the rest), ``--num_samples`` (train on the
    first N samples) and ``--eval_every`` (validation runs after every epoch here: 1 only)."""
    g = p.add_argument_group("NeuroShard's original flags")
    g.add_argument("--batch_size", dest="train_batch_size", type=positive_int, default=argparse.SUPPRESS,
                   metavar="B", help="NeuroShard's spelling of --train-batch-size")
    g.add_argument("--train_ratio", type=float, default=None, metavar="R",
                   help="share of samples for training (NeuroShard's default 0.8); the test share is "
                        "1 - train_ratio - valid_ratio")
    g.add_argument("--valid_ratio", type=float, default=None, metavar="R",
                   help="share of samples for validation (NeuroShard's default 0.1); = --val-fraction")
    g.add_argument("--num_samples", "--num-samples", dest="num_samples", type=positive_int, default=None,
                   metavar="N", help="use only the first N samples of the data (default: all)")
    g.add_argument("--eval_every", type=_eval_every, default=1, metavar="1",
                   help="epochs between validations: every epoch here (the best epoch is kept), so only 1")


def _eval_every(text: str) -> int:
    if text.strip() != "1":
        raise ShardError(f"--eval_every {text}: the model is validated after every epoch here and the best "
                         "epoch is kept; only --eval_every 1 is accepted")
    return 1


def apply_original_training_args(args: argparse.Namespace, defaults: ModelConfig) -> None:
    """Turn ``--train_ratio``/``--valid_ratio`` into ``val_fraction``/``test_fraction``."""
    if args.train_ratio is None and args.valid_ratio is None:
        return
    train = 0.8 if args.train_ratio is None else args.train_ratio
    valid = 0.1 if args.valid_ratio is None else args.valid_ratio
    test = 1.0 - train - valid
    if not (0 < train < 1 and 0 < valid < 1 and test > 1e-9):
        raise ShardError(f"--train_ratio {train:g} and --valid_ratio {valid:g} must leave a test share above 0 "
                         "(the held-out test MAPE is reported)")
    args.val_fraction, args.test_fraction = valid, test


def first_samples(n: int | None, *arrays):
    """The first ``n`` entries of each sequence (all of them when ``n`` is None)."""
    return arrays if n is None else tuple(a[:n] for a in arrays)
