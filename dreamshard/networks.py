"""DreamShard's two networks.

Cost network: a table MLP (21 features → ``embed``) whose outputs are *summed* over a shard; three
heads predict that shard's forward compute, backward compute and communication cost; an overall head
takes the *max over devices* of the shard representations (with the max of the per-device predicted
totals) and predicts the plan's cost. Sum and max make it independent of the number of tables and
devices. Costs are in units of ``cost_scale`` ms (set when the network is fitted).

Policy network: its own table MLP, summed per device (with the table being placed added to the
device it scores: the state *after* the action), concatenated with an encoding of cost features from
the cost network; an MLP gives one score per device; illegal devices are masked before the softmax.
"""

from __future__ import annotations

import torch
from torch import nn

from shardcore.layers import mlp
from shardcore.data.features import NUM_FEATURES

from .config import DreamShardConfig

# Per-device cost features the policy sees: predicted forward, backward, communication and total
# cost of the device after the action, and the predicted plan maximum if the action is taken.
NUM_COST_FEATURES = 5


class CostNet(nn.Module):
    def __init__(self, cfg: DreamShardConfig):
        super().__init__()
        self.table = mlp([NUM_FEATURES + cfg.length_cv_feature, cfg.hidden, cfg.embed], last_act=True)
        self.fw = mlp([cfg.embed, cfg.head_hidden, 1], last_act=False)
        self.bw = mlp([cfg.embed, cfg.head_hidden, 1], last_act=False)
        self.comm = mlp([cfg.embed, cfg.head_hidden, 1], last_act=False)
        self.overall = mlp([cfg.embed + 1, cfg.head_hidden, 1], last_act=False)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Table representations ``[..., T, F] -> [..., T, embed]`` (F: 21 features, 22 with the CV)."""
        return self.table(x)

    def device_costs(self, h: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """Shard representations ``h [..., D, embed]`` and table counts ``[..., D]`` ->
        ``[..., D, 3]`` (forward compute, backward compute, communication). An empty shard
        computes nothing; its communication (it still receives its batch slice) is predicted."""
        nonempty = (count > 0).to(h.dtype)
        fw = self.fw(h).squeeze(-1) * nonempty
        bw = self.bw(h).squeeze(-1) * nonempty
        comm = self.comm(h).squeeze(-1)
        return torch.stack([fw, bw, comm], dim=-1)

    def overall_cost(self, h: torch.Tensor, device_costs: torch.Tensor,
                     device_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Plan cost from ``h [..., D, embed]`` and ``device_costs [..., D, 3]``; ``device_mask``
        ``[..., D]`` marks real devices when plans of different device counts are padded together."""
        total = device_costs.sum(-1, keepdim=True)
        z = torch.cat([h, total], dim=-1)
        if device_mask is not None:
            z = z.masked_fill(~device_mask.unsqueeze(-1), float("-inf"))
        return self.overall(z.max(dim=-2).values).squeeze(-1)

    def forward(self, x: torch.Tensor, assign: torch.Tensor, device_mask: torch.Tensor | None = None):
        """``x [P, T, F]`` table features, ``assign [P, D, T]`` one-hot placements (padding tables
        and devices are all-zero rows/columns). Returns ``(device_costs [P, D, 3], overall [P])``."""
        h = assign @ self.embed(x)
        dc = self.device_costs(h, assign.sum(-1))
        return dc, self.overall_cost(h, dc, device_mask)


class PolicyNet(nn.Module):
    def __init__(self, cfg: DreamShardConfig):
        super().__init__()
        self.table = mlp([NUM_FEATURES + cfg.length_cv_feature, cfg.hidden, cfg.embed], last_act=True)
        self.cost_enc = mlp([NUM_COST_FEATURES, cfg.head_hidden, cfg.embed], last_act=True)
        self.score = mlp([2 * cfg.embed + 1, cfg.head_hidden, 1], last_act=False)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.table(x)

    def forward(self, table_emb: torch.Tensor, assign: torch.Tensor, current: int,
                cost_feats: torch.Tensor, placed_frac: float, mask: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, D]`` over devices (masked devices at -inf).

        ``table_emb [T, embed]`` (this task's tables), ``assign [B, D, T]`` placements so far,
        ``current`` the table being placed, ``cost_feats [B, D, 5]``, ``mask [B, D]`` legal devices."""
        h = assign @ table_emb + table_emb[current]          # after-state shard representation
        frac = torch.full(h.shape[:-1] + (1,), float(placed_frac), dtype=h.dtype)
        z = torch.cat([h, self.cost_enc(cost_feats), frac], dim=-1)
        logits = self.score(z).squeeze(-1)
        return logits.masked_fill(~mask, float("-inf"))
