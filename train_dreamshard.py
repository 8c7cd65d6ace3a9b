#!/usr/bin/env python3
"""Train DreamShard: measure plans sampled by the policy on hardware, fit the cost network, train
the policy in the estimated MDP; one checkpoint per iteration (<out-dir>/<iteration>.pt) and a
log (<out-dir>/train_log.csv).

  python train_dreamshard.py --task-path data/dlrm_tasks_50/train.txt --gpu-devices 0,1,2,3 \\
      --max-memory 5 --out-dir models/dreamshard
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tqdm import tqdm  # noqa: E402

from dreamshard.config import DreamShardConfig  # noqa: E402
from dreamshard.sharder import DreamShardModel  # noqa: E402
from dreamshard.trainer import DreamShardTrainer  # noqa: E402
from shardcore.cli import serve_if_torchrun_rank  # noqa: E402
from shardcore.cli import (add_device_args, add_memory_args, add_oracle_args, device_ids, num_devices,  # noqa: E402
                           open_evaluator, positive_float, positive_int, run_main)
from shardcore.dataset import DEFAULT_DATA_DIR, load_dataset  # noqa: E402
from shardcore.errors import ShardError  # noqa: E402
from shardcore.tasks import load_tasks  # noqa: E402
from shardcore.cli import ArgumentParser as OneLineParser, finite_float  # noqa: E402
from shardcore.io import check_output_dir  # noqa: E402

D = DreamShardConfig()


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task-path", "--task_path", dest="task_path", default="data/dlrm_tasks_50/train.txt", help="training tasks (default %(default)s)")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="processed dataset directory (default %(default)s)")
    add_device_args(p)
    add_memory_args(p)
    p.add_argument("--out-dir", default="models/dreamshard", help="checkpoints and train_log.csv (default %(default)s)")
    p.add_argument("--num-iterations", type=positive_int, default=D.num_iterations,
                   help="outer iterations: measure, fit cost network, train policy (default %(default)s)")
    p.add_argument("--bench-steps", type=positive_int, default=D.bench_steps,
                   help="plans sampled by the policy and measured on hardware per iteration (default %(default)s)")
    p.add_argument("--bench-training-steps", type=positive_int, default=D.bench_training_steps,
                   help="gradient steps fitting the cost network per iteration (default %(default)s)")
    p.add_argument("--rl-num-batches", type=positive_int, default=D.rl_num_batches,
                   help="policy updates per iteration (default %(default)s)")
    p.add_argument("--rl-batch-size", type=positive_int, default=D.rl_batch_size,
                   help="episodes per policy update, run in lockstep on one task (default %(default)s)")
    p.add_argument("--entropy-weight", type=finite_float, default=D.entropy_weight,
                   help="entropy bonus of the policy loss (default %(default)s)")
    p.add_argument("--rl-lr", type=positive_float, default=D.rl_lr, help="policy learning rate (default %(default)s)")
    p.add_argument("--cost-lr", type=positive_float, default=D.cost_lr,
                   help="cost network learning rate (default %(default)s)")
    p.add_argument("--batch-size", dest="cost_batch_size", type=positive_int, default=D.cost_batch_size,
                   help="samples per gradient step of the cost network, as DreamShard's --batch-size "
                        "(default %(default)s; the benchmark's batch is --bench-batch-size)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint in --out-dir (its buffer and networks)")
    add_oracle_args(p, batch_flag="--bench-batch-size")
    return p


def newest_checkpoint(out_dir: str) -> str | None:
    if not os.path.isdir(out_dir):
        return None
    its = [int(f[:-3]) for f in os.listdir(out_dir) if f.endswith(".pt") and f[:-3].isdigit()]
    return os.path.join(out_dir, f"{max(its)}.pt") if its else None


def main(argv=None):
    args = build_parser().parse_args(argv)
    served = serve_if_torchrun_rank(args)   # torchrun ranks other than 0 measure, nothing else
    if served is not None:
        return served
    check_output_dir(args.out_dir, "--out-dir")
    devices = device_ids(args)
    ndevices = num_devices(args)
    dataset = load_dataset(args.data_dir, with_lookups=False)
    tasks = load_tasks(args.task_path, num_tables=dataset.num_tables)
    model = None
    if args.resume:
        path = newest_checkpoint(args.out_dir)
        if path is None:
            raise ShardError(f"--resume: no checkpoint in {args.out_dir}")
        model = DreamShardModel.load(path)
        if model.extra.get("tasks") and model.extra["tasks"] != [t.to_line() for t in tasks]:
            raise ShardError(f"--resume: {path} was trained on other tasks than {args.task_path}")
        print(f"resuming from {path} (iteration {model.iteration})")
    elif newest_checkpoint(args.out_dir) is not None:
        raise ShardError(f"{args.out_dir} already holds checkpoints: pass --resume, or choose another --out-dir")
    cfg = model.cfg if model is not None else DreamShardConfig(
        num_iterations=args.num_iterations, bench_steps=args.bench_steps,
        bench_training_steps=args.bench_training_steps, rl_num_batches=args.rl_num_batches,
        rl_batch_size=args.rl_batch_size, entropy_weight=args.entropy_weight, rl_lr=args.rl_lr,
        cost_lr=args.cost_lr, cost_batch_size=args.cost_batch_size, seed=args.seed)
    print(f"DreamShard: {len(tasks)} training tasks, {ndevices} devices, cap {args.max_memory:g} GB, "
          f"{args.num_iterations} iterations -> {args.out_dir}/")
    with open_evaluator(args, args.data_dir, devices) as ev:
        trainer = DreamShardTrainer(cfg, dataset.tables, tasks, ndevices, args.max_memory, ev,
                                    args.out_dir, precision=args.weights_precision, model=model, log=tqdm.write)
        start = trainer.model.iteration + 1
        with tqdm(total=args.num_iterations, initial=start, desc="iterations", unit="it") as bar:
            trainer.run(args.num_iterations, progress=bar)
    print(f"done: {args.out_dir}/{args.num_iterations - 1}.pt, log {args.out_dir}/train_log.csv")


if __name__ == "__main__":
    run_main(main)
