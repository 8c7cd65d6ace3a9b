"""AutoShard checkpoints and inference (greedy: the highest-scoring legal device at every step).

A checkpoint is a dict of plain tensors, numbers and strings (loads with ``weights_only=True``):
``method`` ("autoshard"), ``version``, ``config``, ``scaler`` (feature standardisation fitted on the
training tables), ``cost_scale`` (ms per cost-model unit), ``net`` and ``cost_model`` state dicts,
``steps`` (environment steps trained), and ``extra`` (learner state for ``--resume``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from shardcore import io
from shardcore.baselines import Sharder
from shardcore.errors import InfeasibleError, ShardError
from shardcore.plan import Plan
from shardcore.tables import FeatureScaler, TableConfig

from .config import AutoShardConfig
from .env import ShardingEnv, stack_obs
from .networks import AutoShardNet, CostModel

METHOD = "autoshard"
VERSION = 1
DEFAULT_CHECKPOINT = "models/autoshard/default/model.pt"


@dataclass
class AutoShardModel:
    cfg: AutoShardConfig
    scaler: FeatureScaler
    net: AutoShardNet
    cost_model: CostModel
    cost_scale: float = 1.0
    steps: int = 0
    extra: dict = field(default_factory=dict)

    @classmethod
    def new(cls, cfg: AutoShardConfig, scaler: FeatureScaler) -> "AutoShardModel":
        torch.manual_seed(cfg.seed)
        return cls(cfg, scaler, AutoShardNet(cfg), CostModel(cfg))

    def env(self, ndevices: int, max_memory_gb: float, precision: str = "fp16") -> ShardingEnv:
        return ShardingEnv(self.scaler, self.cost_model if self.cfg.use_cost_model else None, ndevices,
                           max_memory_gb, precision)

    def save(self, path: str | os.PathLike) -> None:
        io.save_checkpoint({"method": METHOD, "version": VERSION, "config": self.cfg.to_dict(),
                       "scaler": self.scaler.to_state(), "cost_scale": float(self.cost_scale),
                       "net": self.net.state_dict(), "cost_model": self.cost_model.state_dict(),
                       "steps": int(self.steps), "extra": self.extra}, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "AutoShardModel":
        obj = io.load_checkpoint(path, METHOD, VERSION, "an AutoShard")
        with io.checkpoint_contents(path):
            cfg = AutoShardConfig.from_dict(obj["config"])
            model = cls(cfg, FeatureScaler.from_state(obj["scaler"]), AutoShardNet(cfg), CostModel(cfg),
                        float(obj["cost_scale"]), int(obj["steps"]), obj.get("extra", {}))
            model.net.load_state_dict(obj["net"])
            model.cost_model.load_state_dict(obj["cost_model"])
        return model

    @torch.no_grad()
    def place(self, tables: Sequence[TableConfig], ndevices: int, max_memory_gb: float,
              precision: str = "fp16") -> tuple[list[int], float]:
        """Greedy placement; returns the allocation and the memory overflow in GB (0 if feasible)."""
        env = self.env(ndevices, max_memory_gb, precision)
        obs = env.reset(tables)
        state = self.net.initial_state(1)
        done = torch.tensor([[True]])
        while obs is not None:
            inputs = stack_obs([obs])
            inputs["done"] = done
            logits, _, state = self.net(inputs, state)
            done = torch.tensor([[False]])
            obs = env.step(int(logits[0, 0].argmax()))
        return list(env.allocation), env.overflow_gb()


@dataclass
class AutoShardSharder(Sharder):
    model: AutoShardModel = None

    def shard(self, tables, ndevices, max_memory_gb, precision="fp16"):
        alloc, over = self.model.place(tables, ndevices, max_memory_gb, precision)
        if over > 0:
            raise InfeasibleError(f"infeasible: the AutoShard policy ran out of room under the "
                                  f"{max_memory_gb:g} GB cap (over by {over:.3f} GB)")
        return Plan(tuple(alloc), ndevices)


def load_sharder(path=None, checkpoint=None, **_) -> AutoShardSharder:
    """``--alg PATH.pt``, or ``--alg autoshard`` with ``--checkpoint PATH`` (default
    models/autoshard/default/model.pt, where ``train_autoshard.py`` writes by default)."""
    path = path or checkpoint or DEFAULT_CHECKPOINT
    if not Path(path).is_file():
        raise ShardError(f"AutoShard checkpoint not found: {path} (train one with train_autoshard.py, "
                         "or pass --checkpoint PATH)")
    model = AutoShardModel.load(path)
    model.net.eval()
    model.cost_model.eval()
    return AutoShardSharder(name=str(path) if path != DEFAULT_CHECKPOINT else "autoshard", model=model)
