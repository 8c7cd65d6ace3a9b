"""The estimated MDP: place one table per step; the only reward, at the end, is minus the cost
network's predicted plan cost. No hardware is touched.

It is a gymnasium-style *vector* environment: ``B`` episodes of one task run in lockstep
(``reset() -> obs``, ``step(actions) -> obs, reward, done, info``), which makes REINFORCE cheap.
Tables are placed in order of predicted single-table cost, largest first. A device without room for
the current table is masked out; an episode in which the current table fits nowhere is marked
infeasible (its reward loses a further ``infeasible_penalty`` x |predicted cost|) and may use any device from then on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardcore.topology import Topology

from .networks import CostNet


@dataclass
class Observation:
    current: int                 # index (into the task's tables) of the table to place now
    assign: torch.Tensor         # [B, D, T] one-hot placements so far
    cost_feats: torch.Tensor     # [B, D, 5] cost-network features of each device after the action
    mask: torch.Tensor           # [B, D] legal devices
    placed_frac: float           # fraction of the task's tables already placed


class EstimatedMDP:
    def __init__(self, cost_net: CostNet, features: torch.Tensor, memory_gb: torch.Tensor, topology: Topology,
                 batch: int = 1, infeasible_penalty: float = 2.0):
        """``features [T, 21]`` standardised table features, ``memory_gb [T]`` each table's weights."""
        self.cost_net = cost_net
        self.x = features
        self.mem = memory_gb.to(torch.float64)
        self.topology = topology
        self.D = topology.ndevices
        self.T = features.shape[0]
        self.B = batch
        self.infeasible_penalty = infeasible_penalty
        with torch.no_grad():
            self.emb = cost_net.embed(features)                         # [T, E]
            one = torch.ones(self.T)
            single = cost_net.device_costs(self.emb.unsqueeze(1), one.unsqueeze(1)).sum(-1).squeeze(1)
        # Largest predicted single-table cost first (ties: larger memory, then larger position).
        self.order = sorted(range(self.T), key=lambda i: (float(single[i]), float(self.mem[i]), i), reverse=True)

    def reset(self) -> Observation:
        self.t = 0
        self.assign = torch.zeros(self.B, self.D, self.T)
        self.h = torch.zeros(self.B, self.D, self.emb.shape[1])
        self.count = torch.zeros(self.B, self.D)
        self.used = torch.zeros(self.B, self.D, dtype=torch.float64)
        self.infeasible = torch.zeros(self.B, dtype=torch.bool)
        return self._observe()

    @torch.no_grad()
    def _observe(self) -> Observation:
        j = self.order[self.t]
        now = self.cost_net.device_costs(self.h, self.count).sum(-1)                  # [B, D]
        after = self.cost_net.device_costs(self.h + self.emb[j], self.count + 1)      # [B, D, 3]
        after_total = after.sum(-1)
        # Plan maximum if the table goes to d: max(after_total[d], max over the other devices of now).
        others = now.unsqueeze(1).expand(-1, self.D, -1).clone()                      # [B, d, d']
        others[:, torch.arange(self.D), torch.arange(self.D)] = float("-inf")
        other_max = others.max(-1).values if self.D > 1 else torch.full_like(after_total, float("-inf"))
        plan_max = torch.maximum(after_total, other_max)
        feats = torch.cat([after, after_total.unsqueeze(-1), plan_max.unsqueeze(-1)], dim=-1)
        mask = self.used + self.mem[j] <= self.topology.limit_gb
        none = ~mask.any(-1)
        self.infeasible |= none
        mask[none] = True
        return Observation(j, self.assign, feats, mask, self.t / self.T)

    @torch.no_grad()
    def step(self, actions: torch.Tensor):
        j = self.order[self.t]
        b = torch.arange(self.B)
        self.assign = self.assign.clone()
        self.assign[b, actions, j] = 1.0
        self.h[b, actions] += self.emb[j]
        self.count[b, actions] += 1
        self.used[b, actions] += self.mem[j]
        self.t += 1
        done = self.t == self.T
        if not done:
            return self._observe(), torch.zeros(self.B), False, {}
        cost = self.predicted_cost()
        reward = -cost - self.infeasible.to(cost.dtype) * self.infeasible_penalty * cost.abs()
        return None, reward, True, {"predicted_cost": cost, "infeasible": self.infeasible.clone()}

    @torch.no_grad()
    def predicted_cost(self) -> torch.Tensor:
        dc = self.cost_net.device_costs(self.h, self.count)
        return self.cost_net.overall_cost(self.h, dc)

    def allocations(self) -> torch.Tensor:
        """``[B, T]`` device of each table (task order), after the episode."""
        return self.assign.argmax(1)
