#!/usr/bin/env python3
"""shardkit against the best anchor of an eval.py --out file (one run, plans side by side).

  python tools/shardkit_compare.py results/shardkit/emu_dlrm50.jsonl [more.jsonl ...]
  python tools/shardkit_compare.py GPU_CHECK.json [--repeat GPU_CHECK2.json]   # measured on a GPU (tools/gpu_check.py)

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
reaches zero is a tie. A piece device's error is drawn from the measured devices of plans with as many
devices as the task's (``--piece-pools device-count``, the default; a kind with fewer than 20 such
devices, e.g. row-wise blocks of 4-device plans, from all of that kind): a replica law fitted on both
device counts prices a 4-device plan's replica device ~2% high and an 8-device one ~2% low. On H200
plans in no fit this judge priced TorchRec's plans at +0.6% / -0.4% of their measured cost (DLRM-50 /
DLRM-100) and shardkit's at -0.7% / -0.4%, where the pools of every device count (``--piece-pools all``)
said +2.9% / -1.4% and +0.7% / -0.5% (tools/emulator_accuracy.py; docs/oracles.md).

``--rejudge devices`` scores the same plans again with another fit of the emulated card before comparing
them: ``devices`` (refitted without every measured shard made only of the task's tables, so never a device
any plan of the task could have, while its tables are seen in shards that mix them with other tables, as the
learned methods' training oracle saw them), ``heldout`` or ``full``. A judge held out by tables shares the
blind spot of a planner held out the same way (shardkit); one held out by devices does not, and knows the
tables as well as the learned methods' training did. The stressed judge then draws from the new fit's own
held-out error. Every record is first re-scored with its own fit and must come out as recorded (the same
exchange model and dataset), else the tool stops in one line.
"""

import argparse
import contextlib
import json
import os
import statistics

import numpy as np


from shardcore import io
from shardcore.cli.common import ArgumentParser as OneLineParser, run_main
from shardcore.argtypes import positive_int
from shardcore.oracles.emulated.emulator import MEASUREMENTS_DIR
from shardcore.oracles.emulated.oracle import DEVICES, EMULATOR_FITS, FULL, HELDOUT
from shardcore.errors import ShardError
from shardcore.evaluation.compare import record_pricing
from shardcore.oracles.factory import check_same_pricing

DEFAULT_DATA_DIR = str(MEASUREMENTS_DIR / "dlrm_b65536")



NOT_ANCHORS = ("shardkit-tw",)
PIECE_POOLS = ("all", "device-count")

def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="eval.py --out files (measured or emulated), or tools/gpu_check.py "
                                            "summaries (gpu_check.json: each task set in turn)")
    p.add_argument("--alg", default="shardkit", help="the algorithm compared (default shardkit)")
    p.add_argument("--repeat", default=None, metavar="JSON",
                   help="with gpu_check summaries: another gpu_check.json that measured some of the same plans "
                        "again on a machine of the same speed; a plan measured in both counts at the lower cost "
                        "(a transient slows a measurement down, none speeds one up); refused unless the plans "
                        "measured in both agree to a median within 0.5%%")
    p.add_argument("--anchors", default=None, help="comma-separated anchors (default: every other algorithm but "
                                                   "shardkit-tw, shardkit's own table-wise variant)")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR, metavar="DIR",
                   help="the records' dataset (its table configs), to find the tables the emulated judge's "
                        "held-out error is taken from (default %(default)s)")
    p.add_argument("--draws", type=positive_int, default=1000, metavar="N",
                   help="draws of the stressed judge per task (default %(default)s)")
    p.add_argument("--rejudge", default=None, choices=EMULATOR_FITS, metavar="FIT",
                   help="score the emulated records' plans again with this fit of the emulated card before comparing: "
                        "devices (never a shard made only of the task's tables), heldout or full; see above")
    p.add_argument("--task-path", default=None, metavar="FILE",
                   help="with --rejudge: the records' task file, where its tasks carry their own dims (NeuroShard-style "
                        "tasks); default: the tables of --data-dir at their own dims")
    p.add_argument("--piece-pools", default="device-count", choices=PIECE_POOLS,
                   help="the stressed judge's error pools for devices holding replicas or row-wise blocks: "
                        "device-count (the default: those of plans with as many devices as the task's, where at "
                        "least 20 were measured; the replica law's error differs by device count, see "
                        "docs/oracles.md) or all (every measured such device, whatever its plan's device count)")
    p.add_argument("--devices-per-host", type=positive_int, default=None, metavar="G",
                   help="the records' hosts (eval.py --devices-per-host): also report, per algorithm, the share of "
                        "a training step's exchanged bytes that cross hosts and the busiest device's bytes to and "
                        "from other hosts (the modelled exchange's, from each plan's shardings)")
    return p


def recorded_fit(hardware: str) -> str:
    """The fit of the emulated card an eval.py record was judged by, from its ``hardware`` line."""
    if "held out by devices" in hardware:
        return DEVICES
    return HELDOUT if "held out" in hardware else FULL


def rejudge(path: str, recs: list[dict], fit: str, data_dir: str, task_path: str | None = None) -> list[dict]:
    """The records with every plan scored again by the emulated card's ``fit`` (``cost_ms``,
    ``device_costs_ms``, ``hardware``, ``parts`` replaced). Each plan is first scored with the fit its
    record names and must come out as recorded (relative 1e-6), so that only the fit differs."""
    from shardcore.dataset import load_table_configs
    from shardcore.evaluation.compare import record_plan
    from shardcore.oracles.factory import open_oracle
    from shardcore.tasks import load_tasks

    tables = load_table_configs(os.path.join(data_dir, "table_configs.json"))
    tasks = load_tasks(task_path, num_tables=len(tables)) if task_path else None
    hardware = {str(r.get("hardware", "")) for r in recs if r.get("cost_ms") is not None}
    if not all(h.startswith("emulated NVIDIA H200") for h in hardware):
        raise ShardError(f"{path}: --rejudge needs records of the emulated H200 (got {'; '.join(sorted(hardware))})")
    oracles: dict = {}
    out = []
    with contextlib.ExitStack() as stack:
        for k, r in enumerate(recs):
            if r.get("cost_ms") is None:
                out.append(r)
                continue
            if r.get("allocation") is None or r.get("table_ids") is None:
                raise ShardError(f"{path}: record {k + 1} carries no plan or table_ids: run eval.py again")
            if tasks is not None:
                t = int(r["task"])
                if not 0 <= t < len(tasks) or list(tasks[t].table_ids) != list(r["table_ids"]):
                    raise ShardError(f"{path}: record {k + 1}: task {t} is not that of --task-path {task_path}")
                task = tasks[t].tables(tables)
            else:
                if max(r["table_ids"]) >= len(tables):
                    raise ShardError(f"--data-dir {len(tables)} tables, but {path} names table {max(r['table_ids'])}")
                task = [tables[i] for i in r["table_ids"]]
            n, batch = int(r["ndevices"]), int(r["batch_size"])
            shards = record_plan(r, task).device_pieces
            costs = []
            for f in (recorded_fit(str(r["hardware"])), fit):
                if (n, batch, f) not in oracles:
                    oracles[n, batch, f] = stack.enter_context(open_oracle(
                        data_dir, n, oracle="emulated:h200", batch_size=batch, emulator_fit=f))
                costs.append(oracles[n, batch, f].evaluate(shards))
            if abs(costs[0].cost_ms - float(r["cost_ms"])) > 1e-6 * float(r["cost_ms"]):
                raise ShardError(f"{path}: record {k + 1} ({r['alg']}, task {r['task']}) scores {costs[0].cost_ms:.6g} ms "
                                 f"with its own fit, not the recorded {float(r['cost_ms']):.6g}: another exchange model, "
                                 "dataset or task dims (--task-path) than the emulated oracle's defaults, or a record "
                                 "scored by another version of the emulator (e.g. a replica law without its cost per "
                                 "replica); cannot rejudge")
            new = costs[1]
            out.append({**r, "cost_ms": new.cost_ms, "device_costs_ms": new.device_costs_ms,
                        "hardware": oracles[n, batch, fit].hardware, "parts": oracles[n, batch, fit].parts})
    return out


def stressed_costs(by: dict, algs: list, tasks: list, tables, draws: int, rule: str = "tables",
                   piece_pools: str = "device-count") -> dict | None:
    """``{alg: {task: expected slowest device}}`` under the stressed judge (its error: the held-out
    judge's by ``rule``, see :data:`shardcore.oracles.emulated.emulator.HOLDOUT_RULES`; ``piece_pools``
    "device-count": a piece device's error drawn only from measured devices of plans with as many
    devices); None when the records' tables were never measured (no held-out error to draw from)."""
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
        ndev = len(by[algs[0]][t]["device_costs_ms"]) if piece_pools == "device-count" else None
        ratios, by_kind = judge_error(seen_tables([tables[i] for i in ids]), pieces=True, rule=rule, ndevices=ndev)
        if len(ratios) == 0:
            return None
        pools = [by_kind[k] for k in PIECE_DEVICE_KINDS]
        for k, a in enumerate(algs):
            dev = np.asarray(by[a][t]["device_costs_ms"], dtype=float)
            kind_of = device_kinds(by[a][t], len(dev))
            for d, kind in enumerate(kind_of):
                if kind and len(by_kind[kind]) == 0:
                    raise ShardError(f"{a}, task {t}: device {d} holds {kind} pieces, and no measured device of "
                                     "that kind" + (f" in a plan of {ndev} devices" if ndev else "")
                                     + " to draw the judge's error on it from")
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


SAME_SPEED = 0.005   # --repeat: the largest |median ratio - 1| of two runs' common plans taken as one speed
MOVED = 0.02        # --repeat: a plan whose two measurements differ by more is named


def apply_repeat(name: str, recs: list[dict], repeat_path: str, repeat_recs: list[dict]) -> tuple[list[dict], str]:
    """``recs`` with every plan that ``repeat_recs`` measured again at the lower of its two costs (devices
    from the same run as the cost), and a note of what moved; :class:`ShardError` if the plans in common
    do not agree to a median within :data:`SAME_SPEED` (runs on machines of different speeds do not mix)."""
    again = {(r["task"], r["alg"]): r for r in repeat_recs}
    common = [(r, again[(r["task"], r["alg"])]) for r in recs if (r["task"], r["alg"]) in again]
    if not common:
        raise ShardError(f"--repeat {repeat_path}: no plan of {name} measured in both runs")
    ratios = [b["cost_ms"] / a["cost_ms"] for a, b in common]
    med = statistics.median(ratios)
    if abs(med - 1.0) > SAME_SPEED:
        raise ShardError(f"--repeat {repeat_path}: the {len(common)} plans of {name} measured in both runs differ by a "
                         f"median {100 * (med - 1):+.2f}% (machines of different speeds; the lower cost would favour "
                         "the plans measured again)")
    out, moved = [], []
    for r in recs:
        b = again.get((r["task"], r["alg"]))
        if b is not None and abs(b["cost_ms"] / r["cost_ms"] - 1.0) > MOVED:
            moved.append(f"{r['alg']} task {r['task']} {r['cost_ms']:.3f} / {b['cost_ms']:.3f} ms")
        out.append(dict(b) if b is not None and b["cost_ms"] < r["cost_ms"] else r)
    note = (f"  measured again in {repeat_path}: {len(common)} plans, median ratio {med:.4f}; the lower of the two "
            f"costs counts; {len(moved)} differ by more than {100 * MOVED:.0f}%" + (": " + "; ".join(moved) if moved else ""))
    return out, note


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


def gpu_set_name(label: str) -> str:
    """``DLRM-50 (4)`` of a :func:`gpu_check_sets` label ``PATH [DLRM-50 (4)...]``."""
    return label.rpartition(" [")[2].split(",")[0].rstrip("]")


def host_traffic(rec: dict, tables, devices_per_host: int) -> tuple[float, float]:
    """``(share of the step's exchanged bytes that cross hosts, the busiest device's inter-host MB)`` of
    an eval.py record's plan (:meth:`CommModel.step_bytes`: pooled outputs and gradients, ids, all-reduce)."""
    from shardcore.oracles.commmodel import CommModel, allreduce_bytes, id_width, pooled_width
    from shardcore.evaluation.compare import record_plan

    task = [tables[i] for i in rec["table_ids"]]
    shards = record_plan(rec, task).device_pieces
    n = len(shards)
    intra, inter = CommModel(devices_per_host=devices_per_host).step_bytes(
        [sum(pooled_width(p) for p in s) for s in shards], int(rec["batch_size"]),
        [sum(id_width(p) for p in s) for s in shards], [sum(allreduce_bytes(p, n) for p in s) for s in shards])
    total = float(intra.sum() + inter.sum())
    return (float(inter.sum()) / total if total else 0.0), float(inter.max()) / 1e6


def summarize(path: str, alg: str, anchors: list[str] | None, data_dir: str = DEFAULT_DATA_DIR,
              draws: int = 1000, devices_per_host: int | None = None, rejudge_fit: str | None = None,
              task_path: str | None = None, piece_pools: str = "device-count", repeat: str | None = None) -> str:
    """The comparison of one eval.py --out file, or of each task set of a gpu_check.json (with ``repeat``,
    another gpu_check.json whose plans replace the first's where they measured lower: :func:`apply_repeat`)."""
    from shardcore.evaluation.compare import check_record

    if path.endswith(".json"):
        if rejudge_fit:
            raise ShardError(f"{path}: --rejudge applies to eval.py --out files of the emulated card, not to a GPU's "
                             "measurements")
        again = {gpu_set_name(label): recs for label, recs, _ in gpu_check_sets(repeat)} if repeat else {}
        parts = []
        for label, recs, note in gpu_check_sets(path):
            notes = [note] if note else []
            if gpu_set_name(label) in again:
                recs, rnote = apply_repeat(gpu_set_name(label), recs, repeat, again[gpu_set_name(label)])
                notes.append(rnote)
            parts.append(summarize_records(label, recs, alg, anchors, data_dir, draws, piece_pools=piece_pools)
                         + "".join("\n" + n for n in notes))
        return "\n\n".join(parts)
    if repeat:
        raise ShardError("--repeat applies to gpu_check.json summaries, not to eval.py --out files")
    try:
        lines = io.read_maybe_gzipped(path).decode("utf-8").splitlines()
        recs = [check_record(io.parse_json(x, f"{path}:{k}"), f"{path}:{k}") for k, x in enumerate(lines, 1) if x.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ShardError(f"{path}: not a readable eval.py --out file ({io.first_line(exc, 200)})") from None
    if not recs:
        raise ShardError(f"{path}: no records in it (an empty file)")
    if rejudge_fit:
        recs = rejudge(path, recs, rejudge_fit, data_dir, task_path)
    return summarize_records(path, recs, alg, anchors, data_dir, draws, devices_per_host, piece_pools)


def compared(path: str, recs: list[dict], alg: str, anchors: list[str] | None) -> tuple[dict, list, set]:
    """``(by, algs, tasks)`` of one run's records: ``by[alg][task]`` the record, ``algs`` ``alg`` and its
    anchors (``anchors``, default every other algorithm but :data:`NOT_ANCHORS`), ``tasks`` those every one
    of them planned and measured. One-line errors for records that do not compare (a task twice, two
    oracles or batches, no ``alg``, no common task)."""
    by: dict[str, dict[int, dict]] = {}
    for r in recs:
        if int(r["task"]) in by.get(r["alg"], {}):   # two runs in one file: which one counts would be silent
            raise ShardError(f"{path}: {r['alg']} on task {r['task']} appears twice (two eval.py runs "
                             "concatenated?); compare one run's records")
        by.setdefault(r["alg"], {})[int(r["task"])] = r
    check_same_pricing({f"{r['alg']} task {r['task']}": record_pricing(r) for r in recs if r.get("cost_ms") is not None},
                       path)   # another oracle, batch, precision, exchange model or emulator fit: costs do not compare
    if alg not in by:
        raise ShardError(f"{path}: no {alg} records")
    # default anchors: every other algorithm but shardkit's own restricted variant (shardkit-tw, the
    # learned methods' table-wise reference), which is shardkit, not an anchor
    missing = [a for a in anchors or () if a not in by]
    if missing:
        raise ShardError(f"{path}: --anchors {missing[0]}: no records of it (the file has {', '.join(sorted(by))})")
    algs = [a for a in by if a == alg or (a in anchors if anchors is not None else a not in NOT_ANCHORS)]
    if len(algs) < 2:
        raise ShardError(f"{path}: no anchor to compare {alg} with (--anchors names only {alg}, or the file has no "
                         "other algorithm)")
    tasks = set.intersection(*({t for t, r in by[a].items() if r.get("cost_ms") is not None} for a in algs))
    if not tasks:
        raise ShardError(f"{path}: no task every algorithm planned and measured")
    return by, algs, tasks


def summarize_records(path: str, recs: list[dict], alg: str, anchors: list[str] | None,
                      data_dir: str = DEFAULT_DATA_DIR, draws: int = 1000, devices_per_host: int | None = None,
                      piece_pools: str = "device-count") -> str:
    by, algs, tasks = compared(path, recs, alg, anchors)
    lines = [f"{path}: {len(tasks)} tasks, {recs[0].get('hardware', '?')}",
             f"| alg | mean cost ms | mean imbalance | {alg} vs it | 95% paired interval | {alg} faster on |",
             "|---|---|---|---|---|---|"]
    mean = {a: statistics.fmean(by[a][t]["cost_ms"] for t in tasks) for a in algs}

    def imb(r):
        tot = [sum(c) for c in r["device_costs_ms"]]
        return max(tot) / (sum(tot) / len(tot))

    order = sorted(tasks)
    for a in sorted(algs, key=lambda a: mean[a]):
        im = statistics.fmean(imb(by[a][t]) for t in tasks)
        rel = ival = faster = ""
        if a != alg:
            rel = f"{100.0 * (mean[alg] / mean[a] - 1):+.1f}%"
            lo, hi = margin_interval([by[alg][t]["cost_ms"] for t in order], [by[a][t]["cost_ms"] for t in order])
            ival = f"{-hi:+.1f}% .. {-lo:+.1f}%"
            faster = f"{sum(by[alg][t]['cost_ms'] < by[a][t]['cost_ms'] for t in order)}/{len(order)}"
        lines.append(f"| {a} | {mean[a]:.4g} | {im:.3f} | {rel} | {ival} | {faster} |")
    best = min((a for a in algs if a != alg), key=lambda a: mean[a])
    margin = 100.0 * (1 - mean[alg] / mean[best])
    wins = sum(by[alg][t]["cost_ms"] <= min(by[a][t]["cost_ms"] for a in algs if a != alg) for t in tasks)
    lines.append(f"{alg}: {abs(margin):.1f}% {'below' if margin >= 0 else 'ABOVE'} the best anchor ({best}); best on {wins}/{len(tasks)} tasks; "
                 f"target >= 5%: {'met' if margin >= 5.0 else 'NOT met'}")
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
        stressed, note = stressed_judge(by, algs, order, str(recs[0].get("hardware", "")), data_dir, draws, piece_pools)
        if note:
            lines.append(note)
        if stressed is None:
            lines.append("  stressed judge: not computed (the tasks' tables were never measured on the card)")
        else:
            smean = {a: statistics.fmean(stressed[a][t] for t in order) for a in algs}
            sbest = min((a for a in algs if a != alg), key=lambda a: smean[a])
            smargin = 100.0 * (1 - smean[alg] / smean[sbest])
            slo, shi = margin_interval([stressed[alg][t] for t in order], [stressed[sbest][t] for t in order])
            pools_note = (f" (on devices of {len(by[alg][order[0]]['device_costs_ms'])}-device plans)"
                          if piece_pools == "device-count" else "")
            verdict = ("a tie (the interval reaches zero)" if slo <= 0 <= shi else
                       f"target >= 5%: {'met' if smargin >= 5.0 else 'NOT met'}")
            lines.append(f"  stressed judge (device compute x the judge's held-out error, on replica and row-wise "
                         f"devices its error there{pools_note}, {draws} draws, expected "
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


def stressed_judge(by: dict, algs: list, order: list, hardware: str, data_dir: str = DEFAULT_DATA_DIR,
                   draws: int = 1000, piece_pools: str = "device-count") -> tuple[dict | None, str | None]:
    """``(stressed_costs or None, a note or None)`` of emulated records judged by the fit their
    ``hardware`` line names: the stressed judge draws from that fit's own held-out error, or, where no
    measured shard is made only of the tasks' tables (a judge held out by devices), from the larger
    error of the judge held out by tables, and the note says so."""
    from shardcore.dataset import load_table_configs

    rule = "devices" if recorded_fit(hardware) == DEVICES else "tables"
    task_tables = load_table_configs(os.path.join(data_dir, "table_configs.json"))
    stressed = stressed_costs(by, algs, order, task_tables, draws, rule, piece_pools)
    note = None
    if stressed is None and rule == "devices":
        # no measured shard is made only of these tasks' tables, so the devices judge's own error cannot be
        # measured; that of the judge that never saw the tables is the larger one: draw from it, and say so
        stressed = stressed_costs(by, algs, order, task_tables, draws, "tables", piece_pools)
        if stressed is not None:
            note = ("  (stressed judge: no measured shard is made only of these tasks' tables, so its draws "
                    "come from the error of the judge held out by tables, the larger one)")
    return stressed, note


def margin_interval(ours, theirs, reps: int = 10000, seed: int = 0) -> tuple[float, float]:
    """95% interval of 100 (1 - mean(ours) / mean(theirs)) with the tasks resampled in pairs."""
    a, b = np.asarray(ours, dtype=float), np.asarray(theirs, dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(a), size=(reps, len(a)))
    m = 100.0 * (1.0 - a[idx].mean(axis=1) / b[idx].mean(axis=1))
    return float(np.percentile(m, 2.5)), float(np.percentile(m, 97.5))


def main(argv=None):
    args = build_parser().parse_args(argv)
    anchors = [a.strip() for a in args.anchors.split(",")] if args.anchors else None
    if args.task_path and not args.rejudge:
        raise ShardError("--task-path applies with --rejudge only")
    if args.task_path and len(args.files) > 1:
        raise ShardError("--task-path names one file's tasks: give one file with it")
    for path in args.files:
        print(summarize(path, args.alg, anchors, args.data_dir, args.draws, args.devices_per_host, args.rejudge,
                        args.task_path, args.piece_pools, args.repeat))
        print()


if __name__ == "__main__":
    run_main(main)
