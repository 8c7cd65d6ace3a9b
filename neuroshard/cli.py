"""Command-line flags shared by the NeuroShard scripts (both the original underscore spellings,
e.g. ``--gpu_devices``, and the dashed ones, e.g. ``--gpu-devices``, are accepted)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Sequence

from shardcore.cli.common import check_replaces_kind, make_parser
from shardcore.argtypes import positive_int, fraction, seed_int
from shardcore.config import add_config_args, config_from_args, given_args
from shardcore.errors import ShardError

from . import config
from .config import ModelConfig, SearchConfig


def add_collection_args(p: argparse.ArgumentParser, script: str, group=None) -> None:
    """The collection flags of ``script`` (``"compute"``: collect_compute_cost_data.py, ``"comm"``:
    collect_comm_cost_data.py, ``"train"``: train_neuroshard.py), generated from
    :class:`~neuroshard.config.CollectionConfig`: its fields of the groups :data:`config.COLLECTION_GROUPS`
    gives the script (into ``group`` when given) and the ungrouped ones (into ``p``). A collect script's
    ``--data_size`` defaults to its kind's samples."""
    take = config.COLLECTION_GROUPS[script]
    skip = tuple(sorted({g for groups in config.COLLECTION_GROUPS.values() for g in groups} - set(take)))
    defaults = config.COLLECTION
    if "data-size" in take:
        defaults = dataclasses.replace(defaults, data_size=getattr(defaults, f"{script}_samples"))
    add_config_args(p, defaults, groups={g: group for g in take} if group is not None else None, skip_groups=skip)


def add_search_args(p: argparse.ArgumentParser) -> None:
    add_config_args(p.add_argument_group("NeuroShard search"), SearchConfig())


def search_kwargs(args: argparse.Namespace) -> dict:
    """The search flags given on the command line (the others keep the bundle's or the defaults)."""
    return given_args(SearchConfig, args)


def cost_model_parser(description: str, data_dir: str, data_help: str, outputs: Sequence[tuple[str, str, str]],
                      defaults: ModelConfig, what: str) -> argparse.ArgumentParser:
    """The parser of train_compute_cost_model.py / train_comm_cost_model.py: ``--data_dir``, one flag
    per ``(name, default, help)`` of ``outputs`` (``--out_path`` and ``--out-path``), ``--seed``,
    ``--quiet``, the model's training flags and NeuroShard's original ones."""
    p = make_parser(description)
    p.add_argument("--data_dir", "--data-dir", dest="data_dir", default=data_dir,
                   help=f"{data_help} directory or CSV, comma-separated for several (default %(default)s)")
    for name, default, help_text in outputs:
        p.add_argument(f"--{name}", f"--{name.replace('_', '-')}", dest=name, default=default, help=help_text)
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the split and the initial weights (default 0)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_training_args(p, defaults, what=what)
    add_original_training_args(p)
    return p


def check_cost_model_outputs(args: argparse.Namespace, names: Sequence[str]) -> None:
    """Before training: every model output (``names``: dests of :func:`cost_model_parser`'s output
    flags) is writable, names neither the cost data (a directory's CSV and meta file, or a CSV given
    directly) nor the other output, and replaces no file but a torch one."""
    from pathlib import Path

    from shardcore import io

    inputs = {}
    for k, part in enumerate(p for p in str(args.data_dir).split(",") if p.strip()):
        path = Path(part.strip())
        files = ([path / config.COMPUTE_CSV, path / config.COMM_CSV, path / config.META_JSON, path / "data.txt"]
                 if path.is_dir() else [path])
        for f in files:
            inputs[f"--data_dir {f}"] = f
    outputs = {f"--{n}": getattr(args, n) for n in names}
    kinds = {flag: "a zip/torch file" for flag in outputs}
    if all(outputs.values()):   # and the learning curve written beside the models (write_curve)
        stem = curve_stem(args, names[0])
        outputs.update({"learning curve": f"{stem}_train_log.csv", "learning curve figure": f"{stem}_train_curve.png"})
        kinds["learning curve figure"] = "a PNG image"
    io.check_outputs(outputs, inputs)
    for flag, path in outputs.items():
        check_replaces_kind(path, kinds.get(flag, "text"), flag)


def curve_stem(args: argparse.Namespace, name: str) -> str:
    """Where a cost-model script writes its learning curve: beside ``--out_path`` (compute), in the folder
    of ``--fw_out_path`` (communication: ``comm_train_log.csv``)."""
    import os

    if name == "out_path":
        return os.path.splitext(args.out_path)[0]
    return os.path.join(os.path.dirname(args.fw_out_path) or ".", "comm")


def cost_model_config(args: argparse.Namespace, defaults: ModelConfig) -> ModelConfig:
    """The training config of a cost-model script's command line (NeuroShard's ratios included)."""
    apply_original_training_args(args, defaults)
    return training_config(args, defaults, seed=args.seed)


def add_training_args(p: argparse.ArgumentParser, defaults: ModelConfig, prefix: str = "",
                      what: str = "") -> None:
    """``--epochs``, ``--lr``, sizes ... for one model (``prefix`` e.g. ``comm-`` when a script trains several)."""
    skip = (config.COMPUTE_ONLY,) if what.startswith("communication") else ()
    add_config_args(p.add_argument_group(f"{what or 'model'} training"), defaults, prefix=prefix,
                    underscore_aliases=True, skip_groups=skip)


def training_config(args: argparse.Namespace, defaults: ModelConfig, prefix: str = "", seed: int = 0) -> ModelConfig:
    cfg = config_from_args(ModelConfig, args, base=defaults, prefix=prefix, seed=seed)
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
    g.add_argument("--train_ratio", type=fraction, default=None, metavar="R",
                   help="share of samples for training (NeuroShard's default 0.8); the test share is "
                        "1 - train_ratio - valid_ratio")
    g.add_argument("--valid_ratio", type=fraction, default=None, metavar="R",
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
