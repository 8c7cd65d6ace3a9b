"""AutoShard checkpoints and inference (greedy: the highest-scoring legal device at every step; with
``decode_samples`` N, the best by the cost model of the greedy plan and N plans sampled from the policy).

A checkpoint is a dict of plain tensors, numbers and strings (loads with ``weights_only=True``):
``method`` ("autoshard"), ``version``, ``config``, ``scaler`` (feature standardisation fitted on the
training tables), ``cost_scale`` (ms per cost-model unit), ``net`` and ``cost_model`` state dicts,
``steps`` (environment steps trained), and ``extra`` (learner state for ``--resume``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from shardcore import io
from shardcore.oracles.setting import PRODUCED_BY, produced_by
from shardcore.baselines import Sharder
from shardcore.errors import InfeasibleError, ShardError
from shardcore.plan import Plan
from shardcore.planning import PlanningContext
from shardcore.tables import TableConfig
from shardcore.data.features import FeatureScaler
from shardcore.topology import Topology

from .config import DEFAULT_CHECKPOINT, AutoShardConfig, PlannerConfig
from .env import ShardingEnv
from .networks import AutoShardNet, CostModel

METHOD = "autoshard"
VERSION = 1


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
        cfg = dataclasses.replace(cfg, length_cv_feature=scaler.cv_default is not None)   # the scaler's features
        torch.manual_seed(cfg.seed)
        return cls(cfg, scaler, AutoShardNet(cfg), CostModel(cfg))

    def env(self, topology: Topology) -> ShardingEnv:
        return ShardingEnv(self.scaler, self.cost_model if self.cfg.use_cost_model else None, topology,
                           scaled_device_features=self.cfg.scaled_device_features,
                           relative_costs=self.cfg.relative_costs)

    def save(self, path: str | os.PathLike, extra: dict | None = None) -> None:
        """The checkpoint, with ``extra`` in place of the model's own ``extra`` where given."""
        extra = self.extra if extra is None else extra
        io.save_checkpoint({"method": METHOD, "version": VERSION, "config": self.cfg.to_dict(),
                       "scaler": self.scaler.to_state(), "cost_scale": float(self.cost_scale),
                       "net": self.net.state_dict(), "cost_model": self.cost_model.state_dict(),
                       "steps": int(self.steps), "extra": extra,
                       PRODUCED_BY: produced_by("train_autoshard.py", (extra.get("provenance") or {}).get("hardware"))},
                      path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "AutoShardModel":
        obj = io.load_checkpoint(path, METHOD, VERSION, "an AutoShard")
        with io.checkpoint_contents(path):
            # a checkpoint written before these options existed: no CV feature, the plain observation
            cfg = AutoShardConfig.from_dict({"length_cv_feature": False, "scaled_device_features": False,
                                             "relative_costs": False, **obj["config"]})
            model = cls(cfg, FeatureScaler.from_state(obj["scaler"]), AutoShardNet(cfg), CostModel(cfg),
                        float(obj["cost_scale"]), int(obj["steps"]), obj.get("extra", {}))
            model.net.load_state_dict(obj["net"])
            model.cost_model.load_state_dict(obj["cost_model"])
        return model

    @torch.no_grad()
    def place(self, tables: Sequence[TableConfig], topology: Topology, samples: int | None = None,
              seed: int = 0) -> tuple[list[int], float]:
        """The greedy plan (argmax at every step), or with ``samples`` > 0 (default: the config's
        ``decode_samples``) the best of it and ``samples`` plans sampled from the policy, best by the
        cost model's predicted slowest device (feasible plans first). Returns the allocation and the
        memory overflow in GiB (0 if feasible)."""
        samples = self.cfg.decode_samples if samples is None else int(samples)
        if samples <= 0 or not self.cfg.use_cost_model:
            allocs, overs = self.rollouts(tables, topology, 0, seed)
            return allocs[0], overs[0]
        allocs, overs = self.rollouts(tables, topology, samples, seed)
        scores = [(over > 0, over, self.predicted_plan_cost(tables, a, topology.ndevices), k)
                  for k, (a, over) in enumerate(zip(allocs, overs))]
        best = min(scores)[3]
        return allocs[best], overs[best]

    @torch.no_grad()
    def rollouts(self, tables: Sequence[TableConfig], topology: Topology, samples: int,
                 seed: int = 0) -> tuple[list[list[int]], list[float]]:
        """1 + ``samples`` episodes run side by side: the first argmax, the others sampled from the
        policy (a generator seeded with ``seed``, so a plan is reproducible)."""
        gen = torch.Generator().manual_seed(int(seed))
        envs = [self.env(topology) for _ in range(1 + samples)]
        obs = [e.reset(tables) for e in envs]
        state = self.net.initial_state(len(envs))
        done = torch.ones(1, len(envs), dtype=torch.bool)
        while obs[0] is not None:
            inputs = {k: torch.stack([o[k] for o in obs]).unsqueeze(0) for k in ("table", "frac", "action", "mask")}
            inputs["done"] = done
            logits, _, state = self.net(inputs, state)
            done = torch.zeros(1, len(envs), dtype=torch.bool)
            acts = [int(logits[0, 0].argmax())]
            if samples:
                acts += torch.multinomial(torch.softmax(logits[0, 1:], -1), 1, generator=gen).squeeze(-1).tolist()
            obs = [e.step(a) for e, a in zip(envs, acts)]
        return [list(e.allocation) for e in envs], [e.overflow_gb() for e in envs]

    @torch.no_grad()
    def predicted_plan_cost(self, tables: Sequence[TableConfig], allocation: Sequence[int], ndevices: int) -> float:
        """The cost model's predicted cost (ms) of the plan's slowest device."""
        emb = self.cost_model.embed(torch.from_numpy(self.scaler.transform(list(tables))).float())
        summed = torch.zeros(ndevices, emb.shape[1]).index_add_(0, torch.tensor(list(allocation)), emb)
        used = torch.zeros(ndevices, dtype=torch.bool)
        used[list(allocation)] = True
        return float((self.cost_model.cost(summed) * used.float()).max()) * self.cost_scale


@dataclass
class AutoShardSharder(Sharder):
    model: AutoShardModel = None

    def shard(self, tables, topology):
        alloc, over = self.model.place(tables, topology)
        if over > 0:
            raise InfeasibleError(f"infeasible: the AutoShard policy ran out of room under the "
                                  f"{topology.max_memory_gb:g} GiB cap (over by {over:.3f} GiB)")
        return Plan.table_wise(tables, alloc, topology)


def make_sharder(ctx: PlanningContext, config: PlannerConfig | None = None, checkpoint=None,
                 planners=None) -> AutoShardSharder:
    """``--alg PATH.pt``, or ``--alg autoshard`` with ``--checkpoint PATH`` (``config.checkpoint``; default
    models/autoshard/default/model.pt, where ``train_autoshard.py`` writes by default)."""
    return load_sharder(checkpoint or (config.checkpoint if config is not None else None))


def load_sharder(path=None) -> AutoShardSharder:
    """The sharder of the AutoShard checkpoint at ``path`` (default :data:`DEFAULT_CHECKPOINT`)."""
    path = path or DEFAULT_CHECKPOINT
    if not Path(path).is_file():
        raise ShardError(f"AutoShard checkpoint not found: {path} (train one with train_autoshard.py, "
                         "or pass --checkpoint PATH)")
    model = AutoShardModel.load(path)
    model.net.eval()
    model.cost_model.eval()
    return AutoShardSharder(name=str(path) if path != DEFAULT_CHECKPOINT else "autoshard", model=model)
