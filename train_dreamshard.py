#!/usr/bin/env python3
"""Train DreamShard: measure plans sampled by the policy on hardware, fit the cost network, train
the policy in the estimated MDP; one checkpoint per iteration (<out-dir>/<iteration>.pt; the last is
the paper's model), <out-dir>/best.pt (a copy of the iteration whose plans of the learning curve's
training tasks cost least: the one to evaluate), a log (<out-dir>/train_log.csv) and the learning
curve (<out-dir>/learning_curve.csv and .png).

  python train_dreamshard.py --task-path data/dlrm_tasks_50/train.txt --gpu-devices 0,1,2,3 \\
      --max-memory 5 --out-dir models/dreamshard
"""

import argparse
import os


from tqdm import tqdm

from dreamshard.config import DreamShardConfig
from dreamshard.sharder import DreamShardModel
from dreamshard.trainer import BEST, DreamShardTrainer
from shardcore.cli.common import serve_if_torchrun_rank, topology_of
from shardcore.cli.common import (add_device_args, add_task_args, add_memory_args, add_oracle_args, device_ids, num_devices,
                           open_evaluator, prestart_oracle, run_main)
from shardcore.dataset import load_dataset
from shardcore.errors import ShardError
from shardcore.tasks import load_tasks
from shardcore.cli.common import ArgumentParser as OneLineParser
from shardcore.cli.common import check_resumed_config, flags_given
from shardcore.config import add_config_args, config_from_args
from shardcore.cli.common import check_outputs
from shardcore.processes import output_lock


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_task_args(p, "data/dlrm_tasks_50/train.txt", what="training tasks")
    add_device_args(p)
    add_memory_args(p)
    p.add_argument("--out-dir", default="models/dreamshard", help="checkpoints and train_log.csv (default %(default)s)")
    add_config_args(p, DreamShardConfig())
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
    written = [f"{i}.pt" for i in range(args.num_iterations)] + [BEST, "train_log.csv", "learning_curve.csv",
                                                                  "learning_curve.png"]
    check_outputs(args, {}, folders={"--out-dir": (args.out_dir, written)})
    with output_lock(args.out_dir, "--out-dir"):   # one run at a time writes a folder's checkpoints and logs
        return train(args, argv)


def train(args, argv):
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
        check_resumed_config(model.cfg, config_from_args(DreamShardConfig, args), flags_given(build_parser(), argv),
                             "in another --out-dir", free=("num_iterations",))
        print(f"resuming from {path} (iteration {model.iteration})")
    elif newest_checkpoint(args.out_dir) is not None:
        raise ShardError(f"{args.out_dir} already holds checkpoints: pass --resume, or choose another --out-dir")
    cfg = model.cfg if model is not None else config_from_args(DreamShardConfig, args)
    print(f"DreamShard: {len(tasks)} training tasks, {ndevices} devices, cap {args.max_memory:g} GiB, "
          f"{args.num_iterations} iterations -> {args.out_dir}/")
    prestart_oracle(args)   # the workers' imports beside the trainer's set-up
    ev = open_evaluator(args, args.data_dir, devices)
    # built before the oracle's workers start: a --resume in another setting is refused first
    trainer = DreamShardTrainer(cfg, dataset.tables, tasks, topology_of(args, ndevices), ev, args.out_dir,
                                model=model, log=tqdm.write)
    with ev:
        start = trainer.model.iteration + 1
        with tqdm(total=args.num_iterations, initial=start, desc="iterations", unit="it") as bar:
            trainer.run(args.num_iterations, progress=bar)
    best = trainer.best_iteration
    print(f"done: {args.out_dir}/{args.num_iterations - 1}.pt (the last iteration, the paper's)"
          + (f", {args.out_dir}/{BEST} (iteration {best}: its plans of the learning curve's training tasks cost "
             f"least)" if best is not None else "") + f"; log {args.out_dir}/train_log.csv")


if __name__ == "__main__":
    run_main(main)
