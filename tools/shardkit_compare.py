#!/usr/bin/env python3
"""shardkit against the best anchor of an eval.py --out file (one run, plans side by side).

  python tools/shardkit_compare.py results/shardkit/emu_dlrm50.jsonl [more.jsonl ...]
  python tools/shardkit_compare.py data/gpu_measurements/h200_gpucheck3_2026-11-27.json   # measured on a GPU

Per file: every algorithm's mean plan cost over the tasks all of them planned feasibly, its mean
imbalance (max / mean of the devices' costs), and shardkit's margin below the best other algorithm's
mean ("best anchor"); --anchors restricts which algorithms count as anchors.

On an emulated landscape the margin is also given under the **stressed judge**: every device's compute
multiplied by an independent draw from the judge's own held-out error (measured / predicted cost of
the real H200 shards holding the task's tables, which the judge never saw:
shardcore.oracles.emulated.emulator.judge_error; a device holding data-parallel replicas, or row-wise
blocks, draws instead from the judge's error on the measured H200 devices of that kind, each predicted
by the judge of its own task, on the same scale: emulator.piece_judge_error), --draws draws (the same for every plan of a
task), the expected slowest device (shardcore.evaluation.compare.expected_slowest). A margin whose interval
reaches zero is a tie.
"""

import argparse
import json
import os
import statistics

import numpy as np


from shardcore import io
from shardcore.cli.common import ArgumentParser as OneLineParser, run_main
from shardcore.argtypes import positive_int
from shardcore.oracles.emulated.emulator import MEASUREMENTS_DIR
from shardcore.errors import ShardError

DEFAULT_DATA_DIR = str(MEASUREMENTS_DIR / "dlrm_b65536")



NOT_ANCHORS = ("shardkit-tw",)

def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="eval.py --out files (measured or emulated), or tools/gpu_check.py "
                                            "summaries (gpu_check.json: each task set in turn)")
    p.add_argument("--alg", default="shardkit", help="the algorithm compared (default shardkit)")
    p.add_argument("--anchors", default=None, help="comma-separated anchors (default: every other algorithm but "
                                                   "shardkit-tw, shardkit's own table-wise variant)")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR, metavar="DIR",
                   help="the records' dataset (its table configs), to find the tables the emulated judge's "
                        "held-out error is taken from (default %(default)s)")
    p.add_argument("--draws", type=positive_int, default=1000, metavar="N",
                   help="draws of the stressed judge per task (default %(default)s)")
    p.add_argument("--devices-per-host", type=positive_int, default=None, metavar="G",
                   help="the records' hosts (eval.py --devices-per-host): also report, per algorithm, the share of "
                        "a training step's exchanged bytes that cross hosts and the busiest device's bytes to and "
                        "from other hosts (the modelled exchange's, from each plan's shardings)")
    return p


def stressed_costs(by: dict, algs: list, tasks: list, tables, draws: int) -> dict | None:
    """``{alg: {task: expected slowest device}}`` under the stressed judge; None when the records'
    tables were never measured (no held-out error to draw from)."""
    from shardcore.evaluation.compare import expected_slowest
    from shardcore.oracles.emulated.emulator import PIECE_DEVICE_KINDS, judge_error, seen_tables

    out: dict = {a: {} for a in algs}
    for t in tasks:
        ids = by[algs[0]][t].get("table_ids")
        if ids is None:
            raise ShardError("the records carry no table_ids (written before the stressed judge existed): "
                             "run eval.py again")
        if max(ids) >= len(tables):
            raise ShardError(f"--data-dir {len(tables)} tables, but the records name table {max(ids)}")
        ratios, by_kind = judge_error(seen_tables([tables[i] for i in ids]), pieces=True)
        if len(ratios) == 0:
            return None
        pools = [by_kind[k] for k in PIECE_DEVICE_KINDS]
        for k, a in enumerate(algs):
            dev = np.asarray(by[a][t]["device_costs_ms"], dtype=float)
            kind_of = device_kinds(by[a][t], len(dev))
            for d, kind in enumerate(kind_of):
                if kind and len(by_kind[kind]) == 0:
                    raise ShardError(f"{a}, task {t}: device {d} holds {kind} pieces, and no measured device of "
                                     "that kind to draw the judge's error on it from")
            pool_of = [PIECE_DEVICE_KINDS.index(kind) + 1 if kind else 0 for kind in kind_of]
            out[a][t] = float(expected_slowest(dev[:, 0] + dev[:, 3], dev[:, 1] + dev[:, 2], ratios, draws, seed=t,
                                               pools=pools, pool_of=pool_of))
    return out


def device_kinds(rec: dict, ndevices: int) -> list:
    """Per device of an eval.py record's plan (from its shardings) the kind whose judge error it draws
    (emulator.piece_device_kind: data_parallel, row_wise or None for whole tables and column blocks)."""
    from shardcore.oracles.emulated.emulator import piece_device_kind

    held: list[set] = [set() for _ in range(ndevices)]
    for s in rec.get("shardings") or []:
        for d in (s.get("devices") or range(ndevices)):
            held[int(d)].add(s.get("type"))
    return [piece_device_kind(h) for h in held]


def gpu_check_sets(path: str) -> list[tuple[str, list[dict], str]]:
    """The task sets of a ``tools/gpu_check.py`` summary (``gpu_check.json``) as eval-like records:
    ``(label, records, note)`` per set, the note naming the GPU and the micro-benchmark's noise."""
    try:
        with open(path, "rb") as fh:
            obj = json.loads(fh.read().decode("utf-8"))
        out = []
        noise = obj.get("noise") or {}
        note = (f"  judge: {obj.get('gpu', '?')} measured {obj.get('date', '')} (compute measured, all-to-alls modelled); "
                f"its noise: one {noise.get('tables', '?')}-table shard measured {noise.get('repeats', '?')} times afresh, "
                f"CV {noise.get('cv_pct', float('nan')):.2f}%") if noise else ""
        for ts in obj["sets"]:
            recs = [{"task": int(p["task"]), "alg": str(p["alg"]), "cost_ms": float(p["cost_ms"]),
                     "device_costs_ms": p["device_costs_ms"], "hardware": ts["hardware"]}
                    for p in ts["plans"] if p.get("cost_ms") is not None]
            if recs:
                out.append((f"{path} [{ts['name']}{'' if ts.get('finished') else ', cut short by the time budget'}]",
                            recs, note))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ShardError(f"{path}: not a readable gpu_check.json ({io.first_line(exc, 200)})") from None
    if not out:
        raise ShardError(f"{path}: no measured plans in it")
    return out


def host_traffic(rec: dict, tables, devices_per_host: int) -> tuple[float, float]:
    """``(share of the step's exchanged bytes that cross hosts, the busiest device's inter-host MB)`` of
    an eval.py record's plan (:meth:`CommModel.step_bytes`: pooled outputs and gradients, ids, all-reduce)."""
    from shardcore.oracles.commmodel import CommModel, allreduce_bytes, id_width, pooled_width
    from shardcore.plan import shardings_from_json

    task = [tables[i] for i in rec["table_ids"]]
    n = int(rec["ndevices"])
    shards = shardings_from_json(task, rec["shardings"], n).shard_tables(task)
    intra, inter = CommModel(devices_per_host=devices_per_host).step_bytes(
        [sum(pooled_width(p) for p in s) for s in shards], int(rec["batch_size"]),
        [sum(id_width(p) for p in s) for s in shards], [sum(allreduce_bytes(p, n) for p in s) for s in shards])
    total = float(intra.sum() + inter.sum())
    return (float(inter.sum()) / total if total else 0.0), float(inter.max()) / 1e6


def summarize(path: str, alg: str, anchors: list[str] | None, data_dir: str = DEFAULT_DATA_DIR,
              draws: int = 1000, devices_per_host: int | None = None) -> str:
    """The comparison of one eval.py --out file, or of each task set of a gpu_check.json."""
    from shardcore.evaluation.compare import check_record

    if path.endswith(".json"):
        return "\n\n".join(summarize_records(label, recs, alg, anchors, data_dir, draws) + ("\n" + note if note else "")
                           for label, recs, note in gpu_check_sets(path))
    try:
        with open(path, "rb") as fh:
            lines = fh.read().decode("utf-8").splitlines()
        recs = [check_record(json.loads(x), f"{path}:{k}") for k, x in enumerate(lines, 1) if x.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ShardError(f"{path}: not a readable eval.py --out file ({io.first_line(exc, 200)})") from None
    return summarize_records(path, recs, alg, anchors, data_dir, draws, devices_per_host)


def summarize_records(path: str, recs: list[dict], alg: str, anchors: list[str] | None,
                      data_dir: str = DEFAULT_DATA_DIR, draws: int = 1000, devices_per_host: int | None = None) -> str:
    by: dict[str, dict[int, dict]] = {}
    for r in recs:
        if int(r["task"]) in by.get(r["alg"], {}):   # two runs in one file: which one counts would be silent
            raise ShardError(f"{path}: {r['alg']} on task {r['task']} appears twice (two eval.py runs "
                             "concatenated?); compare one run's records")
        by.setdefault(r["alg"], {})[int(r["task"])] = r
    setting = {(r.get("hardware"), r.get("batch_size")) for r in recs if r.get("cost_ms") is not None}
    if len(setting) > 1:
        raise ShardError(f"{path}: records of different oracles or batches "
                         f"({'; '.join(sorted(f'{h} (batch {b})' for h, b in setting))}): their costs do not compare")
    if alg not in by:
        raise ShardError(f"{path}: no {alg} records")
    # default anchors: every other algorithm but shardkit's own restricted variant (shardkit-tw, the
    # learned methods' table-wise reference), which is shardkit, not an anchor
    algs = [a for a in by if a == alg or (a in anchors if anchors is not None else a not in NOT_ANCHORS)]
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
    lines.append(f"{alg}: {abs(margin):.1f}% {'below' if margin >= 0 else 'ABOVE'} the best anchor ({best}); best on {wins}/{len(tasks)} tasks; "
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
    if "emulated" in str(recs[0].get("hardware", "")):
        from shardcore.dataset import load_table_configs

        stressed = stressed_costs(by, algs, order, load_table_configs(os.path.join(data_dir, "table_configs.json")),
                                  draws)
        if stressed is None:
            lines.append("  stressed judge: not computed (the tasks' tables were never measured on the card)")
        else:
            smean = {a: statistics.fmean(stressed[a][t] for t in order) for a in algs}
            sbest = min((a for a in algs if a != alg), key=lambda a: smean[a])
            smargin = 100.0 * (1 - smean[alg] / smean[sbest])
            slo, shi = margin_interval([stressed[alg][t] for t in order], [stressed[sbest][t] for t in order])
            verdict = ("a tie (the interval reaches zero)" if slo <= 0 <= shi else
                       f"target >= 5%: {'met' if smargin >= 5.0 else 'NOT met'}")
            lines.append(f"  stressed judge (device compute x the judge's held-out error, on replica and row-wise "
                         f"devices its error there, {draws} draws, expected "
                         f"slowest device): {alg} {smean[alg]:.4g} ms, best anchor {sbest} {smean[sbest]:.4g} ms: "
                         f"{smargin:.1f}% below ({slo:.1f}% .. {shi:.1f}%); {verdict}")
            lines.append("    stressed means: " + ", ".join(f"{a} {smean[a]:.4g}" for a in sorted(algs, key=smean.get)))
    if devices_per_host:
        from shardcore.dataset import load_table_configs

        tables = load_table_configs(os.path.join(data_dir, "table_configs.json"))
        lines.append(f"  across hosts of {devices_per_host} (modelled exchange, means over the tasks): " + "; ".join(
            f"{a} {100 * statistics.fmean(x[0] for x in tr):.1f}% of bytes cross hosts, busiest device "
            f"{statistics.fmean(x[1] for x in tr):.0f} MB" for a in sorted(algs, key=lambda a: mean[a])
            for tr in [[host_traffic(by[a][t], tables, devices_per_host) for t in order]]))
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
        print(summarize(path, args.alg, anchors, args.data_dir, args.draws, args.devices_per_host))
        print()


if __name__ == "__main__":
    run_main(main)
