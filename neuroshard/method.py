"""NeuroShard as the method registry sees it (:mod:`shardcore.registry`): training and checkpoint."""

from __future__ import annotations

from pathlib import Path

from shardcore.errors import ShardError
from shardcore.registry import MethodSpec, TrainContext

ROOT = Path(__file__).resolve().parent.parent


def train_args(ctx: TrainContext) -> list[str]:
    # Cost data are collected on every table of the dataset (collect_compute_cost_data.py's default
    # --pool all, as the original pre-trains on the whole dataset); no task file. All-to-alls are
    # collected on every device count the experiment plans for (one model serves its sets).
    counts = ctx.plan_device_counts
    return (["--gpu-devices", ctx.gpu_devices, "--dataset-dir", ctx.data_dir,
             "--compute-data-dir", str(ctx.folder / "compute"),
             "--comm-devices", ",".join(map(str, counts)),
             "--comm-data-dir", ",".join(str(ctx.folder / f"comm_{n}") for n in counts),
             "--out-dir", str(ctx.folder), "--overwrite", "--weights-precision", ctx.precision, "--seed", str(ctx.seed)]
            + list(ctx.oracle_flags))


def stale(checkpoint: Path, device_counts) -> str | None:
    """Communication models fitted on all-to-alls of fewer device counts than the run plans for (a
    bundle trained before --comm-devices existed) extrapolate on the others: train again."""
    from neuroshard.checkpoints import load_model

    try:
        seen = load_model(checkpoint, "fw_comm").device_counts
    except (ShardError, OSError):   # an unreadable bundle is the loader's error to report, later
        return None
    missing = sorted(set(device_counts) - set(seen or device_counts))
    if not missing:
        return None
    return (f"has communication models of {' and '.join(map(str, seen))}-device all-to-alls only, "
            f"not of {' and '.join(map(str, missing))}")


METHOD = MethodSpec(
    planner_config="neuroshard.config:PlannerConfig",
    name="neuroshard", label="NeuroShard", train_script=ROOT / "train_neuroshard.py",
    train_hint="python train_neuroshard.py (or train_compute_cost_model.py and train_comm_cost_model.py)",
    default_precision="fp32", train_args=train_args, checkpoint="neuroshard.pt",
    scale_flags={"full": (),
                 # fits the small scale's 720 s training limit on a 2-core CPU with all-to-alls of 4 and
                 # 8 devices (7 timed repeats per exchange instead of the CPU's 21: ~2-2.5 s a sample)
                 "small": ("--compute-samples", "300", "--comm-samples", "60", "--comm-iters", "7",
                           "--epochs", "200", "--comm-epochs", "300"),
                 "tiny": ("--compute-samples", "16", "--comm-samples", "8", "--max-tables", "5",
                          "--T-range", "2,10", "--epochs", "5", "--comm-epochs", "5")},
    needs_train_tasks=False, flag_spellings=("--max_mem",), model_help=" (the bundle neuroshard.pt)", stale=stale,
    seen_note="pre-trained on random shards of every table of the dataset, the test tasks' tables included, as "
              "the original (collect_compute_cost_data.py --pool train keeps to the training pool)",
)
