"""What every planner is given besides the tables: one :class:`PlanningContext` -- the topology, the
batch, the landscape the plans will be judged on (the parsed ``--oracle``) -- and its own
:class:`~shardcore.config.Config` (its flags); the registry of planners
(:mod:`shardcore.cli.planners`) builds each from these two and nothing else.

The landscape's name is parsed here once, by one rule (:func:`parse_landscape`): the oracle factory,
the command lines and every planner read the same canonical name (``measured``, ``emulated:h200`` or
``emulated:<card file>``, a calibrated card that ``tools/calibrate.py`` wrote).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass

from shardcore.errors import ShardError
from shardcore.topology import Topology

#: the batch a planner that prices lookups per batch assumes where nobody says which batch the plans run at
DEFAULT_BATCH_SIZE = 4096

MEASURED = "measured"
EMULATED_PREFIX = "emulated:"
EMULATED_CARDS = ("h200",)            # the cards data/gpu_measurements/ emulates
LANDSCAPES = (MEASURED,) + tuple(EMULATED_PREFIX + c for c in EMULATED_CARDS)
#: the format of a calibrated card file (shardcore.oracles.emulated.card reads it whole)
CARD_FORMAT = "shardkit-card/1"

#: which fit of an emulated card judges a plan: refitted without every measured shard that holds one of
#: its tables (``heldout``), without those made only of its tables (``devices``), or the shipped fit
HELDOUT, DEVICES, FULL = "heldout", "devices", "full"
EMULATOR_FITS = (HELDOUT, DEVICES, FULL)


def parse_landscape(spec: str) -> str:
    """The canonical landscape of an ``--oracle`` value (``hw``/``hardware`` are ``measured``;
    ``emulated-h200`` is ``emulated:h200``; ``emulated:<path>`` names a card file, kept as written), or a
    one-line error naming the choices. A card path must be a file of :data:`CARD_FORMAT` (its contents are
    checked whole where the card is loaded, :mod:`shardcore.oracles.emulated.card`)."""
    text = str(spec).strip()
    key = text.lower()
    if key in (MEASURED, "hardware", "hw"):
        return MEASURED
    if key.startswith("emulated-"):
        key = EMULATED_PREFIX + key[len("emulated-"):]
    if key in LANDSCAPES:
        return key
    path = text[len(EMULATED_PREFIX):] if key.startswith(EMULATED_PREFIX) else ""
    if path and (path.lower().endswith(".json") or os.sep in path or os.path.isfile(path)):
        check_card_file(path)
        return EMULATED_PREFIX + path
    raise ShardError(f"unknown oracle {spec!r}: choose one of {', '.join(LANDSCAPES)} or emulated:CARD.json "
                     "(a card tools/calibrate.py wrote)")


def is_card_file(card: str | None) -> bool:
    """Whether an emulated landscape's card (:attr:`Landscape.card`) is a card file, not a shipped card."""
    return bool(card) and card not in EMULATED_CARDS


def check_card_file(path: str) -> None:
    """A one-line error unless ``path`` is a readable JSON object of :data:`CARD_FORMAT`."""
    try:
        st = os.stat(path)
    except OSError:
        raise ShardError(f"emulated:{path}: no such card file (tools/calibrate.py writes one)") from None
    _card_format(os.path.abspath(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=32)
def _card_format(path: str, mtime_ns: int, size: int) -> None:
    try:
        with open(path, "rb") as fh:
            obj = json.loads(fh.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ShardError(f"emulated:{path}: not a readable card ({type(exc).__name__}: {exc})") from None
    found = obj.get("format") if isinstance(obj, dict) else None
    if found != CARD_FORMAT:
        raise ShardError(f"emulated:{path}: not a card file (format {found!r}, expected {CARD_FORMAT!r}; "
                         "tools/calibrate.py writes cards)")


def landscape_arg(text: str) -> str:
    """argparse type of a flag naming a landscape: :func:`parse_landscape`'s rule."""
    import argparse

    try:
        return parse_landscape(text)
    except ShardError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def check_emulator_fit(fit: str, what: str = "emulator fit") -> str:
    """``fit`` when it names an emulator fit (:data:`EMULATOR_FITS`), else a one-line error naming ``what``
    (a flag)."""
    if fit not in EMULATOR_FITS:
        raise ShardError(f"{what} must be one of {', '.join(EMULATOR_FITS)}, got {fit!r}")
    return fit


@dataclass(frozen=True)
class Landscape:
    """The cost landscape plans are made for: the oracle that will judge them (``name``, canonical; None
    where nobody said, e.g. ``plan.py`` without ``--oracle``), the emulated card's fit, the exchange
    model's constants (None: the model's defaults), the dataset and, for the measured one, this machine's
    measurement cache."""

    name: str | None = None
    fit: str = HELDOUT
    comm_bandwidth: float | None = None          # GB/s per device and direction within a host
    comm_latency: float | None = None            # us
    inter_host_bandwidth: float | None = None    # GB/s between hosts
    inter_host_latency: float | None = None      # us
    data_dir: str | None = None
    cache_path: str | None = None

    def __post_init__(self):
        if self.name is not None:
            object.__setattr__(self, "name", parse_landscape(self.name))
        check_emulator_fit(self.fit)

    @property
    def emulated(self) -> bool:
        return self.name is not None and self.name.startswith(EMULATED_PREFIX)

    @property
    def card(self) -> str | None:
        """The emulated card (``h200``, or a card file's path), None on the measured landscape."""
        return self.name[len(EMULATED_PREFIX):] if self.emulated else None

    def comm_kwargs(self, topology: Topology) -> dict:
        """The exchange model's settings as :meth:`shardcore.oracles.commmodel.CommModel.of` takes them,
        with the topology's hosts; only those given."""
        given = {"comm_bandwidth": self.comm_bandwidth, "comm_latency": self.comm_latency,
                 "devices_per_host": topology.devices_per_host or None,
                 "inter_host_bandwidth": self.inter_host_bandwidth, "inter_host_latency": self.inter_host_latency}
        return {k: v for k, v in given.items() if v is not None}


@dataclass(frozen=True)
class PlanningContext:
    """What every planner is built with: the topology it plans for (devices, hosts, memory cap,
    precision), the batch the plans run at (None: not known, :data:`DEFAULT_BATCH_SIZE` assumed where
    a planner needs one), the landscape, the seed of planners that draw, and the task files being evaluated (a planner that
    calibrates on this machine never measures their tables)."""

    topology: Topology
    batch_size: int | None = None
    landscape: Landscape = Landscape()
    seed: int = 0
    evaluated_tasks: tuple[str, ...] = ()

    @property
    def batch(self) -> int:
        """The batch to plan for: the one given, else :data:`DEFAULT_BATCH_SIZE`."""
        return int(self.batch_size) if self.batch_size else DEFAULT_BATCH_SIZE

    @property
    def oracle(self) -> str | None:
        """The landscape's canonical name, None where none is known."""
        return self.landscape.name
