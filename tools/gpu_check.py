#!/usr/bin/env python3
"""One command for a GPU check: data at batch 65536, the micro-benchmark's noise, the baselines,
TorchRec and any checkpoints measured side by side on the same tasks, the emulated-H200 oracle
beside them, the measured shards appended to a file, rank correlations with a run made elsewhere.

  python tools/gpu_check.py                                   # on a machine with a GPU and fbgemm-gpu
  python tools/gpu_check.py --checkpoint models/dreamshard/best.pt --compare cpu_run.jsonl
  python tools/gpu_check.py --device cpu                      # the same steps, tiny, on the CPU

Within --time-budget seconds (default 450, so within 8 minutes on one H100), never hanging: a stage
past the budget is skipped, a stage that overruns is stopped with its workers. See README, "GPUs".
"""

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # tools.gpu_check_lib: the check itself

from shardcore.argtypes import int_list, name_list, positive_float, positive_int  # noqa: E402
from shardcore.cli.common import check_outputs, make_parser, run_main  # noqa: E402
from shardcore.errors import ShardError  # noqa: E402
from shardcore.oracles.factory import batch_size_int  # noqa: E402
from shardcore.topology import DEFAULT_MAX_MEMORY_GB
from tools.gpu_check_lib import DEFAULT_ALGS, SHARD_POOLS, SHIPPED_SETS, CheckConfig, run_check  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = make_parser(__doc__)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cuda (default): the full check on this machine's GPUs; cpu: the same steps at a "
                        "tiny size on logical CPU devices")
    p.add_argument("--work-dir", type=Path, default=Path("results/gpu_check"),
                   help="where data, tasks, gpu_check.json and the measured shards go (default %(default)s)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="use this processed dataset instead of generating one (default: generate the "
                        "synthetic dataset at batch 65536 on cuda, a tiny one on cpu)")
    p.add_argument("--batch-size", type=batch_size_int, default=None,
                   help="measure at this batch (default: the dataset's whole batch)")
    p.add_argument("--alg", type=name_list, default=DEFAULT_ALGS,
                   help=f"algorithms to plan with (default {','.join(DEFAULT_ALGS)}; one that cannot be "
                        "loaded here, e.g. torchrec without TorchRec, is skipped with a note)")
    p.add_argument("--checkpoint", action="append", default=[], metavar="PT",
                   help="a trained model's checkpoint to plan with as well (repeatable)")
    p.add_argument("--sets", type=name_list, default=("DLRM-50", "DLRM-100"),
                   help="task sets: DLRM-50 (4 devices), DLRM-100 (8 devices), NS (4 devices, dims 4-128, 0.5 GiB "
                        "per device: the honest-margin records' NeuroShard-style set); DLRM-50-train (4) and "
                        "DLRM-100-train (8): tasks of the training pool's tables, which no test task holds, so "
                        "their plans' devices are cost-model data no held-out judge leaves out (default "
                        "DLRM-50,DLRM-100)")
    p.add_argument("--max-tasks", type=positive_int, default=None, metavar="N",
                   help="measure only the first N tasks of each set (default all 10)")
    p.add_argument("--gpu-devices", type=int_list, default=None, metavar="IDS",
                   help="GPUs that measure (default: every GPU present, up to the plan's devices)")
    p.add_argument("--max-memory", type=positive_float, default=DEFAULT_MAX_MEMORY_GB, metavar="GiB",
                   help="memory cap per device, fp16 weights (default %(default)g; the NS set keeps its own 0.5)")
    p.add_argument("--noise-repeats", type=positive_int, default=7,
                   help="times one shard is measured afresh for the noise figure (default 7)")
    p.add_argument("--bench-iters", type=positive_int, default=None,
                   help="timed iterations per measurement (default: the evaluator's)")
    p.add_argument("--comm-iters", type=positive_int, default=None,
                   help="timed repetitions of each measured all-to-all (default: the timed iterations, on a CPU "
                        "at least 21)")
    p.add_argument("--compare", action="append", default=[], metavar="[SET=]FILE",
                   help="an eval.py --out file measured elsewhere on the same tasks (default set: the first); "
                        "prints the rank correlations of its costs with this run's (repeatable)")
    p.add_argument("--plans", action="append", default=[], metavar="[SET=]FILE",
                   help="also measure the plans of an eval.py --out file made elsewhere on the same tasks "
                        "(default set: the first), e.g. TorchRec's on a machine where TorchRec imports (repeatable)")
    p.add_argument("--plans-algs", type=name_list, default=None, metavar="ALGS",
                   help="measure only these algorithms' plans of the --plans files, e.g. shardkit,torchrec (default "
                        "all of them)")
    p.add_argument("--random-shards", type=int, default=0, metavar="N",
                   help="also measure N random shards (1-60 tables of the whole dataset, half with dims 4-128) "
                        "and append them to --shards-out, as cost-model data (default 0)")
    p.add_argument("--special-shards", type=int, default=0, metavar="N",
                   help="also measure N random shards of row-wise blocks and data-parallel replicas (with some "
                        "whole tables), compare the emulated H200 on them per class and append them to "
                        "SHARDS_OUT's _pieces file (default 0)")
    p.add_argument("--shard-pool", choices=SHARD_POOLS, default="all",
                   help="the tables random and special shards are drawn from: all (default, the whole dataset) "
                        "or train (the training pool of gen_tasks.py's default split, which no test task "
                        "holds: shards a judge held out by a test task's tables keeps)")
    p.add_argument("--special-slices", type=int_list, default=(4, 8), metavar="NS",
                   help="batch slices the special shards' data-parallel replicas are drawn from: a replica holds "
                        "1/n of the batch, n one of these (default 4,8, the DLRM sets' device counts); the same "
                        "tables and row blocks whatever the slices, so other slices pair with 4 and 8")
    p.add_argument("--no-confirm", dest="confirm", action="store_false",
                   help="measure each plan once; by default each plan's slowest device is measured again afresh and, "
                        "where the two differ by more than 2%%, a third time, the median counting")
    p.add_argument("--shards-out", type=Path, default=None,
                   help="append every measured shard here, one JSON line each (default WORK_DIR/measured_shards.jsonl)")
    p.add_argument("--time-budget", type=positive_float, default=450.0, metavar="S",
                   help="seconds the whole check may take (default 450)")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    for flag, n in (("--random-shards", args.random_shards), ("--special-shards", args.special_shards)):
        if n < 0:
            raise ShardError(f"{flag} must be >= 0, got {n}")
    if any(n < 1 for n in args.special_slices):
        raise ShardError(f"--special-slices must be positive, got {','.join(map(str, args.special_slices))}")
    for sname in args.sets:
        if sname not in SHIPPED_SETS:
            raise ShardError(f"--sets: unknown task set {sname!r} ({', '.join(SHIPPED_SETS)})")
    for pt in args.checkpoint:
        if not os.path.isfile(pt):
            raise ShardError(f"checkpoint not found: {pt}")
    for flag, specs in (("--compare", args.compare), ("--plans", args.plans)):
        for spec in specs:
            path = spec.rpartition("=")[2]
            if not os.path.isfile(path):
                raise ShardError(f"{flag}: file not found: {path}")
    inputs = {f"{flag} {spec}": spec.rpartition("=")[2] for flag, specs in (("--compare", args.compare),
                                                                            ("--plans", args.plans)) for spec in specs}
    check_outputs(args, {"--work-dir": args.work_dir, "--shards-out": args.shards_out}, dirs=["--work-dir"],
                  inputs={**inputs, **{f"--checkpoint {pt}": pt for pt in args.checkpoint}})
    if args.data_dir is not None and not args.data_dir.is_dir():
        raise ShardError(f"--data-dir {args.data_dir}: not a directory")
    cfg = CheckConfig(device=args.device, work_dir=args.work_dir, data_dir=args.data_dir,
                      batch_size=args.batch_size, algs=tuple(args.alg), checkpoints=tuple(args.checkpoint),
                      max_memory=args.max_memory, noise_repeats=args.noise_repeats, bench_iters=args.bench_iters,
                      comm_iters=args.comm_iters, compare=tuple(args.compare), plans=tuple(args.plans), random_shards=args.random_shards,
                      plans_algs=tuple(args.plans_algs) if args.plans_algs else None,
                      special_shards=args.special_shards, shard_pool=args.shard_pool,
                      special_slices=tuple(args.special_slices), confirm=args.confirm, shards_out=args.shards_out, time_budget_s=args.time_budget,
                      sets=tuple(args.sets), max_tasks=args.max_tasks, gpus=tuple(args.gpu_devices) if args.gpu_devices else None)
    summary = run_check(cfg)
    return 1 if summary.get("stopped") else 0


if __name__ == "__main__":
    run_main(main)
