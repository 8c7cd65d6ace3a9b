"""NeuroShard as the method registry sees it (:mod:`shardcore.registry`): training and checkpoint."""

from __future__ import annotations

from pathlib import Path

from shardcore.registry import MethodSpec, TrainContext

ROOT = Path(__file__).resolve().parent.parent


def train_args(ctx: TrainContext) -> list[str]:
    # Cost data are collected on the training pool of the same table split (seed 0, half the tables)
    # as tools/gen_tasks.py and the runner's task sets; --pool all only at the tiny scale. No task file.
    return (["--gpu-devices", ctx.gpu_devices, "--dataset-dir", ctx.data_dir,
             "--compute-data-dir", str(ctx.folder / "compute"),
             "--comm-data-dir", str(ctx.folder / f"comm_{ctx.ndevices}"),
             "--out-dir", str(ctx.folder), "--weights-precision", ctx.precision, "--seed", str(ctx.seed)]
            + list(ctx.oracle_flags))


METHOD = MethodSpec(
    name="neuroshard", label="NeuroShard", train_script=ROOT / "train_neuroshard.py",
    train_hint="python train_neuroshard.py (or train_compute_cost_model.py and train_comm_cost_model.py)",
    default_precision="fp32", train_args=train_args, checkpoint="neuroshard.pt",
    scale_flags={"full": (),
                 "small": ("--compute-samples", "400", "--comm-samples", "120", "--epochs", "200",
                           "--comm-epochs", "300"),
                 "tiny": ("--compute-samples", "16", "--comm-samples", "8", "--max-tables", "5",
                          "--T-range", "2,10", "--epochs", "5", "--comm-epochs", "5", "--pool", "all")},
    needs_train_tasks=False, flag_spellings=("--max_mem",), model_help=" (the bundle neuroshard.pt)",
    task_seed_note="its cost data come from the table split of seed 0 (train_neuroshard.py --pool train), "
                   "the task sets from seed {task_seed}: test tables may have been seen",
)
