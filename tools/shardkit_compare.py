#!/usr/bin/env python3
"""shardkit against the best anchor of an eval.py --out file (one run, plans side by side).

  python tools/shardkit_compare.py results/shardkit/emu_dlrm50.jsonl [more.jsonl ...]

Per file: every algorithm's mean plan cost over the tasks all of them planned feasibly, its mean
imbalance (max / mean of the devices' costs), and shardkit's margin below the best other algorithm's
mean ("best anchor"); --anchors restricts which algorithms count as anchors.
"""

import argparse
import json
import statistics

import numpy as np


from shardcore.cli import ArgumentParser as OneLineParser, run_main
from shardcore.errors import ShardError


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="eval.py --out files (measured or emulated)")
    p.add_argument("--alg", default="shardkit", help="the algorithm compared (default shardkit)")
    p.add_argument("--anchors", default=None, help="comma-separated anchors (default: every other algorithm)")
    return p


def summarize(path: str, alg: str, anchors: list[str] | None) -> str:
    try:
        with open(path, "rb") as fh:
            recs = [json.loads(x) for x in fh.read().decode("utf-8").splitlines() if x.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ShardError(f"{path}: not a readable eval.py --out file ({exc})") from None
    by: dict[str, dict[int, dict]] = {}
    for r in recs:
        by.setdefault(r["alg"], {})[int(r["task"])] = r
    if alg not in by:
        raise ShardError(f"{path}: no {alg} records")
    algs = [a for a in by if a == alg or anchors is None or a in anchors]
    tasks = set.intersection(*({t for t, r in by[a].items() if r.get("cost_ms") is not None} for a in algs))
    if not tasks:
        raise ShardError(f"{path}: no task every algorithm planned and measured")
    lines = [f"{path}: {len(tasks)} tasks, {recs[0].get('hardware', '?')}",
             f"| alg | mean cost ms | mean imbalance | vs {alg} |", "|---|---|---|---|"]
    mean = {a: statistics.fmean(by[a][t]["cost_ms"] for t in tasks) for a in algs}

    def imb(r):
        tot = [sum(c) for c in r["device_costs_ms"]]
        return max(tot) / (sum(tot) / len(tot))

    for a in sorted(algs, key=lambda a: mean[a]):
        im = statistics.fmean(imb(by[a][t]) for t in tasks)
        rel = "" if a == alg else f"{100.0 * (mean[alg] / mean[a] - 1):+.1f}%"
        lines.append(f"| {a} | {mean[a]:.4g} | {im:.3f} | {rel} |")
    best = min((a for a in algs if a != alg), key=lambda a: mean[a])
    margin = 100.0 * (1 - mean[alg] / mean[best])
    wins = sum(by[alg][t]["cost_ms"] <= min(by[a][t]["cost_ms"] for a in algs if a != alg) for t in tasks)
    lines.append(f"{alg}: {margin:.1f}% below the best anchor ({best}); best on {wins}/{len(tasks)} tasks; "
                 f"target >= 5%: {'met' if margin >= 5.0 else 'NOT met'}")
    order = sorted(tasks)
    lo, hi = margin_interval([by[alg][t]["cost_ms"] for t in order], [by[best][t]["cost_ms"] for t in order])
    lines.append(f"  95% paired bootstrap interval of the margin (tasks resampled): {lo:.1f}% .. {hi:.1f}%")
    choice = [by[alg][t].get("shardkit_model_choice_ms") for t in order]
    if all(c is not None for c in choice):
        used = sum(int(by[alg][t].get("shardkit_measurements", 0)) for t in order)
        first = statistics.fmean(choice)
        rel = 100.0 * (1 - first / mean[best])
        lines.append(f"  measured refinement: {used} plan measurements; the cost model's own first choice "
                     f"measured {first:.4g} ms on average ({abs(rel):.1f}% {'below' if rel >= 0 else 'above'} "
                     f"the best anchor); the kept plans measured again afresh: {mean[alg]:.4g} ms")
    spread = [abs(c - statistics.median(r["repeat_costs_ms"])) / statistics.median(r["repeat_costs_ms"])
              for a in algs for t in order for r in [by[a][t]] if len(r.get("repeat_costs_ms") or ()) > 1
              for c in r["repeat_costs_ms"]]
    if spread:
        lines.append(f"  repeatability (--repeats): a round's plan cost is {100.0 * statistics.fmean(spread):.1f}% "
                     f"from its plan's median on average (largest {100.0 * max(spread):.1f}%)")
    return "\n".join(lines)


def margin_interval(ours, theirs, reps: int = 10000, seed: int = 0) -> tuple[float, float]:
    """95% interval of 100 (1 - mean(ours) / mean(theirs)) with the tasks resampled in pairs."""
    a, b = np.asarray(ours, dtype=float), np.asarray(theirs, dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(a), size=(reps, len(a)))
    m = 100.0 * (1.0 - a[idx].mean(axis=1) / b[idx].mean(axis=1))
    return float(np.percentile(m, 2.5)), float(np.percentile(m, 97.5))


def main(argv=None):
    args = build_parser().parse_args(argv)
    anchors = [a.strip() for a in args.anchors.split(",")] if args.anchors else None
    for path in args.files:
        print(summarize(path, args.alg, anchors))
        print()


if __name__ == "__main__":
    run_main(main)
