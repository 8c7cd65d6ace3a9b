"""Every DreamShard hyper-parameter in one place (defaults sized for a 2-core CPU); the fields declared
with ``param`` are train_dreamshard.py's flags (generated from here, with these help texts).

On an emulated oracle the defaults measure 200 plans per iteration (2,000 in all), which a cheap oracle
(the emulated GPU answers in milliseconds) makes affordable (on a measured one, 10: the paper's count) and which the cost network needs: with the original 10 per
iteration its error on plans it never saw is 2-5 % and the policy stays at lookup-greedy's level (issue
#24). The paper-faithful settings are one flag combination away: ``--bench-steps 10
--bench-training-steps 300 --batch-size 32 --rl-num-batches 40 --decode-samples 0
--no-length-cv-feature``."""

from __future__ import annotations

from dataclasses import dataclass, replace

from shardcore.argtypes import finite_float, fraction, nonnegative_int, positive_int, seed_int
from shardcore.argtypes import learning_rate as learning_rate_type
from shardcore.config import Config, param
from shardcore.data.features import length_cv_flag


def _episodes(text: str) -> int:
    """argparse type of ``--rl-batch-size``: an integer >= 2 (one episode's returns have no spread to
    normalise by: the policy loss would be NaN)."""
    import argparse

    v = positive_int(text)
    if v < 2:
        raise argparse.ArgumentTypeError(f"expected an integer >= 2, got {text!r}")
    return v


@dataclass
class DreamShardConfig(Config):
    # networks
    hidden: int = 128            # table MLP hidden width (cost and policy networks)
    embed: int = 32              # table representation width (summed over a shard)
    head_hidden: int = 64        # width of the cost heads and the policy's scoring MLP
    length_cv_feature: bool = length_cv_flag()
    # outer loop
    num_iterations: int = param(10, "outer iterations: measure, fit cost network, train policy (default {default})",
                                type=positive_int)
    bench_steps: int | None = param(None, "plans sampled by the policy and measured on the oracle per iteration "
                                          "(default: 200 on an emulated oracle, whose labels cost milliseconds; "
                                          "10 on a measured one, as the paper on real hardware)", type=positive_int)
    # cost network
    bench_training_steps: int = param(1000, "gradient steps fitting the cost network per iteration "
                                           "(default {default})", type=positive_int)
    cost_batch_size: int = param(64, "samples per gradient step of the cost network, as DreamShard's --batch-size "
                                     "(default {default}; the benchmark's batch is --bench-batch-size)",
                                 flags=("--batch-size",), type=positive_int)
    cost_lr: float = param(1e-3, "cost network learning rate (default {default})", type=learning_rate_type)
    # policy (REINFORCE in the estimated MDP)
    rl_num_batches: int = param(100, "policy updates per iteration (default {default})", type=positive_int)
    rl_batch_size: int = param(16, "episodes per policy update, run in lockstep on one task; at least 2 (the "
                                   "returns are normalised by their spread) (default {default})", type=_episodes)
    rl_lr: float = param(5e-4, "policy learning rate (default {default})", type=learning_rate_type)
    lr_decay: float = 0.9        # policy learning rate multiplied by this after every iteration
    entropy_weight: float = param(1e-3, "entropy bonus of the policy loss (default {default})", type=finite_float)
    adv_std_floor: float = param(0.0, "REINFORCE divides a batch's centred returns by their spread; with this > 0 by at "
                                      "least this fraction of their mean, so that plans the cost network tells apart by "
                                      "less than its own error do not become full-size updates (0.03 keeps the policy "
                                      "from drifting in late iterations; default {default}: the spread alone, as the "
                                      "paper)", type=fraction)
    grad_clip: float = 1.0
    pf_augment: float = param(0.0, "share of the training tasks' tables looked up 2x or 4x as often (pooling factor "
                              "scaled, reuse bins shifted alike; drawn once per task from --seed): heavier tables "
                              "than the training tasks hold, as the test tasks may; an emulated oracle only, which "
                              "prices any table (default {default}: the paper's tasks as they are)",
                              flags=("--pf-augment",), type=fraction)
    infeasible_penalty: float = 2.0   # an episode that runs out of memory gets this x its predicted cost
    seed: int = param(0, "random seed (default {default})", type=seed_int)
    # inference
    decode_samples: int = param(128, "plans sampled from the policy at inference; the best by the model's own cost "
                                   "network (the greedy plan among them) is kept. 0: the policy's greedy plan, "
                                   "as the paper (default {default}; stored in the checkpoint)",
                                type=nonnegative_int)
    # monitoring
    curve_tasks: int | None = param(None, "after every iteration, judge the greedy (and decoded) plans of the first N "
                                          "training tasks with the oracle beside lookup-greedy: learning_curve.csv/.png "
                                          "in --out-dir; these plans are not added to the buffer. 0: no curve "
                                          "(default: 50 on an emulated oracle, 5 on a measured one)",
                                    type=nonnegative_int)

    def for_oracle(self, emulated: bool) -> "DreamShardConfig":
        """The config with the oracle-dependent defaults (None) filled in: an emulated oracle labels a plan
        in milliseconds, a measured device takes a second or more."""
        fill = {"bench_steps": 200 if emulated else 10, "curve_tasks": 50 if emulated else 5}
        return replace(self, **{k: v for k, v in fill.items() if getattr(self, k) is None})
