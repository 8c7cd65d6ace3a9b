"""AutoShard's networks.

:class:`CostModel` predicts a shard's compute cost: a table MLP, a sum over the shard's tables, a head
(softplus keeps the prediction positive; units of the model's ``cost_scale``).

:class:`AutoShardNet` is the agent: a table MLP encodes the current table; a state MLP mixes it with
the fraction placed; an LSTM core carries the episode's history; each device's action features go
through an action MLP and a scoring MLP sees (state, action, state x action); a value head reads the
core. Scores of illegal devices are masked. Everything is per device, so one network serves any
number of devices.
"""

from __future__ import annotations

import torch
from torch import nn

from shardcore.layers import mlp
from shardcore.data.features import FEATURE_NAMES

from .config import AutoShardConfig

NUM_FEATURES = len(FEATURE_NAMES)
# per device: summed table features, predicted shard cost now and after placing the current table
# (both over the task's ideal per-device load), memory used now and after (both over the cap)
NUM_ACTION_FEATURES = NUM_FEATURES + 4
MASKED = -1e9


def table_features(cfg: AutoShardConfig) -> int:
    """Per table: the 21 features, and the bag-length CV unless ``--no-length-cv-feature``."""
    return NUM_FEATURES + bool(cfg.length_cv_feature)


class CostModel(nn.Module):
    def __init__(self, cfg: AutoShardConfig, num_features: int | None = None):
        super().__init__()
        num_features = num_features or table_features(cfg)
        self.table = mlp([num_features, cfg.cost_hidden, cfg.embed], last_act=True)
        self.head = mlp([cfg.embed, cfg.cost_hidden, 1], last_act=False)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., F]`` table features -> ``[..., E]`` table representations (summed per shard)."""
        return self.table(x)

    def cost(self, summed: torch.Tensor) -> torch.Tensor:
        """``[..., E]`` summed representations -> ``[...]`` predicted shard cost (cost units)."""
        return nn.functional.softplus(self.head(summed)).squeeze(-1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``x [P, T, F]`` padded shards, ``mask [P, T]`` (True for real tables) -> ``[P]``."""
        return self.cost((self.embed(x) * mask.unsqueeze(-1)).sum(1))


class AutoShardNet(nn.Module):
    def __init__(self, cfg: AutoShardConfig, num_features: int | None = None,
                 num_action_features: int | None = None):
        super().__init__()
        num_features = num_features or table_features(cfg)
        num_action_features = num_action_features or num_features + NUM_ACTION_FEATURES - NUM_FEATURES
        self.table_mlp = mlp([num_features, cfg.table_hidden, cfg.embed], last_act=True)
        self.state_mlp = mlp([cfg.embed + 1, cfg.lstm_hidden], last_act=True)
        self.core = nn.LSTM(cfg.lstm_hidden, cfg.lstm_hidden)
        self.state_proj = nn.Linear(cfg.lstm_hidden, cfg.embed)
        self.action_mlp = mlp([num_action_features, cfg.table_hidden, cfg.embed], last_act=True)
        self.score = mlp([3 * cfg.embed, cfg.table_hidden, 1], last_act=False)
        self.value = nn.Linear(cfg.lstm_hidden, 1)
        self.hidden = cfg.lstm_hidden

    def initial_state(self, batch: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(1, batch, self.hidden), torch.zeros(1, batch, self.hidden)

    def forward(self, obs: dict, core_state: tuple[torch.Tensor, torch.Tensor]):
        """``obs`` holds ``[T, B, ...]`` tensors: ``table [T,B,F]``, ``frac [T,B]``, ``action [T,B,D,A]``,
        ``mask [T,B,D]`` (bool), ``done [T,B]`` (bool: this step starts a new episode, so the core
        state is reset before it). Returns ``logits [T,B,D]`` (masked), ``value [T,B]`` and the new
        core state."""
        table, frac, action, mask, done = obs["table"], obs["frac"], obs["action"], obs["mask"], obs["done"]
        T, B = table.shape[:2]
        x = self.state_mlp(torch.cat([self.table_mlp(table), frac.unsqueeze(-1)], -1))
        outs = []
        state = core_state
        for t in range(T):
            keep = (~done[t]).float().view(1, B, 1)
            state = (state[0] * keep, state[1] * keep)
            out, state = self.core(x[t:t + 1], state)
            outs.append(out)
        core = torch.cat(outs, 0)                                   # [T, B, H]
        s = self.state_proj(core).unsqueeze(2).expand(-1, -1, action.shape[2], -1)
        a = self.action_mlp(action)
        logits = self.score(torch.cat([s, a, s * a], -1)).squeeze(-1)
        logits = logits.masked_fill(~mask, MASKED)
        return logits, self.value(core).squeeze(-1), state
