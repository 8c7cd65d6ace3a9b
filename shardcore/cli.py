"""Shared command-line plumbing: common flags and the one-line error convention."""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

from .errors import ShardError
from .tables import PRECISION_BYTES


def run_main(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None) -> None:
    """Run a script's ``main``; a :class:`ShardError` prints ``error: <message>`` and exits 2,
    Ctrl-C exits 130 without a traceback."""
    try:
        code = main(argv)
    except ShardError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)


def int_list(text: str) -> list[int]:
    """argparse type for ``1,2,3``."""
    try:
        values = [int(x) for x in text.split(",") if x.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return v


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def add_device_args(parser: argparse.ArgumentParser, default_ndevices: int = 4) -> None:
    """``--gpu-devices 0,1,2,3`` or ``--ndevices N`` (on a CPU: N logical devices)."""
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--gpu-devices", type=int_list, default=None, metavar="IDS",
                   help="devices to shard over, e.g. 0,1,2,3; on a CPU-only machine these are logical "
                        f"devices (default: {default_ndevices} devices)")
    g.add_argument("--ndevices", type=positive_int, default=None, metavar="N",
                   help=f"number of devices, same as --gpu-devices 0,..,N-1 (default {default_ndevices})")
    parser.set_defaults(_default_ndevices=default_ndevices)


def device_ids(args: argparse.Namespace) -> list[int]:
    if args.gpu_devices is not None:
        ids = list(args.gpu_devices)
        if len(set(ids)) != len(ids) or min(ids) < 0:
            raise ShardError(f"--gpu-devices must list distinct non-negative ids, got {ids}")
        return ids
    return list(range(args.ndevices or args._default_ndevices))


def add_memory_args(parser: argparse.ArgumentParser, default_max_memory: float = 5.0) -> None:
    parser.add_argument("--max-memory", "--max_mem", dest="max_memory", type=positive_float,
                        default=default_max_memory, metavar="GB",
                        help=f"memory cap per device for embedding weights, in GB (default {default_max_memory})")
    parser.add_argument("--weights-precision", choices=sorted(PRECISION_BYTES), default="fp16",
                        help="weight precision: fp16 counts 2 bytes per weight toward the cap, fp32 "
                             "counts 4 (default fp16, as the original code)")
