"""DreamShard inference and checkpoints.

A checkpoint is a dict of plain tensors, numbers and strings (loads with ``weights_only=True``):
``method`` ("dreamshard"), ``version``, ``config`` (architecture and hyper-parameters), ``scaler``
(the feature standardisation fitted on the training tables), ``cost_scale`` (ms per cost unit),
``cost_net`` and ``policy`` state dicts, ``iteration``, and for ``--resume`` the training state.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
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

from .config import DreamShardConfig
from .env import EstimatedMDP
from .networks import CostNet, PolicyNet

METHOD = "dreamshard"
VERSION = 1


@dataclass
class DreamShardModel:
    cfg: DreamShardConfig
    scaler: FeatureScaler
    cost_net: CostNet
    policy: PolicyNet
    cost_scale: float = 1.0
    iteration: int = -1
    extra: dict = field(default_factory=dict)   # training state kept for --resume

    @classmethod
    def new(cls, cfg: DreamShardConfig, scaler: FeatureScaler) -> "DreamShardModel":
        cfg = dataclasses.replace(cfg, length_cv_feature=scaler.cv_default is not None)   # the scaler's features
        torch.manual_seed(cfg.seed)
        return cls(cfg, scaler, CostNet(cfg), PolicyNet(cfg))

    def features(self, tables: Sequence[TableConfig]) -> torch.Tensor:
        return torch.from_numpy(self.scaler.transform(tables))

    def save(self, path: str | os.PathLike) -> None:
        obj = {"method": METHOD, "version": VERSION, "config": self.cfg.to_dict(),
               "scaler": self.scaler.to_state(), "cost_scale": float(self.cost_scale),
               "cost_net": self.cost_net.state_dict(), "policy": self.policy.state_dict(),
               "iteration": int(self.iteration), "extra": self.extra,
               PRODUCED_BY: produced_by("train_dreamshard.py", (self.extra.get("provenance") or {}).get("hardware"))}
        io.save_checkpoint(obj, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "DreamShardModel":
        obj = io.load_checkpoint(path, METHOD, VERSION, "a DreamShard")
        with io.checkpoint_contents(path):
            stored = dict(obj["config"])
            stored.setdefault("decode_samples", 0)   # a checkpoint from before decoding by sampling: greedy
            stored.setdefault("length_cv_feature", False)   # ... from before the bag-length CV feature
            cfg = DreamShardConfig.from_dict(stored)
            model = cls(cfg, FeatureScaler.from_state(obj["scaler"]), CostNet(cfg), PolicyNet(cfg),
                        float(obj["cost_scale"]), int(obj["iteration"]), obj.get("extra", {}))
            model.cost_net.load_state_dict(obj["cost_net"])
            model.policy.load_state_dict(obj["policy"])
        return model

    @torch.no_grad()
    def predict(self, plan: Plan) -> tuple[torch.Tensor, float]:
        """The cost network's prediction for a plan: per device ``[D, 3]`` (forward compute, backward
        compute, communication) and the plan cost, in ms."""
        x = self.features([p for _, p in plan.pieces]).unsqueeze(0)
        assign = torch.zeros(1, plan.ndevices, len(plan.allocation))
        assign[0, torch.tensor(plan.allocation), torch.arange(len(plan.allocation))] = 1.0
        dc, overall = self.cost_net(x, assign)
        return dc[0] * self.cost_scale, float(overall[0]) * self.cost_scale

    @torch.no_grad()
    def place(self, tables: Sequence[TableConfig], topology: Topology, sample: bool = False, batch: int = 1,
              generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the policy: greedy (argmax) or sampled. Returns ``allocations [batch, T]``,
        ``predicted costs [batch]`` (ms) and ``infeasible [batch]``."""
        x = self.features(tables)
        mem = torch.tensor([t.memory_gb(topology.precision) for t in tables], dtype=torch.float64)
        env = EstimatedMDP(self.cost_net, x, mem, topology, batch=batch,
                           infeasible_penalty=self.cfg.infeasible_penalty)
        emb = self.policy.embed(x)
        obs = env.reset()
        info = {}
        while obs is not None:
            logits = self.policy(emb, obs.assign, obs.current, obs.cost_feats, obs.placed_frac, obs.mask)
            if sample:
                probs = torch.softmax(logits, -1)
                action = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            else:
                action = logits.argmax(-1)
            obs, _, _, info = env.step(action)
        return env.allocations(), info["predicted_cost"] * self.cost_scale, info["infeasible"]

    @torch.no_grad()
    def decode(self, tables: Sequence[TableConfig], topology: Topology, samples: int | None = None,
               seed: int = 0) -> tuple[list[int], float, bool]:
        """The plan inference gives: the policy's greedy (argmax) plan when ``samples`` is 0 (the paper's
        decoding), otherwise the best by this model's own cost network (its predicted plan cost) of the
        greedy plan and ``samples`` plans sampled from the policy. Sampling uses a generator seeded with
        ``seed``, so a task always gets the same plan. ``samples`` defaults to ``cfg.decode_samples``.
        Returns ``(allocation, predicted cost ms, infeasible)``; a feasible plan is preferred."""
        n = self.cfg.decode_samples if samples is None else int(samples)
        alloc, pred, infeasible = self.place(tables, topology)
        if n > 0:
            gen = torch.Generator().manual_seed(int(seed))
            a, p, i = self.place(tables, topology, sample=True, batch=n, generator=gen)
            alloc, pred, infeasible = torch.cat([alloc, a]), torch.cat([pred, p]), torch.cat([infeasible, i])
        score = pred.masked_fill(infeasible, float("inf"))
        k = int(score.argmin()) if bool((~infeasible).any()) else 0   # ties: the first (the greedy plan)
        return [int(d) for d in alloc[k]], float(pred[k]), bool(infeasible[k])


@dataclass
class DreamShardSharder(Sharder):
    model: DreamShardModel = None

    def shard(self, tables, topology):
        alloc, _, infeasible = self.model.decode(tables, topology)
        if infeasible:
            raise InfeasibleError(f"infeasible: the DreamShard policy found no device with room for some "
                                  f"table under the {topology.max_memory_gb:g} GiB cap")
        return Plan.table_wise(tables, alloc, topology)


def make_sharder(ctx: PlanningContext, config=None, checkpoint=None, planners=None) -> DreamShardSharder:
    """``--alg PATH.pt`` of a DreamShard checkpoint (the policy plans; it has no settings of its own)."""
    return load_sharder(checkpoint)


def load_sharder(path) -> DreamShardSharder:
    if path is None:
        raise ShardError("--alg dreamshard needs a trained checkpoint: --alg models/dreamshard/best.pt "
                         "(or an iteration's N.pt)")
    model = DreamShardModel.load(path)
    model.cost_net.eval()
    model.policy.eval()
    return DreamShardSharder(name=str(path), model=model)
