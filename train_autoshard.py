#!/usr/bin/env python3
"""Train AutoShard: actors roll out sharding episodes with an LSTM policy, their plans are measured on
the hardware (shared evaluator and cache), and a learner updates policy, value (V-trace) and the cost
model. Writes <savedir>/<xpid>/model.pt (periodically and at the end; Ctrl-C saves and exits),
train_log.csv (per update), episodes.csv (per episode) and train_curve.png.

  python train_autoshard.py --task-path data/dlrm_tasks_50/train.txt --gpu-devices 0,1,2,3 \\
      --max-memory 5 --total-steps 30000
  python eval.py --alg autoshard --task-path data/dlrm_tasks_50/test.txt --gpu-devices 0,1,2,3 --max-memory 5
"""

import argparse
import os
import signal
import threading


from tqdm import tqdm

from autoshard.config import AutoShardConfig
from autoshard.curve import plot_curve
from autoshard.sharder import AutoShardModel
from autoshard.trainer import AutoShardTrainer
from shardcore.baselines import make_baseline
from shardcore.cli.common import serve_if_torchrun_rank
from shardcore.cli.common import add_device_args, add_task_args, add_memory_args, add_oracle_args, add_refused_flag, device_ids, num_devices, open_evaluator, prestart_oracle, run_main, topology_of
from shardcore.argtypes import positive_float
from shardcore.dataset import load_dataset
from shardcore.errors import InfeasibleError, ShardError
from shardcore.tasks import load_tasks
from shardcore.types import Topology
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
    p.add_argument("--savedir", default="models/autoshard", help="root of the experiment folders (default %(default)s)")
    p.add_argument("--xpid", default="default",
                   help="experiment id: outputs go to <savedir>/<xpid>/ (default %(default)s, which is where "
                        "`eval.py --alg autoshard` looks)")
    p.add_argument("--resume", action="store_true", help="continue <savedir>/<xpid>/model.pt up to --total-steps")
    r = p.add_argument_group("actor-learner (IMPALA / V-trace)")
    add_config_args(r, AutoShardConfig(), groups={"general": p})
    r.add_argument("--time-limit", type=positive_float, default=None, metavar="MIN",
                   help="stop after this many minutes of training (saved like a finished run; default: none)")
    r.add_argument("--checkpoint-interval", type=positive_float, default=300.0, metavar="S",
                   help="seconds between checkpoints (default 300; one is always written at the end)")
    r.add_argument("--num-learner-threads", "--num-threads", dest="learner_threads", type=learner_threads,
                   default=1, metavar="1",
                   help="learner threads: one here, as the original's default (torch's threads: the "
                        "SHARDKIT_NUM_THREADS environment variable)")
    o = p.add_argument_group("the original AutoShard's other flags (refused with the way forward)")
    add_refused_flag(o, "--checkpoint-history", takes_value=False,
                     pointer="one checkpoint, <savedir>/<xpid>/model.pt, is rewritten every --checkpoint-interval "
                             "seconds; use another --xpid to keep a run's")
    add_refused_flag(o, "--checkpoint-history-every",
                     pointer="one checkpoint is rewritten every --checkpoint-interval S seconds")
    add_refused_flag(o, "--disable-checkpoint", takes_value=False,
                     pointer="the checkpoint is always written (it is what eval.py --alg autoshard loads); "
                             "--checkpoint-interval S writes it less often")
    for feature in ("dims", "rows", "pooling-factors", "sizes", "bins"):
        add_refused_flag(o, f"--disable-{feature}", takes_value=False,
                         pointer="feature ablations are not implemented: every table is described by its 21 "
                                 "features (dim, row, pooling factor, size, 17 reuse bins)")
    add_oracle_args(p, batch_flag="--bench-batch-size")
    return p


def learner_threads(text: str) -> int:
    if text.strip() != "1":
        raise ShardError(f"--num-learner-threads {text}: the learner runs one thread here (the original's default); "
                         "torch's threads are set with SHARDKIT_NUM_THREADS")
    return 1


def check_tasks(tasks, dataset, topology: Topology) -> None:
    """Every training task must have a feasible plan (found by the size greedy), or training is moot."""
    greedy = make_baseline("size_greedy")
    for k, task in enumerate(tasks):
        try:
            greedy.shard(task.tables(dataset.tables), topology)
        except InfeasibleError:
            raise ShardError(f"training task {k} does not fit on {topology.ndevices} devices under the "
                             f"{topology.max_memory_gb:g} GiB cap "
                             "(raise --max-memory or use more devices)") from None


def main(argv=None):
    args = build_parser().parse_args(argv)
    served = serve_if_torchrun_rank(args)   # torchrun ranks other than 0 measure, nothing else
    if served is not None:
        return served
    out_dir = os.path.join(args.savedir, args.xpid)
    check_outputs(args, {}, folders={"--savedir/--xpid": (out_dir, OUTPUTS)})
    with output_lock(out_dir, "--savedir/--xpid"):   # one run at a time writes a folder's logs and checkpoint
        return train(args, argv, out_dir)


#: what a run writes in <savedir>/<xpid>/
OUTPUTS = ("model.pt", "best.pt", "train_log.csv", "episodes.csv", "policy_eval.csv", "train_curve.png")


def train(args, argv, out_dir: str):
    devices = device_ids(args)
    ndevices = num_devices(args)   # --ndevices beside fewer --gpu-devices: plans of N devices measured on those
    dataset = load_dataset(args.data_dir, with_lookups=False)
    tasks = load_tasks(args.task_path, num_tables=dataset.num_tables)
    topology = topology_of(args, ndevices)
    check_tasks(tasks, dataset, topology)
    ckpt = os.path.join(out_dir, "model.pt")
    model = None
    if args.resume:
        if not os.path.isfile(ckpt):
            raise ShardError(f"--resume: no checkpoint {ckpt}")
        model = AutoShardModel.load(ckpt)
        if model.extra.get("tasks") and model.extra["tasks"] != [t.to_line() for t in tasks]:
            raise ShardError(f"--resume: {ckpt} was trained on other tasks than {args.task_path}")
        check_resumed_config(model.cfg, config_from_args(AutoShardConfig, args), flags_given(build_parser(), argv),
                             "with another --xpid", free=("total_steps", "num_actors"))
        if model.steps >= args.total_steps:
            raise ShardError(f"--resume: {ckpt} has already trained {model.steps} steps (>= --total-steps)")
        print(f"resuming {ckpt} at step {model.steps} (its hyper-parameters are kept)")
    elif os.path.exists(ckpt):
        raise ShardError(f"{ckpt} exists: pass --resume, or choose another --xpid")
    cfg = model.cfg if model is not None else config_from_args(AutoShardConfig, args)
    num_actors = args.num_actors or cfg.num_actors
    print(f"AutoShard: {len(tasks)} training tasks, {ndevices} devices"
          f"{'' if ndevices == len(devices) else f' (measured on {len(devices)})'}, cap {args.max_memory:g} GiB, "
          f"{num_actors} actors, {args.total_steps} steps -> {out_dir}/")
    prestart_oracle(args)   # the workers' imports beside the trainer's set-up
    ev = open_evaluator(args, args.data_dir, devices, ndevices)
    trainer = AutoShardTrainer(cfg, dataset.tables, tasks, topology, ev, out_dir, model=model,
                               checkpoint_interval_s=args.checkpoint_interval, log=tqdm.write)
    # the trainer restores this handler when it returns: once it has stopped on a Ctrl-C (and saved), a
    # second, impatient one must not cut the summary below short, which says where the checkpoint is
    main_thread = threading.current_thread() is threading.main_thread()
    original = signal.getsignal(signal.SIGINT)
    if main_thread:
        signal.signal(signal.SIGINT, lambda signum, frame: _after_stop(trainer, signum, frame))
    try:
        with ev:
            with tqdm(total=args.total_steps, initial=trainer.model.steps, unit="step", desc="training") as bar:
                summary = trainer.run(args.total_steps, num_actors, progress=bar,
                                      time_limit_s=args.time_limit * 60 if args.time_limit else None)
        curve = plot_curve(os.path.join(out_dir, "episodes.csv"), os.path.join(out_dir, "train_curve.png"))
        state = ("interrupted, saved" if summary["interrupted"] else
                 "time limit reached, saved" if summary["timed_out"] else "done")
        print(f"{state}: {summary['checkpoint']} at step {summary['steps']} ({summary['episodes']} episodes, "
              f"{summary['plans_measured']} plans measured this run, {summary['elapsed_s'] / 60:.1f} min)")
        print(f"logs: {out_dir}/train_log.csv, {out_dir}/episodes.csv; curve: {curve}")
    finally:
        if main_thread and not trainer.interrupted:   # after a Ctrl-C stop, the process only exits: keep deferring
            signal.signal(signal.SIGINT, original)
    return 130 if summary["interrupted"] else 0


def _after_stop(trainer: AutoShardTrainer, signum, frame) -> None:
    """Ctrl-C outside the trainer's loop: an ordinary interrupt, unless the trainer has already stopped
    on one (its checkpoint saved), when the run only finishes its plot and summary."""
    if not trainer.interrupted:
        signal.default_int_handler(signum, frame)
    try:
        os.write(2, b"interrupted: the checkpoint is saved; writing the curve and summary, please wait\n")
    except OSError:
        pass


if __name__ == "__main__":
    run_main(main)
