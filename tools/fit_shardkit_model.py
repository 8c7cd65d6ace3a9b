#!/usr/bin/env python3
"""Fit shardkit's cost model for the measured landscape on this machine's measurements.

  python tools/fit_shardkit_model.py --data-dir data/dlrm_datasets --cache-path data/cost_cache.sqlite \
      --exclude-tasks data/dlrm_tasks_50/test.txt --out models/shardkit/cpu_cost_model.json

Compute: the shard measurements the cache holds for the dataset at the batch (e.g. from
collect_compute_cost_data.py, which draws from the training pool of tables), fitted with the emulator's
features and non-negative least squares (shardkit_planner/costmodel.py). Exchange: the cache's plan
measurements (eval.py runs), both phases, one latency and bandwidth per device count. Shards and plans
with a table of an --exclude-tasks file are left out, so the test tables stay unseen. Writes the model atomically (JSON) and prints what it was fitted on.
"""

import argparse
import collections
import os


from shardcore.cli.common import ArgumentParser as OneLineParser, check_out_file, run_main
from shardcore.dataset import DEFAULT_DATA_DIR, load_dataset
from shardcore.errors import ShardError
from shardcore.oracles.factory import batch_size_int
from shardcore.oracles.setting import EXACT_SGD
from shardcore.tasks import load_tasks


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=f"dataset measured (default {DEFAULT_DATA_DIR})")
    p.add_argument("--cache-path", default="data/cost_cache.sqlite", help="measurement cache (default data/cost_cache.sqlite)")
    p.add_argument("--batch-size", type=batch_size_int, default=None, metavar="B",
                   help="batch of the measurements (default: the dataset's)")
    p.add_argument("--weights-precision", choices=["fp16", "fp32"], default="fp16", help="weights precision (default fp16)")
    p.add_argument("--optimizer", default=EXACT_SGD, help=f"sparse optimizer of the measurements (default {EXACT_SGD})")
    p.add_argument("--hardware", default=None, metavar="TEXT",
                   help="the cache's hardware fingerprint to use, or a part of it (default: the only one "
                        "the cache holds for this dataset and batch)")
    p.add_argument("--exclude-tasks", default=None, metavar="FILES",
                   help="comma-separated task files whose tables no fitted shard may contain (the test tasks)")
    p.add_argument("--out", default="models/shardkit/cpu_cost_model.json",
                   help="where the model goes (default models/shardkit/cpu_cost_model.json)")
    p.add_argument("--report", action="store_true",
                   help="also print the compute fit's in-sample MAPE and its 5-fold MAPE by table (a shard "
                        "predicted by a fit on the shards that share no table of its fold), and the "
                        "exchange's per-device MAPE per device count, on the plans it was fitted on and on "
                        "those holding an excluded table")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    check_out_file(args, args.out)   # never the cache or a task file it reads
    from shardcore.oracles.cache import CostCache
    from shardcore.oracles.setting import dataset_digest
    from shardkit_planner.costmodel import compute_fit_errors, exchange_fit_errors, fit_cost_model

    if not os.path.isfile(args.cache_path):
        raise ShardError(f"--cache-path {args.cache_path}: no such file")
    ds = load_dataset(args.data_dir)
    batch = args.batch_size or ds.batch_size
    exclude = set()
    for path in (args.exclude_tasks.split(",") if args.exclude_tasks else []):
        for task in load_tasks(path.strip(), num_tables=ds.num_tables):
            exclude.update(task.table_ids)
    with CostCache(args.cache_path) as cache:
        digest = dataset_digest(ds)
        hw = collections.Counter(e.hardware for e in cache.shard_entries(dataset=digest, batch_size=batch))
        hws = [h for h in hw if args.hardware is None or args.hardware in h]
        if not hws:
            raise ShardError(f"{args.cache_path}: no shard measurements of {args.data_dir} at batch {batch}"
                             + (f" on hardware matching {args.hardware!r}" if args.hardware else ""))
        if len(hws) > 1:
            raise ShardError(f"{args.cache_path}: measurements from {len(hws)} machines; choose one with --hardware")
        model = fit_cost_model(cache, ds, batch, hardware=hws[0], precision=args.weights_precision,
                               optimizer=args.optimizer, data_dir=args.data_dir, exclude_tables=exclude)
        if args.report:
            e = compute_fit_errors(cache, ds, batch, hardware=hws[0], precision=args.weights_precision,
                                   optimizer=args.optimizer, data_dir=args.data_dir, exclude_tables=exclude)
            x = exchange_fit_errors(cache, ds, batch, model, hardware=hws[0], precision=args.weights_precision,
                                    optimizer=args.optimizer, exclude_tables=exclude)
    model.save(args.out)
    print(f"fitted on {hws[0]}: {model.source}; exchange {model.comm.describe()}")
    for n, comm in sorted((model.comm_by_devices or {}).items()):
        print(f"  exchange on {n} devices: {comm.describe()}")
    if args.report:
        print(f"compute fit on its {e['shards']} shards: in-sample MAPE forward {e['in_fw']:.2f}%, backward "
              f"{e['in_bw']:.2f}%, fw+bw {e['in_total']:.2f}%; 5-fold by table: fw+bw {e['cv_total']:.2f}% "
              f"over {e['cv_predictions']} held-out predictions")
        for n, r in x.items():
            fit = "its own fit" if r["own"] else "the fit over all device counts"
            held = (f"; on the {r['held_devices']} of plans holding an excluded table (held out) {r['held_fw']:.1f} / "
                    f"{r['held_bw']:.1f}%" if r["held_devices"] else "")
            print(f"exchange on {n} devices ({fit}): per-device MAPE forward / backward on the {r['in_devices']} "
                  f"devices it may use {r['in_fw']:.1f} / {r['in_bw']:.1f}%{held}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    run_main(main)
