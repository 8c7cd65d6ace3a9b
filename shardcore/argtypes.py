"""The value types of command-line flags (argparse ``type=`` callables): lists, finite and bounded
numbers, seeds, learning rates. A config field's flag takes one (:func:`shardcore.config.param`);
each refuses a bad value in one line."""

from __future__ import annotations

import argparse
import math
from typing import Callable


def _number_list(text: str, convert: Callable[[str], float], what: str) -> list:
    try:
        values = [convert(x) for x in text.split(",") if x.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated {what}s, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one {what}")
    return values


def int_list(text: str) -> list[int]:
    """argparse type for ``1,2,3``."""
    return _number_list(text, int, "integer")


def float_list(text: str) -> list[float]:
    """argparse type for ``0.5,20``: finite numbers."""
    values = _number_list(text, float, "number")
    if not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"expected finite numbers, got {text!r}")
    return values


def name_list(text: str) -> tuple[str, ...]:
    """argparse type for ``random,lookup_greedy``: at least one name, none twice."""
    names = tuple(a.strip() for a in text.split(",") if a.strip())
    if not names:
        raise argparse.ArgumentTypeError("expected at least one name")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a name is given twice: {text!r}")
    return names


def finite_float(text: str) -> float:
    """argparse type for a finite number (``nan`` and ``inf`` are refused)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return v


def nonnegative_float(text: str) -> float:
    v = finite_float(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return v


def positive_float(text: str) -> float:
    v = finite_float(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return v


def _int_at_least(text: str, low: int, what: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return v


def nonnegative_int(text: str) -> int:
    return _int_at_least(text, 0, "an integer >= 0")


def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


MAX_SEED = 2 ** 32 - 1


def seed_int(text: str) -> int:
    """argparse type for a random seed: an integer in ``0 .. 2**32 - 1`` (what numpy and torch accept)."""
    v = _int_at_least(text, 0, "a seed >= 0")
    if v > MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected a seed <= {MAX_SEED}, got {text!r}")
    return v


def bounded_float(low: float, high: float, what: str, low_open: bool = False) -> Callable[[str], float]:
    """argparse type for a finite number in ``[low, high]`` (``(low, high]`` with ``low_open``);
    ``what`` names it in the message."""
    def convert(text: str) -> float:
        v = finite_float(text)
        if (v <= low if low_open else v < low) or v > high:
            left = "(" if low_open else "["
            raise argparse.ArgumentTypeError(f"expected {what} in {left}{low:g}, {high:g}], got {text!r}")
        return v
    convert.__name__ = what.replace(" ", "_")
    return convert


#: a learning rate: positive, at most 1 (larger ones make every network here diverge to NaN at once)
learning_rate = bounded_float(0.0, 1.0, "a learning rate", low_open=True)
#: a modelled bandwidth in GB/s: a tiny (even subnormal) one makes every exchange cost infinite
bandwidth_gbps = bounded_float(1e-3, 1e6, "a bandwidth in GB/s")
#: a modelled latency in microseconds
latency_us = bounded_float(0.0, 1e6, "a latency in microseconds")
#: a share of something, 0..1
fraction = bounded_float(0.0, 1.0, "a fraction")
#: a time budget in seconds: positive, at most a day
seconds = bounded_float(0.0, 86400.0, "a number of seconds", low_open=True)


def bounded_int(low: int, high: int, what: str) -> Callable[[str], int]:
    """argparse type for an integer in ``[low, high]``."""
    def convert(text: str) -> int:
        v = _int_at_least(text, low, f"{what} >= {low}")
        if v > high:
            raise argparse.ArgumentTypeError(f"expected {what} <= {high}, got {text!r}")
        return v
    convert.__name__ = what.replace(" ", "_")
    return convert


MAX_DEVICES = 4096   # the most devices a plan may have


def device_count(text: str) -> int:
    """argparse type for a device count: 1 .. :data:`MAX_DEVICES` (planning time and memory grow with it)."""
    v = positive_int(text)
    if v > MAX_DEVICES:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_DEVICES} devices, got {text!r}")
    return v
