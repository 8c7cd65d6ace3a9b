"""Every AutoShard hyper-parameter in one place (defaults sized for a 2-core CPU).

The names follow the original code's flags (``--total-steps``, ``--unroll-length``, ...); the fields
declared with ``param`` are train_autoshard.py's flags (generated from here, with these help texts)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from shardcore.argtypes import finite_float, fraction, nonnegative_float, nonnegative_int, positive_float, positive_int, seed_int
from shardcore.argtypes import learning_rate as learning_rate_type
from shardcore.config import Config, param
from shardcore.data.features import length_cv_flag


def default_num_actors() -> int:
    """Actors mostly wait for the hardware; one per core keeps the evaluator busy without
    crowding it out (at least 2, so one actor rolls out while another's plan is measured)."""
    return max(2, min(8, os.cpu_count() or 2))


def unit_float(text: str) -> float:
    v = finite_float(text)
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return v


@dataclass
class AutoShardConfig(Config):
    # networks
    table_hidden: int = 64       # table MLP (features -> hidden -> embed)
    embed: int = 32              # table / device representation width
    lstm_hidden: int = 64        # LSTM core width
    cost_hidden: int = 64        # cost model: table MLP hidden width and head width
    # actor-learner (IMPALA)
    total_steps: int = param(60_000, "environment steps to train for, one step = one table placed; the greedy "
                                     "policy levels off at the lookup greedy's cost after about 25,000 steps on the "
                                     "emulated H200 (default {default})",
                             type=positive_int)
    num_actors: int = param(help="actor processes (default: one per CPU core, at least 2, at most 8; here "
                                 "{default})", default_factory=default_num_actors, type=positive_int, cli_default=None)
    batch_size: int = param(4, "unrolls per learner update (default {default})", type=positive_int)
    unroll_length: int = param(25, "steps per unroll (default {default})", type=positive_int)
    replay_ratio: int = param(16, "extra learner updates on replayed recent unrolls per fresh batch "
                                  "(default {default})", type=nonnegative_int)
    num_buffers: int = param(0, "unrolls that may wait for the learner (torchbeast's --num_buffers); actors ahead "
                                "of the learner wait. 0: max(2 x actors, batch size) (default {default})",
                             type=nonnegative_int)
    replay_size: int = 200       # unrolls kept for replay (the most recent)
    learning_rate: float = param(1e-3, "Adam learning rate of policy and value (default {default})",
                                 type=learning_rate_type)
    entropy_cost: float = param(0.001, "entropy bonus weight (default {default})", type=finite_float)
    baseline_cost: float = param(0.5, "weight of the value loss (default {default})", type=nonnegative_float)
    discounting: float = param(1.0, "discount factor; the only reward is at the end of an episode "
                                    "(default {default})", type=unit_float)
    grad_norm_clipping: float = param(40.0, "global gradient-norm clip (default {default})", type=positive_float)
    rho_bar: float = 1.0         # V-trace truncation of the importance weights (value target)
    pg_rho_bar: float = 1.0      # ... and of the policy-gradient weights
    c_bar: float = 1.0           # V-trace trace-cutting level
    # cost model (trained online on measured shards)
    length_cv_feature: bool = length_cv_flag()
    use_cost_model: bool = param(True, "no cost model: no predicted-cost action features, tables ordered by "
                                       "dim x pooling factor", flags=("--disable-cost-model",),
                                 action="store_false")
    cost_lr: float = param(1e-3, "cost model learning rate (default {default})", flags=("--cost-learning-rate",),
                           type=learning_rate_type)
    cost_batch_size: int = 64
    cost_steps_per_update: int = param(16, "cost model gradient steps per learner update (default {default}: "
                                           "a cost model that keeps up with the policy's new devices)",
                                       flags=("--num-cost-updates",), dest="cost_updates", type=positive_int)
    cost_min_buffer: int = param(0, "measured shards the cost model's buffer must hold before it trains "
                                    "(default {default})", flags=("--num-min-buf-size",), type=nonnegative_int)
    # observation (autoshard/env.py); a checkpoint written before these existed loads with both off
    scaled_device_features: bool = param(True, "describe each device by the plain sums of its tables' features (the "
                                               "observation older checkpoints were trained with; default: the sums "
                                               "over the task's tables per device, one table's scale at any task size)",
                                         flags=("--raw-device-features",), action="store_false")
    relative_costs: bool = param(True, "give each device's predicted cost now and after taking the table over the ideal "
                                       "load only (the observation older checkpoints were trained with; default: minus the currently slowest device's "
                                       "predicted cost, so that 'this device becomes the slowest' reads after > 0 at "
                                       "every step)", flags=("--absolute-costs",), action="store_false")
    # rewards
    overflow_penalty: float = 1.0   # reward of an over-cap plan: -penalty x overflow / cap
    reward: str = param("balance", "final reward of a plan within the cap: balance = min/max of the devices' measured "
                                   "costs (the paper's); speedup = the task's lookup-greedy plan cost (measured "
                                   "once per task) over the plan's measured cost (default {default})",
                        choices=["balance", "speedup"])
    reward_clipping: str = param("none", "abs_one clips each step's reward to [-1, 1] (default {default})",
                                 choices=["none", "abs_one"])
    shaping: float = param(2.0, "weight of potential-based reward shaping from the cost model's predicted loads; "
                                "0 gives the paper's final reward only (default {default})", type=nonnegative_float)
    eval_interval: int | None = param(None, "environment steps between checks of the greedy (argmax) policy on up "
                                            "to 10 training tasks against the lookup greedy, written to "
                                            "policy_eval.csv and the curve, the best check's weights to best.pt "
                                            "(what is evaluated); 0: none (default: 2000 on an emulated "
                                            "oracle, 10000 on a measured one, where each check measures 10 plans)",
                                      type=nonnegative_int)
    # inference
    decode_samples: int = param(16, "at inference, also sample this many plans from the policy and keep the one "
                                   "whose slowest device the cost model predicts fastest (the greedy plan is "
                                   "always a candidate); 0: the paper's greedy argmax only (default {default})",
                                type=nonnegative_int)
    pf_augment: float = param(0.0, "share of the training tasks' tables looked up 2x or 4x as often (pooling factor "
                              "scaled, reuse bins shifted alike; drawn once per task from --seed): heavier tables "
                              "than the training tasks hold, as the test tasks may; an emulated oracle only, which "
                              "prices any table (default {default}: the paper's tasks as they are)",
                              flags=("--pf-augment",), type=fraction, group="general")
    seed: int = param(0, "random seed (default {default})", type=seed_int, group="general")

    def buffers(self, num_actors: int) -> int:
        """How many unrolls may wait for the learner (``num_buffers``, 0: max(2 x actors, batch))."""
        return self.num_buffers or max(2 * int(num_actors), self.batch_size)


DEFAULT_CHECKPOINT = "models/autoshard/default/model.pt"


@dataclass
class PlannerConfig(Config):
    """``--alg autoshard``'s settings: which trained policy plans (the flag as AutoShard spells it too)."""

    checkpoint: str | None = param(None, f"AutoShard checkpoint for --alg autoshard (default {DEFAULT_CHECKPOINT}; "
                                   "--checkpointpath is AutoShard's spelling, though its model.tar files cannot be "
                                   "loaded)", flags=("--checkpoint", "--checkpointpath"), type=str, metavar="PT")
