#!/usr/bin/env python3
"""Does a card of this CPU tell the truth? Calibrate one, plan with it, measure those plans.

  make demo     # (once) data/dlrm_datasets and data/dlrm_tasks_50/test.txt
  python tools/card_proof.py --out-dir results/card_proof     # sized for at most 25 minutes on a 2-core CPU

In one session of the measured oracle (this machine's CPU, --ndevices logical devices over gloo, its own
measurement cache in --out-dir unless --cache-path names one):

(a) calibrates a card of this CPU (tools/calibrate.py's design, never on the tables of --tasks), written as
    OUT/card.json;
(b) plans the first --max-tasks tasks of --tasks with shardkit twice: against ``emulated:OUT/card.json``
    (the card's model and exchange) and against the measured landscape with shardkit's CPU model as
    ``eval.py --alg shardkit`` fits it on this machine when it has no model file (shardkit_planner.calibrate:
    fitted on the cache, which now holds the card's whole-table shards, plus the plans it measures for its
    exchange; written as OUT/cpu_model.json), both with the same work budget and sharding types and neither
    refining by measurement (--cpu-refine gives the CPU model eval.py's measured refinement);
(c) measures every plan afresh in --rounds interleaved rounds (each round every plan once, in a shuffled
    order), the plan's cost the median over the rounds;
(d) prints and writes (OUT/summary.json, OUT/plans.csv, OUT/manifest.json, a results/ folder's manifest)
    the card's predicted plan costs against the measured ones (MAPE, Spearman over all plans, and which of a
    task's two plans is faster), beside the CPU model's own predictions; the CPU's repeatability over the
    rounds (mean |cost - median| / median over every plan and round), the figure the card's error is to be
    read against; and shardkit-on-card against shardkit-on-CPU-model, measured, per task with the paired
    95% bootstrap interval of the mean difference. Every figure names the hardware.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shardcore.argtypes import name_list, nonnegative_int, positive_float, positive_int, seed_int  # noqa: E402
from shardcore.cli.common import ArgumentParser as OneLineParser, check_outputs, run_main  # noqa: E402
from shardcore.errors import ShardError  # noqa: E402
from tools.report import head_commit  # noqa: E402
from shardcore.io import atomic_open  # noqa: E402

PLANNERS = ("card", "cpu_model")
LABELS = {"card": "shardkit on the card", "cpu_model": "shardkit on its CPU model"}
FILES = ("card.json", "cpu_model.json", "plans.csv", "summary.json", "manifest.json")


def build_parser() -> argparse.ArgumentParser:
    from shardcore.oracles.emulated.calibration import DEFAULT_SHARDS

    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default="data/dlrm_datasets", help="dataset (default data/dlrm_datasets, make demo's)")
    p.add_argument("--tasks", default="data/dlrm_tasks_50/test.txt",
                   help="task file whose tasks are planned and measured (default data/dlrm_tasks_50/test.txt)")
    p.add_argument("--out-dir", default="results/card_proof", help="where the card, the records and the manifest go")
    p.add_argument("--ndevices", type=positive_int, default=4, help="logical devices (default 4)")
    p.add_argument("--max-memory", type=positive_float, default=5.0, metavar="GiB", help="cap per device (default 5)")
    p.add_argument("--max-tasks", type=positive_int, default=6, metavar="N", help="tasks planned (default 6)")
    p.add_argument("--rounds", type=positive_int, default=3, help="interleaved measuring rounds (default 3)")
    p.add_argument("--shards", type=positive_int, default=DEFAULT_SHARDS, help=f"the card's design (default {DEFAULT_SHARDS})")
    p.add_argument("--budget", type=positive_float, default=540.0, metavar="S",
                   help="the card's time cap on measuring its shards (default 540)")
    p.add_argument("--calibrate", type=positive_float, default=300.0, metavar="S",
                   help="time cap of shardkit's own CPU calibration (default 300; it measures what the cache lacks)")
    p.add_argument("--work", type=positive_int, default=None, metavar="N", help="shardkit's work budget per task "
                                                                                "(default shardkit's)")
    p.add_argument("--types", type=name_list, default=("tw", "cw", "rw"), metavar="TYPES",
                   help="sharding types both plans may use (default tw,cw,rw: the measured landscape's)")
    p.add_argument("--cpu-refine", type=nonnegative_int, default=0, metavar="K",
                   help="measured refinement of shardkit on its CPU model (default 0: both models compared as models)")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the design and the round orders (default 0)")
    p.add_argument("--cache-path", default=None, help="measurement cache (default OUT/cost_cache.sqlite)")
    p.add_argument("--bench-iters", type=positive_int, default=None, help="timed iterations per measurement")
    p.add_argument("--warmup-iters", type=nonnegative_int, default=None, help="untimed iterations before timing")
    p.add_argument("--comm-iters", type=positive_int, default=None, help="timed repetitions of an exchange")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def _rel(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def mape(pred, meas) -> float:
    return 100.0 * statistics.fmean(abs(p - m) / m for p, m in zip(pred, meas))


def card_parts(rows: list[dict]) -> dict:
    """Where the card's plan-cost error comes from: per device its compute (fw + bw) and exchange (fw + bw)
    against their medians over the rounds (MAPE and bias), and the plan cost as the slowest device of those
    medians against the median of each round's slowest device (the measured maximum of several balanced, noisy
    devices lies above every device's median)."""
    comp, comm, slow = [], [], []
    for r in rows:
        med = [[statistics.median(rd[d][j] for rd in r["device_rounds"]) for j in range(4)]
               for d in range(len(r["card_devices"]))]
        for p, m in zip(r["card_devices"], med):
            if m[0] + m[3] > 0:
                comp.append((p[0] + p[3], m[0] + m[3]))
            if m[1] + m[2] > 0:
                comm.append((p[1] + p[2], m[1] + m[2]))
        slow.append((max(sum(m) for m in med), r["measured_ms"]))

    def fig(pairs):
        return {"devices": len(pairs), "mape_pct": round(mape(*zip(*pairs)), 3),
                "bias_pct": round(100.0 * (statistics.fmean(p / m for p, m in pairs) - 1), 3)}

    return {"compute": fig(comp), "exchange": fig(comm),
            "slowest_of_medians_vs_measured_pct": round(100.0 * (statistics.fmean(a / b for a, b in slow) - 1), 3)}


def analyse(rows: list[dict], hardware: str) -> dict:
    """The figures of (d) from the plan rows (each: task, planner, predicted_card_ms, predicted_cpu_model_ms,
    rounds_ms)."""
    from shardcore.evaluation.report import bootstrap_interval, spearman

    for r in rows:
        r["measured_ms"] = statistics.median(r["rounds_ms"])
    meas = [r["measured_ms"] for r in rows]
    out: dict = {"hardware": hardware, "plans": len(rows), "tasks": len({r["task"] for r in rows})}
    for model in PLANNERS:
        pred = [r[f"predicted_{model}_ms"] for r in rows]
        agree = []
        for t in sorted({r["task"] for r in rows}):
            a, b = [r for r in rows if r["task"] == t]
            if a["measured_ms"] != b["measured_ms"] and a[f"predicted_{model}_ms"] != b[f"predicted_{model}_ms"]:
                agree.append((a["measured_ms"] < b["measured_ms"]) == (a[f"predicted_{model}_ms"] < b[f"predicted_{model}_ms"]))
        out[f"{model}_prediction"] = {"mape_pct": round(mape(pred, meas), 3),
                                      "bias_pct": round(100.0 * (statistics.fmean(p / m for p, m in zip(pred, meas)) - 1), 3),
                                      "spearman": round(spearman(pred, meas), 4) if len(rows) > 2 else None,
                                      "task_order_agrees": f"{sum(agree)} of {len(agree)}"}
    if all(r.get("device_rounds") for r in rows):
        out["card_parts"] = card_parts(rows)
    devs = [abs(c - r["measured_ms"]) / r["measured_ms"] for r in rows for c in r["rounds_ms"]]
    spread = sorted(max(r["rounds_ms"]) / min(r["rounds_ms"]) for r in rows)
    out["repeatability"] = {"rounds": len(rows[0]["rounds_ms"]), "mean_dev_pct": round(100.0 * statistics.fmean(devs), 3),
                            "p90_maxmin": round(spread[min(len(spread) - 1, int(0.9 * len(spread)))], 4)}
    by = {(r["task"], r["planner"]): r["measured_ms"] for r in rows}
    tasks = sorted({t for t, _ in by})
    diff = [by[(t, "card")] - by[(t, "cpu_model")] for t in tasks]
    ci = bootstrap_interval(diff)
    out["measured"] = {p: round(statistics.fmean(by[(t, p)] for t in tasks), 4) for p in PLANNERS}
    out["measured"].update(diff_ms=round(statistics.fmean(diff), 4), interval_ms=[round(v, 4) for v in ci] if ci else None,
                           card_faster=sum(d < 0 for d in diff), card_slower=sum(d > 0 for d in diff))
    return out


def report_lines(s: dict) -> list[str]:
    c, m, rep, meas = s["card_prediction"], s["cpu_model_prediction"], s["repeatability"], s["measured"]
    ci = meas["interval_ms"]
    return [f"hardware: {s['hardware']}",
            f"{s['plans']} plans of {s['tasks']} tasks, each measured in {rep['rounds']} interleaved rounds (median)",
            f"the card's predicted plan costs: MAPE {c['mape_pct']:.2f}% (bias {c['bias_pct']:+.2f}%), Spearman "
            f"{c['spearman']}, a task's faster plan named in {c['task_order_agrees']}",
            f"shardkit's CPU model's own predictions: MAPE {m['mape_pct']:.2f}% (bias {m['bias_pct']:+.2f}%), Spearman "
            f"{m['spearman']}, faster plan named in {m['task_order_agrees']}",
            f"the CPU's repeatability over the rounds: mean deviation from the median {rep['mean_dev_pct']:.2f}%, "
            f"p90 max/min {rep['p90_maxmin']:.3f}",
            f"measured: {LABELS['card']} {meas['card']:.3f} ms, {LABELS['cpu_model']} {meas['cpu_model']:.3f} ms; "
            f"card - CPU model {meas['diff_ms']:+.3f} ms" + (f" (95% paired interval {ci[0]:+.3f}..{ci[1]:+.3f})" if ci else "")
            + f"; the card's plan faster on {meas['card_faster']} tasks, slower on {meas['card_slower']}"] + (
        [f"the card per device: compute MAPE {s['card_parts']['compute']['mape_pct']:.2f}% (bias "
         f"{s['card_parts']['compute']['bias_pct']:+.2f}%), exchange MAPE {s['card_parts']['exchange']['mape_pct']:.2f}% "
         f"(bias {s['card_parts']['exchange']['bias_pct']:+.2f}%); the slowest device of the per-device medians is "
         f"{s['card_parts']['slowest_of_medians_vs_measured_pct']:+.2f}% off the median of each round's slowest"]
        if "card_parts" in s else []) + (
        [f"{s['card_remeasured']['devices']} of the card's devices measured again after the plans: "
         f"{s['card_remeasured']['median_ratio']:.3f}x their calibration cost (median; "
         f"{s['card_remeasured']['ratio_range'][0]:.3f}-{s['card_remeasured']['ratio_range'][1]:.3f})"]
        if "card_remeasured" in s else [])


def main(argv=None):
    args = build_parser().parse_args(argv)
    out = Path(args.out_dir)
    cache = args.cache_path = args.cache_path or str(out / "cost_cache.sqlite")   # read and written
    check_outputs(args, {}, folders={"--out-dir": (str(out), list(FILES))})
    import dataclasses

    import numpy as np
    from tqdm import tqdm

    from shardcore.cli import algorithms
    from shardcore.dataset import load_dataset
    from shardcore.oracles.emulated.calibration import calibrate
    from shardcore.oracles.emulated.card import write_card
    from shardcore.oracles.emulated.oracle import EmulatedOracle
    from shardcore.oracles.factory import open_oracle
    from shardcore.planning import Landscape, PlanningContext
    from shardcore.tasks import load_tasks
    from shardcore.topology import Topology
    from shardkit_planner.calibrate import calibrated_model, excluded_tables
    from shardkit_planner.config import CONFIG

    t0 = time.perf_counter()
    dataset = load_dataset(args.data_dir)
    tasks = load_tasks(args.tasks, num_tables=dataset.num_tables)[: args.max_tasks]
    exclude = excluded_tables([args.tasks], dataset.num_tables)
    n = args.ndevices
    per_device = max(2, round(2 * statistics.fmean(len(t) for t in tasks) / n))
    measure = {k: v for k, v in (("bench_iters", args.bench_iters), ("warmup_iters", args.warmup_iters),
                                 ("comm_iters", args.comm_iters)) if v is not None}
    out.mkdir(parents=True, exist_ok=True)
    card_path, model_path = out / "card.json", out / "cpu_model.json"
    topology = Topology(n, args.max_memory, "fp16")
    phases = {}
    with open_oracle(args.data_dir, n, cache=cache, **measure) as ev:
        ev.start()
        hardware = ev.hardware
        print(f"the measured oracle: {hardware} (batch {ev.batch_size})", flush=True)
        # (a) the card
        t = time.perf_counter()
        with tqdm(desc="(a) calibrating the card", unit="shard", disable=True if args.quiet else None) as bar:
            card = calibrate(ev, dataset, shards=args.shards, seed=args.seed, budget_s=args.budget, exclude=exclude,
                             tables_per_device=per_device, progress=bar.update, say=tqdm.write)
        write_card(card, card_path)
        phases["card_s"] = round(time.perf_counter() - t, 1)
        print(f"(a) card written to {card_path} in {phases['card_s']:g} s", flush=True)
        # (b) shardkit's CPU model as eval.py fits it, then both plans of every task
        t = time.perf_counter()
        cpu_model = calibrated_model(ev, args.data_dir, [args.tasks], args.calibrate, seed=args.seed,
                                     progress=not args.quiet)
        cpu_model.save(model_path)
        phases["cpu_model_s"] = round(time.perf_counter() - t, 1)
        base = dataclasses.replace(CONFIG, types=tuple(args.types), refine=0,
                                   **({"work": args.work} if args.work else {}))
        batch = int(ev.batch_size)
        sharders = {
            "card": algorithms.build("shardkit", PlanningContext(
                topology, batch, Landscape(f"emulated:{card_path}", data_dir=args.data_dir), args.seed, (args.tasks,)),
                {"shardkit": base}),
            "cpu_model": algorithms.build("shardkit", PlanningContext(
                topology, batch, Landscape("measured", data_dir=args.data_dir, cache_path=cache), args.seed,
                (args.tasks,)), {"shardkit": dataclasses.replace(base, model=str(model_path), refine=args.cpu_refine)}),
        }
        if args.cpu_refine:   # its measured refinement measures candidates on this oracle
            algorithms.attach_oracle([sharders["cpu_model"]], ev)
        judge = EmulatedOracle(args.data_dir, n, card=str(card_path), batch_size=batch)
        rows = []
        t = time.perf_counter()
        for k, task in enumerate(tqdm(tasks, desc="(b) planning", unit="task", disable=True if args.quiet else None)):
            tables = task.tables(dataset.tables)
            for name, sharder in sharders.items():
                p0 = time.perf_counter()
                plan = sharder.shard(tables, topology)
                if not plan.feasible:
                    raise ShardError(f"task {k}: {LABELS[name]} made a plan over the cap")
                priced = judge.evaluate(plan.device_pieces)
                rows.append({"task": k, "planner": name, "plan": plan, "planning_s": round(time.perf_counter() - p0, 2),
                             "predicted_card_ms": float(priced.cost_ms), "card_devices": priced.device_costs_ms,
                             "device_rounds": [],
                             "predicted_cpu_model_ms": float(cpu_model.plan_cost(plan)), "rounds_ms": [],
                             "types": "+".join(sorted({s.type for s in plan.shardings}))})
        phases["planning_s"] = round(time.perf_counter() - t, 1)
        # (c) every plan measured afresh in interleaved rounds
        t = time.perf_counter()
        rng = np.random.default_rng(args.seed)
        with tqdm(total=args.rounds * len(rows), desc="(c) measuring", unit="plan",
                  disable=True if args.quiet else None) as bar:
            for _ in range(args.rounds):
                for i in rng.permutation(len(rows)):
                    res = ev.evaluate(rows[i]["plan"].device_pieces, no_cache=True)
                    rows[i]["rounds_ms"].append(float(res.cost_ms))
                    rows[i]["device_rounds"].append(res.device_costs_ms)
                    bar.update(1)
        phases["measuring_s"] = round(time.perf_counter() - t, 1)
        # (c') every tenth device the card was fitted on, measured again now: how far the machine's speed moved
        # between the calibration and the plans' measurement (a common offset of both models' predictions)
        from shardcore.oracles.emulated.card import read_card

        again = read_card(card_path).devices[::10]
        now = ev.measure_devices([d.pieces for d in again], no_cache=True)
        drift = [(c.fw_ms + c.bw_ms) / (d.fw_ms + d.bw_ms) for c, d in zip(now, again) if d.fw_ms + d.bw_ms > 0]
    # (d) the figures
    summary = analyse(rows, hardware)
    summary["card_remeasured"] = {"devices": len(drift), "median_ratio": round(statistics.median(drift), 4),
                                  "ratio_range": [round(min(drift), 4), round(max(drift), 4)]}
    summary.update(card=str(card_path), card_accuracy=card["accuracy"], card_calibration=card["calibration"],
                   card_exchange={k: card["exchange"][k] for k in ("source", "latency_us", "bandwidth_gbps", "note")},
                   cpu_model=cpu_model.source, phases_s=phases, total_s=round(time.perf_counter() - t0, 1),
                   setting={"ndevices": n, "max_memory_gb": args.max_memory, "batch_size": batch, "types": list(args.types),
                            "cpu_refine": args.cpu_refine, "tasks": args.tasks, "max_tasks": args.max_tasks,
                            "rounds": args.rounds, "shards": args.shards, "seed": args.seed})
    print("\n".join(report_lines(summary)))
    with atomic_open(out / "plans.csv", "w") as fh:
        w = csv.writer(fh)
        w.writerow(["task", "planner", "types", "planning_s", "predicted_card_ms", "predicted_cpu_model_ms",
                    "measured_ms"] + [f"round_{j + 1}_ms" for j in range(args.rounds)] + ["shardings"])
        for r in rows:
            w.writerow([r["task"], r["planner"], r["types"], r["planning_s"], round(r["predicted_card_ms"], 4),
                        round(r["predicted_cpu_model_ms"], 4), round(r["measured_ms"], 4)]
                       + [round(c, 4) for c in r["rounds_ms"]] + [json.dumps(r["plan"].shardings_json())])
    with atomic_open(out / "summary.json", "w") as fh:
        fh.write(json.dumps(summary, indent=1) + "\n")
    manifest = {
        "format": "shardkit-result/1",
        "title": "a card of this CPU against the measured CPU: its predicted plan costs, and shardkit planned on it",
        "landscape": "measured CPU", "hardware": hardware,
        "setup": (f"tools/card_proof.py: a card calibrated on {card['calibration']['measured']} shards, "
                  f"{len(tasks)} tasks of {args.tasks} planned by shardkit on the card and on its CPU model, every plan "
                  f"measured afresh in {args.rounds} interleaved rounds (medians), batch {batch}, {n} logical devices"),
        "command": " ".join(["python", "tools/card_proof.py"] + list(argv if argv is not None else sys.argv[1:])),
        "commit": head_commit(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "records": [{"path": _rel(out / "plans.csv"), "what": "every plan: both predictions, every round's measured cost"},
                    {"path": _rel(out / "summary.json"), "what": "the figures printed: MAPE, Spearman, repeatability, "
                                                                  "the measured comparison"},
                    {"path": _rel(card_path), "what": "the card (tools/calibrate.py's format, docs/cards.md)"},
                    {"path": _rel(model_path), "what": "shardkit's CPU model fitted in the same session"}],
        "views": {"plans": {"kind": "csv", "path": _rel(out / "plans.csv"),
                            "columns": ["task", "planner", "predicted_card_ms", "predicted_cpu_model_ms", "measured_ms"]}},
        "notes": "; ".join(report_lines(summary)),
    }
    with atomic_open(out / "manifest.json", "w") as fh:
        fh.write(json.dumps(manifest, indent=2) + "\n")
    print(f"wrote {out}/: {', '.join(FILES)} in {summary['total_s']:.0f} s")


if __name__ == "__main__":
    run_main(main)
