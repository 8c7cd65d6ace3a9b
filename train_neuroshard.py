#!/usr/bin/env python3
"""NeuroShard end to end: collect cost data on the hardware oracle, pre-train the three cost models.

  python train_neuroshard.py --gpu-devices 0,1,2,3 --dataset-dir data/dlrm_datasets \\
      --compute-samples 2000 --comm-samples 500 --out-dir models/neuroshard

Steps (each with a progress bar): (1) random shards -> data/cost_data/compute/compute_costs.csv;
(2) random all-to-alls with start delays -> data/cost_data/comm_<N>/comm_costs.csv, one folder per device
count of --comm-devices (default: the plan's); (3) the compute cost model; (4) the forward and backward
communication models, trained on every count's data (a model fitted on 4-device all-to-alls only
extrapolates on 8 devices: collect on every count you will plan for, as the original collects on its
GPUs). Collection resumes from existing data (only the missing samples are measured; --skip-collection
trains on what is there).
Writes <out-dir>/compute.pt, fw_comm.pt, bw_comm.pt and neuroshard.pt (all three in one file:
`eval.py --alg <out-dir>/neuroshard.pt`, or `--alg neuroshard` with the default paths).
"""

import argparse
import contextlib
import os
import time

from tqdm import tqdm

from neuroshard import config
from neuroshard.checkpoints import save_bundle, save_model
from neuroshard.cli import add_collection_args, add_training_args, training_config
from neuroshard.collect import (check_comm_args, check_compute_args, check_resumable, collect_comm, collect_compute,
                                evaluator_setting, load_comm_data, load_compute_data)
from neuroshard.config import SearchConfig
from neuroshard.curve import write_curve
from neuroshard.fitting import fit_comm_model, fit_compute_model
from shardcore.argtypes import MAX_DEVICES, int_list
from shardcore.cli.common import ArgumentParser as OneLineParser
from shardcore.cli.common import add_device_args, add_memory_args, add_oracle_args, device_ids, num_devices, open_evaluator
from shardcore.cli.common import run_main, serve_if_torchrun_rank
from shardcore.errors import ShardError
from shardcore.cli.common import check_outputs
from shardcore.io import check_finite
from shardcore.processes import output_lock


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_device_args(p, default_ndevices=4)
    p.add_argument("--compute-data-dir", default=config.COMPUTE_DATA_DIR,
                   help="compute cost data directory (default %(default)s)")
    p.add_argument("--comm-devices", type=int_list, default=None, metavar="N,N",
                   help="device counts whose all-to-alls are collected, one folder each; the communication models "
                        "are trained on all of them: every count you will plan for (default: the plan's device "
                        "count). A count other than the plan's measures on devices 0..N-1 (or the first N of "
                        "--gpu-devices)")
    p.add_argument("--comm-data-dir", default=None, metavar="DIR[,DIR]",
                   help="communication cost data directories, one per --comm-devices count (default "
                        "data/cost_data/comm_<number of devices>)")
    p.add_argument("--out-dir", "--out_dir", dest="out_dir", default=config.MODEL_DIR,
                   help="where the models go (default %(default)s); models an earlier run left there are refused "
                        "unless --overwrite")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the models an earlier run left in --out-dir (they are trained anew from the data)")
    add_memory_args(p, default_max_memory=config.COLLECTION.max_mem_gb,
                    default_precision=config.COLLECTION.weights_precision)
    add_collection_args(p, "train", group=p.add_argument_group("collection"))
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_training_args(p, config.compute_model_config(), what="compute model")
    add_training_args(p, config.comm_model_config(), prefix="comm-", what="communication models")
    add_oracle_args(p)
    return p


def comm_plan(args: argparse.Namespace, ndevices: int) -> tuple[list[int], list[str]]:
    """The device counts of the communication data (``--comm-devices``, default the plan's) and their
    folders (``--comm-data-dir``, one per count, default data/cost_data/comm_<N>); one-line errors."""
    counts = list(args.comm_devices) if args.comm_devices else [ndevices]
    shown = ",".join(map(str, counts))
    if min(counts) < 2 or max(counts) > MAX_DEVICES:
        raise ShardError(f"--comm-devices: NeuroShard's communication data need at least 2 devices (and at most "
                         f"{MAX_DEVICES}), got {shown}")
    if len(set(counts)) != len(counts):
        raise ShardError(f"--comm-devices lists a count twice: {shown}")
    if getattr(args, "launcher", "spawn") == "torchrun" and counts != [ndevices]:
        raise ShardError(f"--comm-devices {shown}: under torchrun every all-to-all runs on its {ndevices} ranks; "
                         "collect other counts in another launch")
    if args.comm_data_dir is None:
        return counts, [os.path.join(config.COST_DATA_DIR, f"comm_{n}") for n in counts]
    dirs = [d for d in args.comm_data_dir.split(",") if d]
    if len(dirs) != len(counts):
        raise ShardError(f"--comm-data-dir lists {len(dirs)} folder(s) for {len(counts)} device count(s) "
                         f"({shown}): give one per count")
    return counts, dirs


def collect_comm_of(args: argparse.Namespace, ev, n: int, comm_dir: str) -> None:
    print(f"[2/4] communication data, {n} devices")
    s = collect_comm(ev, comm_dir, args.comm_samples, t_range=args.T_range, sleep_range=args.sleep_range,
                     max_dim=args.max_dim, seed=args.seed, from_cache=args.from_cache, progress=not args.quiet)
    print(f"      {s.path}: {s.total} samples ({s.added} added) in {s.seconds:.1f} s")


def main(argv=None):
    args = build_parser().parse_args(argv)
    served = serve_if_torchrun_rank(args)   # torchrun ranks other than 0 measure, nothing else
    if served is not None:
        return served
    ids = device_ids(args)
    ndevices = num_devices(args)
    counts, comm_dirs = comm_plan(args, ndevices)
    compute_cfg = training_config(args, config.compute_model_config(), seed=args.seed)
    comm_cfg = training_config(args, config.comm_model_config(), prefix="comm-", seed=args.seed)
    # everything the later steps need is checked now, not after the collection (which takes long)
    check_compute_args(args.max_tables, args.max_memory, args.max_dim)
    check_comm_args(args.T_range, args.sleep_range, args.max_dim)
    data = {"--compute-data-dir": (args.compute_data_dir, [config.COMPUTE_CSV, config.META_JSON])}
    for n, d in zip(counts, comm_dirs):
        data[f"--comm-data-dir ({n} devices)"] = (d, [config.COMM_CSV, config.META_JSON])
    check_outputs(args, {}, folders={"--out-dir": (args.out_dir, MODEL_FILES),
                                     **({} if args.skip_collection else data)})
    left = [f for f in MODEL_FILES[:4] if os.path.isfile(os.path.join(args.out_dir, f))]
    if left and not args.overwrite:
        raise ShardError(f"--out-dir {args.out_dir} holds the models of an earlier run ({', '.join(left)}): pass "
                         "--overwrite to replace them, or choose another --out-dir")
    with contextlib.ExitStack() as locks:   # one run at a time writes each folder
        held = set()
        for flag, (folder, _) in [("--out-dir", (args.out_dir, ())), *([] if args.skip_collection else data.items())]:
            if os.path.abspath(folder) not in held:
                held.add(os.path.abspath(folder))
                locks.enter_context(output_lock(folder, flag))
        return train(args, ids, ndevices, counts, comm_dirs, compute_cfg, comm_cfg)


#: what a run writes in --out-dir
MODEL_FILES = ("compute.pt", "fw_comm.pt", "bw_comm.pt", "neuroshard.pt", "train_log.csv", "train_curve.png")


def train(args, ids, ndevices, counts, comm_dirs, compute_cfg, comm_cfg):
    t0 = time.perf_counter()
    if not args.skip_collection:
        with open_evaluator(args, args.dataset_dir, ids) as ev:
            # samples already there of another setting are refused now, not after the compute collection
            check_resumable(args.compute_data_dir, "compute", evaluator_setting(ev, exchange=False))
            if ndevices in counts:
                check_resumable(comm_dirs[counts.index(ndevices)], "comm", evaluator_setting(ev))
            print(f"[1/4] compute data: workers up in {ev.info.startup_s:.1f} s on {ev.info.device_type} "
                  f"({ev.ndevices} devices, batch {ev.batch_size})")
            s = collect_compute(ev, args.compute_data_dir, args.compute_samples, max_tables=args.max_tables,
                                max_mem_gb=args.max_memory, max_dim=args.max_dim, pool=args.pool, seed=args.seed,
                                from_cache=args.from_cache, progress=not args.quiet,
                                group_tables=args.group_tables, group_shards=args.group_shards,
                                whole_share=args.whole_share, pf_augment=args.pf_augment)
            print(f"      {s.path}: {s.total} shards ({s.added} added, {s.from_cache} from the cache) "
                  f"in {s.seconds:.1f} s")
            if ndevices in counts:
                collect_comm_of(args, ev, ndevices, comm_dirs[counts.index(ndevices)])
        for n, d in zip(counts, comm_dirs):
            if n != ndevices:
                devices = ids[:n] if n <= len(ids) else list(range(n))
                with open_evaluator(args, args.dataset_dir, devices, ndevices=n) as ev:
                    collect_comm_of(args, ev, n, d)
    shards, costs, setting = load_compute_data(args.compute_data_dir)
    print(f"[3/4] compute model on {len(shards)} shards")
    with tqdm(total=compute_cfg.epochs, desc="compute model", unit="epoch", disable=args.quiet,
              dynamic_ncols=True) as bar:
        compute, res = fit_compute_model(shards, costs, compute_cfg, setting=setting, progress=bar)
    fits = {"compute": res}
    t = res.test_mape
    print(f"      held-out test MAPE: total {t['total']:.2f}%, forward {t['fw']:.2f}%, backward {t['bw']:.2f}% "
          f"(best epoch {res.best_epoch}, {res.num_test} test shards)")
    dims, delays, fw, bw, setting = load_comm_data(",".join(comm_dirs))
    print(f"[4/4] communication models on {len(dims)} samples of {' and '.join(map(str, counts))} devices")
    models = {}
    for kind, targets in (("fw_comm", fw), ("bw_comm", bw)):
        with tqdm(total=comm_cfg.epochs, desc=kind, unit="epoch", disable=args.quiet, dynamic_ncols=True) as bar:
            models[kind], res = fit_comm_model(kind, dims, targets, delays, comm_cfg, setting=setting, progress=bar)
        fits[kind] = res
        print(f"      {kind}: held-out test MAPE {res.test_mape['per_device']:.2f}% per device "
              f"(best epoch {res.best_epoch}, {res.num_test} test samples)")
    # the three models are written only once all three were fitted and kept (a refused communication
    # model leaves compute.pt as it was), each checked finite before the first is written
    fitted = {"compute": compute, **models}
    for kind, model in fitted.items():
        check_finite(model.state(), f"{os.path.join(args.out_dir, kind + '.pt')}: not saved",
                     "training diverged; lower the learning rate")
    for kind, model in fitted.items():
        save_model(model, os.path.join(args.out_dir, f"{kind}.pt"))
    curve = write_curve(fits, os.path.join(args.out_dir, "train_log.csv"), os.path.join(args.out_dir, "train_curve.png"))
    print(f"      learning curves: {', '.join(str(p) for p in curve)}")
    bundle = os.path.join(args.out_dir, "neuroshard.pt")
    save_bundle(bundle, compute, models["fw_comm"], models["bw_comm"], SearchConfig().to_dict())
    print(f"wrote {args.out_dir}/compute.pt, fw_comm.pt, bw_comm.pt and neuroshard.pt in "
          f"{time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    run_main(main)
