"""The sharding environment of one AutoShard episode.

Tables are placed one per step, in order of predicted single-table cost, largest first (without a
cost model: by dim x pooling factor, the lookup heuristic's key). The observation holds the current
table's features and the fraction of tables placed; each device is described by the summed features
of its tables, its shard's predicted cost now and after taking the current table (over the task's
ideal per-device load, i.e. the sum of predicted single-table costs / D), and its memory used now
and after (over the cap). Two options (``AutoShardConfig``, both on by default; off, the description
above, the observation of checkpoints written without them): ``scaled_device_features`` divides a device's summed features by the task's
tables per device (T / D), so they keep the scale of one table's standardised features whatever the
task's size, where the sums grew to tens of units beside the cost features' fractions of one;
``relative_costs`` gives the predicted costs now and after minus the currently slowest device's
predicted cost now (still over the ideal load), so "this device would become the slowest" reads the
same at every step: after > 0. Devices without room for the current table are masked; when no device has
room every device is allowed and the plan ends over the cap.

The reward arrives at the end (:func:`final_reward`): the measured balance min/max over the devices'
costs (the paper's), or optionally the plan's speed-up over the task's lookup-greedy plan (the measured
cost itself), or ``-penalty x overflow / cap`` for an over-cap plan (which is never measured).
"""

from __future__ import annotations

from typing import Sequence

import torch

from shardcore.tables import TableConfig
from shardcore.data.features import FeatureScaler
from shardcore.topology import Topology
from shardcore.types import CostOracle

from .networks import CostModel

EPS = 1e-9


class ShardingEnv:
    def __init__(self, scaler: FeatureScaler, cost_model: CostModel | None, topology: Topology, *,
                 scaled_device_features: bool = False, relative_costs: bool = False):
        self.scaler = scaler
        self.scaled_device_features = bool(scaled_device_features)
        self.relative_costs = bool(relative_costs)
        self.cost_model = cost_model
        self.topology = topology
        self.ndevices = topology.ndevices
        self.cap = topology.max_memory_gb
        self.precision = topology.precision
        self.tables: list[TableConfig] = []

    # -- episode -----------------------------------------------------------------------------
    @torch.no_grad()
    def reset(self, tables: Sequence[TableConfig]) -> dict:
        if not tables:
            raise ValueError("a task needs at least one table")
        self.tables = list(tables)
        T, D = len(self.tables), self.ndevices
        self.x = torch.from_numpy(self.scaler.transform(self.tables)).float()
        self.mem = torch.tensor([t.memory_gb(self.precision) for t in self.tables], dtype=torch.float64)
        if self.cost_model is not None:
            self.emb = self.cost_model.embed(self.x)
            single = self.cost_model.cost(self.emb).double()
        else:
            self.emb = torch.zeros(T, 1)
            single = torch.tensor([t.dim * t.pooling_factor for t in self.tables], dtype=torch.float64)
        keys = [(float(single[i]), self.tables[i].size, self.tables[i].index, i) for i in range(T)]
        self.order = [k[3] for k in sorted(keys, reverse=True)]
        self.ideal = max(float(single.sum()) / D, EPS)
        self.dev_feat = torch.zeros(D, self.x.shape[1])
        self.dev_emb = torch.zeros(D, self.emb.shape[1])
        self.dev_mem = torch.zeros(D, dtype=torch.float64)
        self.dev_count = torch.zeros(D, dtype=torch.long)
        self.allocation = [-1] * T
        self.pos = 0
        return self.observation()

    @property
    def done(self) -> bool:
        return self.pos >= len(self.tables)

    @torch.no_grad()
    def _predicted(self, summed: torch.Tensor, nonempty: torch.Tensor) -> torch.Tensor:
        if self.cost_model is None:
            return torch.zeros(self.ndevices)
        return self.cost_model.cost(summed) * nonempty.float() / self.ideal

    @torch.no_grad()
    def observation(self) -> dict:
        i = self.order[self.pos]
        after_mem = self.dev_mem + self.mem[i]
        mask = after_mem <= self.topology.limit_gb
        if not bool(mask.any()):
            mask = torch.ones(self.ndevices, dtype=torch.bool)
        now = self._predicted(self.dev_emb, self.dev_count > 0)
        after = self._predicted(self.dev_emb + self.emb[i], torch.ones(self.ndevices, dtype=torch.bool))
        feat = self.dev_feat
        if self.scaled_device_features:
            feat = feat / max(1.0, len(self.tables) / self.ndevices)
        if self.relative_costs:
            top = now.max()
            now, after = now - top, after - top
        action = torch.cat([feat, now.unsqueeze(-1), after.unsqueeze(-1),
                            (self.dev_mem / self.cap).float().unsqueeze(-1),
                            (after_mem / self.cap).float().unsqueeze(-1)], -1)
        return {"table": self.x[i], "frac": torch.tensor(self.pos / len(self.tables)), "action": action,
                "mask": mask}

    @torch.no_grad()
    def step(self, device: int) -> dict | None:
        """Place the current table on ``device``; the next observation, or None when all are placed."""
        if self.done:
            raise RuntimeError("episode is over")
        d = int(device)
        if not 0 <= d < self.ndevices:
            raise ValueError(f"device {d} out of range")
        i = self.order[self.pos]
        self.allocation[i] = d
        self.dev_feat[d] += self.x[i]
        self.dev_emb[d] += self.emb[i]
        self.dev_mem[d] += self.mem[i]
        self.dev_count[d] += 1
        self.pos += 1
        return None if self.done else self.observation()

    @torch.no_grad()
    def potential(self) -> float:
        """Minus the largest predicted device load over the ideal load (0 without a cost model and
        when the episode is over): the potential of the optional reward shaping."""
        if self.cost_model is None or self.done:
            return 0.0
        return -float(self._predicted(self.dev_emb, self.dev_count > 0).max())

    # -- results -----------------------------------------------------------------------------
    def shards(self) -> list[list[TableConfig]]:
        out: list[list[TableConfig]] = [[] for _ in range(self.ndevices)]
        for t, d in zip(self.tables, self.allocation):
            out[d].append(t)
        return out

    def overflow_gb(self) -> float:
        return float((self.dev_mem - self.cap).clamp_min(0).sum())


def balance(device_costs: Sequence[float]) -> float:
    """min / max of the devices' costs (1 = perfectly balanced)."""
    hi = max(device_costs)
    return float(min(device_costs) / hi) if hi > 0 else 1.0


def final_reward(env: ShardingEnv, oracle: CostOracle, overflow_penalty: float = 1.0,
                 reference_ms: float | None = None) -> tuple[float, dict]:
    """The episode's reward and what was learnt: ``{"overflow_gb", "device_costs", "cost_ms"}``
    (``device_costs``: each device's total cost in ms, as the ``oracle`` judged the plan). The reward of
    a plan within the cap is its balance min/max, or with ``reference_ms`` (a reference plan's cost on the
    same task) the speed-up ``reference_ms / cost``: the plan's cost itself, on one scale for every task."""
    over = env.overflow_gb()
    if over > 0:
        return -overflow_penalty * over / env.cap, {"overflow_gb": over, "device_costs": None, "cost_ms": None}
    costs = oracle.evaluate(env.shards()).device_totals_ms
    reward = balance(costs) if reference_ms is None else float(reference_ms) / max(max(costs), EPS)
    return reward, {"overflow_gb": 0.0, "device_costs": costs, "cost_ms": max(costs)}


def stack_obs(obs: Sequence[dict]) -> dict:
    """Observations of one actor's consecutive steps -> ``[T, 1, ...]`` tensors."""
    return {k: torch.stack([o[k] for o in obs]).unsqueeze(1) for k in ("table", "frac", "action", "mask")}

