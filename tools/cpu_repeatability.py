#!/usr/bin/env python
"""Does the measured oracle repeat itself? The same plans measured in interleaved rounds.

For ``--num-tasks`` random tasks of ``--num-tables`` tables, the plans of ``--algs`` (default: random,
dim-, lookup- and size-lookup-greedy) on ``--ndevices`` devices are measured afresh (no cache) in
``--rounds`` rounds; every round measures every plan once, in a shuffled order, so a slow spell of the
machine falls on different plans in different rounds. Printed, with the hardware:

- **mean deviation**: over every plan and round, |cost - the plan's median over rounds| / median;
- **p90 max/min**: the 90th percentile over plans of (largest / smallest of its rounds);
- **Spearman**: for every task and every pair of rounds, the rank correlation of the task's plans'
  costs in the two rounds, averaged (ties of the medians' order aside, 1 means every round orders a
  task's plans alike);

and, against the goals of the trustworthy-oracles issue (mean deviation <= 1.5%, p90 max/min <= 1.05,
Spearman >= 0.8), a verdict per figure; then where the deviation comes from: the mean deviation again
with every device's exchange held at its median over the rounds (the compute's share), and with its
compute held there (the exchange's). ``--out`` writes every measurement as JSON lines.

The figures of one run move from run to run by more than a change of protocol may move them (on the
2-core VM, six idle runs of the same protocol gave 1.48-3.34% mean deviation): ``--runs N`` repeats
the whole measurement N times, each with a fresh evaluator (new worker processes, shards built anew)
and its own round orders, prints every run's figures, their least, median and largest, and in how
many runs each goal was met -- the way to tell two protocols apart (alternate their runs).

Example (about 2 min on a 2-core CPU)::

    python tools/cpu_repeatability.py --data-dir data/dlrm_datasets --num-tasks 3 --num-tables 30
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shardcore import argtypes  # noqa: E402
from shardcore.cli import common as cli  # noqa: E402
from shardcore.baselines import make_baseline  # noqa: E402
from shardcore.dataset import DEFAULT_DATA_DIR, load_dataset  # noqa: E402
from shardcore.errors import ShardError  # noqa: E402
from shardcore.io import atomic_open  # noqa: E402
from shardcore.tasks import Task  # noqa: E402
from shardcore.types import Topology  # noqa: E402

GOALS = {"mean_dev_pct": 1.5, "p90_maxmin": 1.05, "spearman": 0.8}


def spearman(a, b) -> float:
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    if ra.std() == 0 or rb.std() == 0:
        return 1.0
    return float(np.corrcoef(ra, rb)[0, 1])


def summarize(costs: dict[tuple[int, str], list[float]], tasks: int, algs) -> dict:
    """The three repeatability figures of ``costs[(task, alg)]`` = the plan's cost in every round."""
    devs, ratios, rhos = [], [], []
    for vals in costs.values():
        med = statistics.median(vals)
        devs.extend(abs(v - med) / med for v in vals)
        ratios.append(max(vals) / min(vals))
    rounds = len(next(iter(costs.values())))
    for t in range(tasks):
        for r1, r2 in itertools.combinations(range(rounds), 2):
            rhos.append(spearman([costs[(t, a)][r1] for a in algs], [costs[(t, a)][r2] for a in algs]))
    return {"mean_dev_pct": 100 * float(np.mean(devs)), "p90_maxmin": float(np.percentile(ratios, 90)),
            "spearman": float(np.mean(rhos)) if rhos else float("nan"), "plans": len(costs), "rounds": rounds}


def deviation_sources(device_costs: dict[tuple[int, str], list]) -> dict:
    """The mean deviation (%) of the plans' costs with one part of every device held at its median over
    the rounds: ``compute_pct`` (the exchange held: what the compute's noise alone makes of the plan
    cost) and ``exchange_pct`` (the compute held). ``device_costs[(task, alg)]``: per round the plan's
    per-device :data:`~shardcore.costs.COST_PARTS`."""
    out = {"compute_pct": [], "exchange_pct": []}
    for rounds in device_costs.values():
        d = np.asarray(rounds, dtype=float)          # rounds x devices x 4
        comp, comm = d[:, :, 0] + d[:, :, 3], d[:, :, 1] + d[:, :, 2]
        for key, cost in (("compute_pct", comp + np.median(comm, axis=0)),
                          ("exchange_pct", np.median(comp, axis=0) + comm)):
            plan = cost.max(axis=1)
            out[key].extend(np.abs(plan / np.median(plan) - 1))
    return {k: 100 * float(np.mean(v)) for k, v in out.items()}


FIGURES = (("mean_dev_pct", "mean deviation from the median", "{:.2f}%", "le"),
           ("p90_maxmin", "p90 max/min", "{:.3f}", "le"),
           ("spearman", "round-pair Spearman per task", "{:.2f}", "ge"))


def _figure(key: str) -> tuple[str, str]:
    """(format, "le" or "ge") of a figure."""
    return next((fmt, better) for k, _, fmt, better in FIGURES if k == key)


def goal_met(key: str, value: float) -> bool:
    return value <= GOALS[key] if _figure(key)[1] == "le" else value >= GOALS[key]


def goal_text(key: str) -> str:
    fmt, better = _figure(key)
    return ("<= " if better == "le" else ">= ") + fmt.format(GOALS[key])


def across_runs(summaries: list[dict]) -> dict:
    """Per figure over the runs' :func:`summarize` results: least, median, largest and the runs that met
    the goal."""
    out = {}
    for key, *_ in FIGURES:
        vals = [s[key] for s in summaries]
        out[key] = {"min": float(min(vals)), "median": float(statistics.median(vals)), "max": float(max(vals)),
                    "met": sum(goal_met(key, v) for v in vals), "runs": len(vals)}
    return out


def parse_args(argv):
    p = cli.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=f"dataset directory (default {DEFAULT_DATA_DIR})")
    cli.add_device_args(p)
    p.add_argument("--num-tasks", type=argtypes.positive_int, default=3, help="random tasks (default 3)")
    p.add_argument("--num-tables", type=argtypes.positive_int, default=30, help="tables per task (default 30)")
    p.add_argument("--rounds", type=argtypes.positive_int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--algs", type=argtypes.name_list, default=["random", "dim_greedy", "lookup_greedy",
                                                          "size_lookup_greedy"],
                   help="baselines whose plans are measured (default random,dim_greedy,lookup_greedy,"
                        "size_lookup_greedy)")
    p.add_argument("--seed", type=argtypes.seed_int, default=0, help="seed of the tasks and of the round orders (default 0)")
    p.add_argument("--runs", type=argtypes.positive_int, default=1,
                   help="repeat the whole measurement this many times, each with fresh workers and its own round "
                        "orders, and print the figures' spread over the runs (default 1)")
    p.add_argument("--out", default=None, help="write every measurement here as JSON lines")
    cli.add_memory_args(p)
    cli.add_oracle_args(p)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    cli.check_out_file(args, args.out)   # before any measuring, never an input
    if args.oracle != "measured":
        raise ShardError("cpu_repeatability.py measures the measured oracle: drop --oracle")
    if args.rounds < 2:
        raise ShardError("--rounds must be at least 2")
    devices = cli.device_ids(args)
    ndevices = cli.num_devices(args)
    ds = load_dataset(args.data_dir, with_lookups=False)
    if args.num_tables > len(ds.tables):
        raise ShardError(f"--num-tables {args.num_tables}: the dataset has {len(ds.tables)} tables")
    rng = np.random.default_rng(args.seed)
    tasks = [Task(tuple(int(i) for i in sorted(rng.choice(len(ds.tables), args.num_tables, replace=False))))
             for _ in range(args.num_tasks)]
    plans = {}
    for t, task in enumerate(tasks):
        tables = task.tables(ds.tables)
        for a in args.algs:
            plan = make_baseline(a, seed=args.seed).shard(tables, Topology(ndevices, float("inf")))
            plans[(t, a)] = plan.device_pieces
    args.no_cache = True
    records, summaries = [], []
    t0 = time.perf_counter()
    for run in range(args.runs):   # the first pass goes on with the tasks' generator: --runs 1 measures what a single pass does
        if args.runs > 1:
            print(f"pass {run + 1} of {args.runs}", flush=True)
        s, hardware, noise = measure_run(args, plans, tasks, devices, ndevices,
                                         np.random.default_rng([args.seed, run]) if run else rng, run, records, t0)
        summaries.append(s)
        report(s, hardware, noise)
    spread = across_runs(summaries) if args.runs > 1 else None
    if spread:
        print(f"\nover {args.runs} runs ({hardware}): least / median / largest, runs that met the goal")
        for key, label, fmt, _ in FIGURES:
            f = spread[key]
            print(f"  {label:<32} {fmt.format(f['min']):>8} {fmt.format(f['median']):>8} {fmt.format(f['max']):>8}"
                  f"   goal {goal_text(key):<8} met in {f['met']} of {f['runs']}")
    if args.out:
        with atomic_open(args.out) as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
            last = {"summary": summaries[-1], "hardware": hardware, "argv": sys.argv[1:]}
            if spread:
                last.update(runs=summaries, across_runs=spread)
            f.write(json.dumps(last) + "\n")
        print(f"wrote {args.out}")


def measure_run(args, plans, tasks, devices, ndevices, rng, run: int, records: list, t0: float):
    """One run: a fresh evaluator measures every plan once per round, in ``rng``'s shuffled orders;
    appends its measurements to ``records``; returns its summary, the hardware and the oracle's noise."""
    costs: dict[tuple[int, str], list[float]] = {k: [] for k in plans}
    parts: dict[tuple[int, str], list] = {k: [] for k in plans}
    with cli.open_evaluator(args, args.data_dir, devices, ndevices) as ev:
        hardware = ev.hardware
        print(f"{len(plans)} plans x {args.rounds} rounds on {hardware}", flush=True)
        for r in range(args.rounds):
            order = list(plans)
            rng.shuffle(order)
            for k in order:
                res = ev.evaluate(plans[k], no_cache=True)
                costs[k].append(res.cost_ms)
                parts[k].append(res.device_costs_ms)
                records.append({"run": run, "round": r, "task": k[0], "alg": k[1], "cost_ms": res.cost_ms,
                                "device_costs_ms": res.device_costs_ms, "hardware": hardware})
            print(f"  round {r + 1}/{args.rounds} done ({time.perf_counter() - t0:.0f} s)", flush=True)
        noise = ev.info.noise_pct
    s = summarize(costs, len(tasks), args.algs)
    s["sources"] = deviation_sources(parts)
    print(f"\nplan costs (ms, {hardware}):")
    for k, vals in costs.items():
        print(f"  task {k[0]} {k[1]:<20} " + " ".join(f"{v:8.2f}" for v in vals)
              + f"   max/min {max(vals) / min(vals):.3f}")
    return s, hardware, noise


def report(s: dict, hardware: str, noise) -> None:
    """One run's three figures against the goals, the oracle's noise and where the deviation comes from."""
    print(f"\nrepeatability over {s['plans']} plans x {s['rounds']} rounds ({hardware}):")
    for key, label, fmt, _ in FIGURES:
        print(f"  {label:<32} {fmt.format(s[key]):>8}   goal {goal_text(key):<8} "
              f"{'met' if goal_met(key, s[key]) else 'NOT met'}")
    if noise is not None:
        print(f"  the oracle's own noise estimate: {noise:.2f}%")
    print(f"  where it comes from: {s['sources']['compute_pct']:.2f}% with every device's exchange at its median "
          f"over the rounds (the compute's noise), {s['sources']['exchange_pct']:.2f}% with its compute there "
          "(the exchange's)")


if __name__ == "__main__":
    cli.run_main(main)
