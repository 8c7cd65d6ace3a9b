"""AutoShard as the method registry sees it (:mod:`shardcore.registry`): training and checkpoint."""

from __future__ import annotations

from pathlib import Path

from shardcore.registry import MethodSpec, TrainContext

ROOT = Path(__file__).resolve().parent.parent


def train_args(ctx: TrainContext) -> list[str]:
    # train_autoshard.py's --batch-size is the learner's; the benchmark batch is --bench-batch-size.
    # It writes <savedir>/<xpid>/model.pt, and best.pt (the policy check with the lowest cost over the
    # lookup greedy's on the training tasks, what is evaluated) at every check that improves on the others.
    return (["--task-path", str(ctx.task_path), "--data-dir", ctx.data_dir, "--gpu-devices", ctx.gpu_devices,
             "--max-memory", f"{ctx.max_memory:g}", "--weights-precision", ctx.precision,
             "--savedir", str(ctx.folder.parent), "--xpid", ctx.folder.name, "--seed", str(ctx.seed)]
            + ctx.oracle_flags_renaming_batch("--bench-batch-size"))


def stale(checkpoint: Path, device_counts) -> str | None:
    """A checkpoint whose config has no observation options plans with the plain observation (feature sums,
    costs over the ideal load only), which the current defaults replace (issue #24): train again."""
    import torch

    try:
        cfg = torch.load(checkpoint, map_location="cpu", weights_only=True).get("config") or {}
    except Exception:   # noqa: BLE001 - an unreadable checkpoint is the loader's error to report, later
        return None
    if "scaled_device_features" in cfg:
        return None
    return "was trained with the plain observation (feature sums, absolute costs) that the current defaults replace"


METHOD = MethodSpec(
    name="autoshard", label="AutoShard", train_script=ROOT / "train_autoshard.py",
    train_hint="python train_autoshard.py (or run_autoshard.py)", default_precision="fp16",
    train_args=train_args, checkpoint="model.pt", selected="best.pt", every_table_tasks=True, stale=stale,
    planner_config="autoshard.config:PlannerConfig",
    seen_note="trained on tasks drawn from every table of the dataset, the test tasks' tables included, as the "
              "original's gen_dlrm_data.py draws them without --transfer",
    scale_flags={"full": (),
                 "small": ("--total-steps", "40000", "--time-limit", "10", "--bench-iters", "3"),
                 "tiny": ("--total-steps", "60", "--num-actors", "1")},
)
