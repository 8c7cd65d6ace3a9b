"""Every AutoShard hyper-parameter in one place (defaults sized for a 2-core CPU).

The names follow the original code's flags (``--total-steps``, ``--unroll-length``, ...)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields


def default_num_actors() -> int:
    """Actors mostly wait for the hardware; one per core keeps the evaluator busy without
    crowding it out (at least 2, so one actor rolls out while another's plan is measured)."""
    return max(2, min(8, os.cpu_count() or 2))


@dataclass
class AutoShardConfig:
    # networks
    table_hidden: int = 64       # table MLP (features -> hidden -> embed)
    embed: int = 32              # table / device representation width
    lstm_hidden: int = 64        # LSTM core width
    cost_hidden: int = 64        # cost model: table MLP hidden width and head width
    # actor-learner (IMPALA)
    total_steps: int = 30_000    # environment steps (one step = one table placed)
    num_actors: int = 2
    batch_size: int = 4          # unrolls per learner update
    unroll_length: int = 25      # steps per unroll
    replay_ratio: int = 16       # extra learner updates per batch of fresh unrolls, on replayed ones
    replay_size: int = 200       # unrolls kept for replay (the most recent)
    learning_rate: float = 1e-3
    entropy_cost: float = 0.001
    baseline_cost: float = 0.5
    discounting: float = 1.0     # episodic task with a final reward only
    grad_norm_clipping: float = 40.0
    rho_bar: float = 1.0         # V-trace truncation of the importance weights (value target)
    pg_rho_bar: float = 1.0      # ... and of the policy-gradient weights
    c_bar: float = 1.0           # V-trace trace-cutting level
    # cost model (trained online on measured shards)
    use_cost_model: bool = True
    cost_lr: float = 1e-3
    cost_batch_size: int = 64
    cost_steps_per_update: int = 4   # the original's --num-cost-updates
    cost_min_buffer: int = 0         # measured shards needed before the cost model trains (--num-min-buf-size)
    # rewards
    overflow_penalty: float = 1.0   # reward of an over-cap plan: -penalty x overflow / cap
    reward_clipping: str = "none"   # "abs_one" clips every step's reward to [-1, 1] (the original's flag)
    shaping: float = 2.0         # weight of potential-based shaping from the cost model (0: final reward only)
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, obj: dict) -> "AutoShardConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in obj.items() if k in names})
