"""DreamShard as the method registry sees it (:mod:`shardcore.registry`): training and checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from shardcore.registry import MethodSpec, TrainContext, flag_value, numbered_checkpoints

ROOT = Path(__file__).resolve().parent.parent


def train_args(ctx: TrainContext) -> list[str]:
    # train_dreamshard.py's --batch-size is the cost network's (DreamShard's meaning); the benchmark's
    # batch is --bench-batch-size. It writes <out-dir>/<iteration>.pt after every iteration, and best.pt (the
    # iteration whose learning-curve plans cost least, what is evaluated) after every learning-curve row.
    args = (["--task-path", str(ctx.task_path), "--data-dir", ctx.data_dir, "--gpu-devices", ctx.gpu_devices,
             "--max-memory", f"{ctx.max_memory:g}", "--weights-precision", ctx.precision,
             "--out-dir", str(ctx.folder), "--seed", str(ctx.seed)]
            + ctx.oracle_flags_renaming_batch("--bench-batch-size"))
    if numbered_checkpoints(ctx.folder):
        args.append("--resume")   # continue an interrupted run instead of starting over
    return args


def final_checkpoint(flags: Sequence[str]) -> int:
    """The index of the last checkpoint a training with these flags writes."""
    from .config import DreamShardConfig

    return int(flag_value(flags, "--num-iterations", str(DreamShardConfig().num_iterations))) - 1


METHOD = MethodSpec(
    name="dreamshard", label="DreamShard", train_script=ROOT / "train_dreamshard.py",
    train_hint="python train_dreamshard.py", default_precision="fp16",
    train_args=train_args, checkpoint=None, final_checkpoint=final_checkpoint, selected="best.pt",
    scale_flags={"full": (),
                 "small": ("--num-iterations", "8", "--bench-steps", "8"),
                 "tiny": ("--num-iterations", "1", "--bench-steps", "2", "--bench-training-steps", "10",
                          "--rl-num-batches", "2", "--rl-batch-size", "4")},
)
