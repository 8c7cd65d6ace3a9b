"""shardkit inside TorchRec: TorchRec's planning interfaces backed by shardkit and the emulated H200.

* :class:`~shardkit_torchrec.planner.ShardkitPlanner`: a TorchRec ``ShardingPlanner`` (``plan``,
  ``collective_plan``) that plans with shardkit and returns a ``ShardingPlan`` for
  ``DistributedModelParallel``;
* :class:`~shardkit_torchrec.estimator.EmulatedPerfEstimator`: a TorchRec ``ShardEstimator`` that prices
  sharding options with the emulated H200 and the exchange model, for TorchRec's own planner;
* :mod:`~shardkit_torchrec.stats`: a TorchRec model's tables as shardkit's ``TableConfig`` s;
* :mod:`~shardkit_torchrec.sharder`: ``--alg torchrec-emu`` (TorchRec's planner with that estimator),
  declared in ``shardkit_methods.PLANNERS``;
* :mod:`~shardkit_torchrec.torchrec_planner`: TorchRec's own planner as ``--alg torchrec`` and
  ``torchrec-tw``; :mod:`~shardkit_torchrec.torchrec_memory`: TorchRec's storage estimate beside the
  memory account.

This package may import :mod:`shardcore` and :mod:`shardkit_planner`; the core never imports it. The
classes are loaded on first use, so importing the package (as ``eval.py`` does for its plugin flags)
needs no TorchRec.
"""

from __future__ import annotations

import importlib

_LAZY = {"ShardkitPlanner": "planner", "EmulatedPerfEstimator": "estimator", "table_stats": "stats"}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
