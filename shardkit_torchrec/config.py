"""TorchRec's planner's settings (``--torchrec-<field>``, for ``--alg torchrec``, ``torchrec-tw`` and
``torchrec-emu``): a module of its own, light to import (no TorchRec), so every script builds its flags
without it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shardcore.argtypes import positive_float
from shardcore.config import Config, param

MEMORY_MODELS = ("torchrec", "weights")


@dataclass
class TorchRecConfig(Config):
    """What TorchRec's planner is told besides the planning context."""

    flag_prefix: ClassVar[str] = "torchrec-"

    time: float | None = param(None, "TorchRec's planner stops proposing after S seconds (its timeout_seconds, rounded "
                               "up) and keeps the best plan so far; recorded in torchrec_config (default: no limit, "
                               "TorchRec's default; on 128 devices it can take tens of minutes on a small CPU)",
                               type=positive_float, metavar="S")
    memory: str = param("torchrec", "what TorchRec counts against the cap: torchrec (its training estimate, weights + "
                        "the batch's I/O buffers; the default) or weights (the weights alone, the cap's own "
                        "accounting: at batch 65536 the buffers of hundreds of tables fill a tight cap)",
                        type=str, choices=MEMORY_MODELS)
