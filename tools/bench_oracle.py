#!/usr/bin/env python
"""Measure the hardware cost oracle itself: its noise, its speed and how non-additive costs are.

Prints, for this machine:

(a) noise: one plan (``--num-tables`` random tables of the dataset on ``--ndevices`` devices,
    random placement, fixed seed) evaluated ``--repeats`` times with the cache off: mean, standard
    deviation and coefficient of variation of the plan cost;
(b) speed: the workers' start-up time; the wall time of evaluating a plan once the workers are up
    (the first evaluation, repeats of the same plan, and several different plans of the same size,
    all measured afresh); the time of a cache hit (median of many);
(c) non-additivity: for a few shards, the measured shard compute cost beside the sum of its tables'
    single-table compute costs (each the median of ``--additivity-repeats`` fresh measurements).

Example::

    python tools/bench_oracle.py --data-dir data/dlrm_datasets --gpu-devices 0,1,2,3 --batch-size 4096
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import numpy as np

from shardcore import argtypes
from shardcore.cli import common as cli
from shardcore.oracles.measured.benchmark import DEFAULT_BENCH_ITERS, DEFAULT_WARMUP_ITERS
from shardcore.oracles.setting import EXACT_SGD, OPTIMIZERS
from shardcore.oracles.cache import CostCache
from shardcore.dataset import DEFAULT_DATA_DIR, load_dataset
from shardcore.errors import ShardError
from shardcore.oracles.factory import batch_size_int, open_oracle
from shardcore.planning import DEFAULT_BATCH_SIZE


def parse_args(argv):
    p = cli.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=f"dataset directory (default {DEFAULT_DATA_DIR})")
    cli.add_device_args(p)
    p.add_argument("--batch-size", type=batch_size_int, default=DEFAULT_BATCH_SIZE, help="batch size (default %(default)s)")
    p.add_argument("--num-tables", type=argtypes.positive_int, default=50, help="tables in the plan (default 50)")
    p.add_argument("--repeats", type=argtypes.positive_int, default=5, help="evaluations for the noise figure (default 5)")
    p.add_argument("--bench-iters", type=argtypes.positive_int, default=DEFAULT_BENCH_ITERS,
                   help=f"timed iterations per measurement, median kept (default {DEFAULT_BENCH_ITERS})")
    p.add_argument("--warmup-iters", type=argtypes.nonnegative_int, default=DEFAULT_WARMUP_ITERS,
                   help=f"untimed iterations before timing (default {DEFAULT_WARMUP_ITERS})")
    p.add_argument("--comm-iters", type=argtypes.positive_int, default=None, help="default: --bench-iters")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default=EXACT_SGD,
                   help=f"sparse optimizer applied in the backward (default {EXACT_SGD})")
    p.add_argument("--weights-precision", choices=("fp16", "fp32"), default="fp16",
                   help="weight precision of the benchmarked tables (default fp16)")
    p.add_argument("--shards", type=argtypes.positive_int, default=4,
                   help="shards for the non-additivity figure (default 4)")
    p.add_argument("--new-plans", type=argtypes.positive_int, default=5,
                   help="different plans timed after plan A for the speed figure (default 5)")
    p.add_argument("--additivity-repeats", type=argtypes.positive_int, default=3,
                   help="measurements per shard and table for (c), their median is used (default 3)")
    p.add_argument("--seed", type=argtypes.seed_int, default=0, help="seed of the random tables and plans (default 0)")
    p.add_argument("--cache-path", default=None,
                   help="cache file for the cache-hit figure (default: a temporary file, removed after)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the figures as JSON")
    return p.parse_args(argv)


def random_plan(tables, num_tables, ndevices, rng):
    if num_tables > len(tables):
        raise ShardError(f"--num-tables {num_tables} but the dataset has {len(tables)} tables")
    ids = rng.choice(len(tables), size=num_tables, replace=False)
    shards = [[] for _ in range(ndevices)]
    for i in ids:
        shards[int(rng.integers(ndevices))].append(tables[int(i)])
    return shards


def fmt_costs(costs):
    return "[" + ", ".join("(" + ", ".join(f"{v:.2f}" for v in dev) + ")" for dev in costs) + "]"


def main(argv=None):
    args = parse_args(argv)
    cli.check_out_file(args, args.json, "--json")   # before any measuring; never the dataset or the cache
    ndev = len(cli.device_ids(args))
    ds = load_dataset(args.data_dir, with_lookups=False)
    rng = np.random.default_rng(args.seed)
    plan_a = random_plan(ds.tables, args.num_tables, ndev, rng)
    other_plans = [random_plan(ds.tables, args.num_tables, ndev, rng) for _ in range(args.new_plans)]
    tmp = None
    cache_path = args.cache_path
    if cache_path is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench_oracle_")
        cache_path = os.path.join(tmp.name, "cache.sqlite")
    out: dict = {"data_dir": str(args.data_dir), "ndevices": ndev, "batch_size": args.batch_size,
                 "num_tables": args.num_tables, "bench_iters": args.bench_iters,
                 "warmup_iters": args.warmup_iters, "comm_iters": args.comm_iters or args.bench_iters,
                 "optimizer": args.optimizer, "precision": args.weights_precision}
    print(f"dataset {args.data_dir}: {len(ds.tables)} tables; plan: {args.num_tables} tables on {ndev} devices, "
          f"batch {args.batch_size}; warmup {args.warmup_iters}, bench {args.bench_iters} iterations")
    load_before = os.getloadavg()
    print("load average before: " + ", ".join(f"{x:.2f}" for x in load_before)
          + f" ({os.cpu_count()} cores; other processes' load shows up in the figures)")
    try:
        t0 = time.perf_counter()
        ev = open_oracle(args.data_dir, device_ids=cli.device_ids(args), bench_iters=args.bench_iters,
                         warmup_iters=args.warmup_iters, comm_iters=args.comm_iters, optimizer=args.optimizer,
                         precision=args.weights_precision, batch_size=args.batch_size, cache=CostCache(cache_path))
        with ev:
            startup = time.perf_counter() - t0
            out["device"] = ev.info.device_type
            print(f"worker start-up: {startup:.2f} s ({ndev} workers, {ev.info.device_type})")

            # (b) speed, then (a) noise: all measured afresh (cache reads off)
            first = ev.evaluate(plan_a, no_cache=True)
            print(f"\n(b) speed\n  first evaluation of plan A: {first.wall_s:.2f} s  (cost {first.cost_ms:.2f} ms)")
            runs = [first]
            for _ in range(args.repeats):
                runs.append(ev.evaluate(plan_a, no_cache=True))
            repeat_walls = [r.wall_s for r in runs[1:]]
            others = [ev.evaluate(plan, no_cache=True) for plan in other_plans]
            other_walls = [r.wall_s for r in others]
            print(f"  repeat evaluations of plan A: median {statistics.median(repeat_walls):.2f} s "
                  f"(min {min(repeat_walls):.2f}, max {max(repeat_walls):.2f})")
            print(f"  {len(others)} new plans of the same size, one after another: "
                  + ", ".join(f"{w:.2f}" for w in other_walls) + " s")
            ev.evaluate(plan_a)  # stores plan A
            hits = []
            for _ in range(50):
                r = ev.evaluate(plan_a)
                assert r.from_cache
                hits.append(r.wall_s * 1e3)
            print(f"  cache hit: median {statistics.median(hits):.3f} ms (max {max(hits):.3f} ms over {len(hits)})")
            out["speed"] = {"startup_s": startup, "first_eval_s": first.wall_s,
                            "repeat_eval_s_median": statistics.median(repeat_walls),
                            "repeat_eval_s": repeat_walls, "new_plan_eval_s": other_walls,
                            "cache_hit_ms_median": statistics.median(hits), "cache_hit_ms_max": max(hits)}

            costs = [r.cost_ms for r in runs[1:]]
            mean = statistics.mean(costs)
            std = statistics.stdev(costs) if len(costs) > 1 else 0.0
            print(f"\n(a) noise: plan A evaluated {len(costs)} times, cache off")
            for k, r in enumerate(runs[1:]):
                print(f"  run {k + 1}: cost {r.cost_ms:8.2f} ms  per device {fmt_costs(r.device_costs_ms)}")
            print(f"  mean {mean:.2f} ms, std {std:.2f} ms, CV {100 * std / mean:.2f}%")
            out["noise"] = {"costs_ms": costs, "mean_ms": mean, "std_ms": std, "cv": std / mean,
                            "device_costs_ms": [r.device_costs_ms for r in runs[1:]]}

            # (c) non-additivity
            print("\n(c) non-additivity: shard compute (fw+bw) vs the sum of its tables alone")
            shards = [s for s in plan_a + sum(other_plans, []) if len(s) >= 2][: args.shards]
            singles = sorted({(t.index, t.row, t.dim): t for s in shards for t in s}.values(),
                             key=lambda t: t.index)

            def median_costs(group):
                runs = [ev.measure_devices(group, no_cache=True) for _ in range(args.additivity_repeats)]
                return [statistics.median(r[k].total_ms for r in runs) for k in range(len(group))]

            single_costs = median_costs([[t] for t in singles])
            single = {(t.index, t.row, t.dim): c for t, c in zip(singles, single_costs)}
            shard_costs = median_costs(shards)
            rows = []
            for s, c in zip(shards, shard_costs):
                total = sum(single[(t.index, t.row, t.dim)] for t in s)
                rows.append({"tables": [t.index for t in s], "shard_ms": c, "sum_single_ms": total,
                             "ratio": c / total if total > 0 else float("nan")})
                print(f"  {len(s):3d} tables: shard {c:8.2f} ms, sum of singles {total:8.2f} ms, "
                      f"ratio {rows[-1]['ratio']:.2f}")
            out["non_additivity"] = rows
    finally:
        if tmp is not None:
            tmp.cleanup()
    load_after = os.getloadavg()
    print("\nload average after: " + ", ".join(f"{x:.2f}" for x in load_after))
    out["load_average"] = {"before": list(load_before), "after": list(load_after)}
    if args.json:
        from shardcore import io

        io.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    cli.run_main(main)
