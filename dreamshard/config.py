"""Every DreamShard hyper-parameter in one place (defaults sized for a 2-core CPU)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass
class DreamShardConfig:
    # networks
    hidden: int = 128            # table MLP hidden width (cost and policy networks)
    embed: int = 32              # table representation width (summed over a shard)
    head_hidden: int = 64        # width of the cost heads and the policy's scoring MLP
    # outer loop
    num_iterations: int = 10     # measure -> fit cost network -> train policy, this many times
    bench_steps: int = 10        # plans sampled by the policy and measured on hardware per iteration
    # cost network
    bench_training_steps: int = 300   # gradient steps fitting the cost network per iteration
    cost_batch_size: int = 32
    cost_lr: float = 1e-3
    # policy (REINFORCE in the estimated MDP)
    rl_num_batches: int = 40     # policy updates per iteration
    rl_batch_size: int = 16      # episodes per update (all on one training task, run in lockstep)
    rl_lr: float = 5e-4
    lr_decay: float = 0.9        # policy learning rate multiplied by this after every iteration
    entropy_weight: float = 1e-3
    grad_clip: float = 1.0
    infeasible_penalty: float = 2.0   # an episode that runs out of memory gets this x its predicted cost
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, obj: dict) -> "DreamShardConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in obj.items() if k in names})
