#!/usr/bin/env python3
"""Does the measured CPU oracle tell the truth? Its reported costs against an independent timing of the same work.

  python tools/cpu_truth.py --out-dir /tmp/truth            # a fresh synthetic dataset, about 10 minutes
  python tools/cpu_truth.py --data-dir D --out-dir /tmp/truth --tasks 2 --rounds 3

On fresh synthetic tasks (``--tasks`` tasks of ``--task-tables`` tables drawn from a dataset generated with
``--seed``, or ``--data-dir``), three plans per task -- random, lookup_greedy, and lookup_greedy with its
heaviest table cut in two column blocks, its second heaviest row-wise over every device and its three
smallest replicated (so that row blocks, column blocks and replicas are measured too) -- are measured by
the measured oracle (``eval.py``'s, no cache) in ``--rounds`` interleaved rounds (each round every plan
once, in a shuffled order). Then, with the oracle closed, every device's shard is timed on its own the
plain way: one thread, wall clock, ``--warmup`` warm-up iterations then ``--iters`` timed ones back to
back, the minimum kept (the shard in its own warm state, nothing else running), and every plan's pooled
all-to-all is timed the same way between ``--ndevices`` fresh gloo processes.

Printed (and written to ``--out-dir``: ``truth.json`` with every figure, ``truth.md``), with the hardware:

- **compute**: per device the oracle's reported fw + bw compute (the median over the rounds) over the
  independent minimum; their ratio by shard size (light, medium, heavy by the independent timing's
  thirds) and by what a shard holds (one table, several, column blocks, row blocks, replicas); the slope
  of reported against independent (least squares); the share of devices within 0.75-1.33x;
- **repeatability**: per plan the mean deviation of its cost from its median over the rounds, and the
  same for every device's compute;
- **exchange**: per device the oracle's pooled all-to-all (fw) over the independent one, and its slope;
- **speed rules**: the same samples under every speed correction the oracle knows
  (``shardcore.oracles.measured.driver.SPEED_RULES``, the oracle opened with ``speed_rules=True``), each
  judged the same way -- those that divide by the reference shard at its nominal speed, so against the
  independent timings scaled by the reference timed beside them.

Beside them: ``classes.csv``, ``checks.csv``, ``rules.csv`` and a result manifest (results/README.md).

The verdicts are the measured-oracle issue's: every device within 0.75-1.33x, the slope within 0.85-1.15.
"""

from __future__ import annotations

import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shardcore.argtypes import nonnegative_int, positive_int  # noqa: E402
from shardcore.cli.common import make_parser, run_main  # noqa: E402
from shardcore.errors import ShardError  # noqa: E402
from tools.report import head_commit  # noqa: E402
from shardcore.oracles.measured.driver import SPEED_RULES  # noqa: E402

BAND = (0.75, 1.33)
SLOPE = (0.85, 1.15)


def build_parser():
    p = make_parser(description=__doc__)
    p.add_argument("--data-dir", type=Path, default=None,
                   help="a dataset with its data.pt (default: a fresh synthetic one in --out-dir, --seed)")
    p.add_argument("--out-dir", type=Path, required=True, help="where truth.json and truth.md go (and the dataset)")
    p.add_argument("--seed", type=nonnegative_int, default=7, help="the synthetic dataset's and the tasks' seed (default 7)")
    p.add_argument("--dataset-tables", type=positive_int, default=160, help="tables of the synthetic dataset (default 160)")
    p.add_argument("--batch-size", type=positive_int, default=2048, help="its batch (default 2048)")
    p.add_argument("--tasks", type=positive_int, default=4, help="tasks (default 4)")
    p.add_argument("--task-tables", type=positive_int, default=40, help="tables per task (default 40)")
    p.add_argument("--ndevices", type=positive_int, default=4, help="logical devices (default 4)")
    p.add_argument("--rounds", type=positive_int, default=5, help="interleaved rounds of the oracle (default 5)")
    p.add_argument("--warmup", type=nonnegative_int, default=5, help="independent timing: warm-up iterations (default 5)")
    p.add_argument("--iters", type=positive_int, default=30, help="independent timing: timed iterations (default 30)")
    p.add_argument("--comm-iters", type=positive_int, default=15, help="independent all-to-all repetitions (default 15)")
    return p


def dataset_dir(args) -> Path:
    if args.data_dir is not None:
        if not (args.data_dir / "data.pt").is_file():
            raise ShardError(f"--data-dir {args.data_dir}: no data.pt (the oracle measures real lookups)")
        return args.data_dir
    out = args.out_dir / f"data_t{args.dataset_tables}_b{args.batch_size}_s{args.seed}"
    if not (out / "data.pt").is_file():
        cmd = [sys.executable, str(ROOT / "tools" / "gen_dlrm_data.py"), "--synthetic", "--num-tables",
               str(args.dataset_tables), "--batch-size", str(args.batch_size), "--seed", str(args.seed),
               "--dims", "4,8,16,32,64", "--out-dir", str(out), "--quiet"]
        subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return out


def plans_of(tables, n: int, cap: float, seed: int) -> dict:
    """The three plans of a task (module notes)."""
    from shardcore.baselines import make_baseline
    from shardcore.plan import Plan, column_wise, data_parallel, row_wise
    from shardcore.topology import Topology

    top = Topology(n, cap)
    out = {"random": make_baseline("random", seed=seed).shard(tables, top),
           "lookup_greedy": make_baseline("lookup_greedy").shard(tables, top)}
    sh = list(out["lookup_greedy"].shardings)
    order = sorted(range(len(tables)), key=lambda i: -tables[i].dim * tables[i].pooling_factor)
    first = next(i for i in order if tables[i].dim % 8 == 0)
    d0 = sh[first].devices[0]
    sh[first] = column_wise([(d0, tables[first].dim // 2), ((d0 + 1) % n, tables[first].dim // 2)])
    second = next(i for i in order if i != first)
    sh[second] = row_wise(range(n))
    for i in sorted(range(len(tables)), key=lambda i: tables[i].row)[:3]:
        if i not in (first, second):
            sh[i] = data_parallel(n)
    out["pieces"] = Plan(tables, sh, top)
    return out


def tags_of(pieces, full_dims: dict) -> list[str]:
    """What a device holds, as the report's classes (a device may be in several)."""
    kinds = {getattr(p, "kind", "table_wise") for p in pieces}
    tags = ["several tables" if len(pieces) > 1 else "one table"]
    if any(p.dim != full_dims.get(p.index, p.dim) for p in pieces):
        tags.append("column blocks")
    if "row_wise" in kinds:
        tags.append("row blocks")
    if "data_parallel" in kinds:
        tags.append("replicas")
    return tags


def independent_compute(data, shards, batch, warmup: int, iters: int) -> tuple[list[tuple[float, float]], float]:
    """Per shard (min, median) of fw + bw wall-clock ms, timed in this process on one thread; and the
    reference shard's (the oracle's unit of speed) minimum, timed the same way between every eighth shard
    (its median over those timings)."""
    import torch

    from shardcore.oracles.measured.benchmark import ReferenceRunner, ShardRunner
    from shardcore.oracles.measured.worker import steady_heap

    torch.set_num_threads(1)
    steady_heap()
    ref = ReferenceRunner(batch)
    refs, out = [], []

    def time_ref():
        fw, bw = ref.sample(warmup, iters, cpu_clock=False)
        refs.append(min(f + b for f, b in zip(fw, bw)))

    for k, pieces in enumerate(shards):
        if k % 8 == 0:
            time_ref()
        if not pieces:
            out.append((0.0, 0.0))
            continue
        runner = ShardRunner(data, pieces, batch_size=batch)
        fw, bw = runner.sample(warmup, iters, cpu_clock=False)
        tot = [f + b for f, b in zip(fw, bw)]
        out.append((min(tot), statistics.median(tot)))
        runner.close()
    time_ref()
    return out, statistics.median(refs)


def _a2a_worker(rank, world, port, dims_list, batch, warmup, iters, conn):
    import torch
    import torch.distributed as dist

    from shardcore.plan import batch_slices

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    res = []
    for dims in dims_list:
        sl = batch_slices(batch, world)
        send = [sl[j] * dims[rank] for j in range(world)]
        recv = [sl[rank] * dims[d] for d in range(world)]
        src, dst = torch.randn(sum(send)), torch.empty(sum(recv))
        times = []
        for i in range(warmup + iters):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_to_all_single(dst, src, recv, send)
            if i >= warmup:
                times.append((time.perf_counter() - t0) * 1e3)
        res.append(min(times))
    conn.send(res)
    dist.destroy_process_group()


def independent_exchange(dims_list, n: int, batch: int, iters: int) -> list[list[float]]:
    """Per plan, per device, the minimum ms of the pooled forward all-to-all of its dims, between fresh
    gloo processes (one thread each)."""
    import multiprocessing as mp
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    for r in range(n):
        a, b = ctx.Pipe(False)
        p = ctx.Process(target=_a2a_worker, args=(r, n, port, dims_list, batch, 3, iters, b))
        p.start()
        pipes.append(a)
        procs.append(p)
    got = [a.recv() for a in pipes]
    for p in procs:
        p.join(60)
    return [[got[d][k] for d in range(n)] for k in range(len(dims_list))]


def fit_slope(x, y) -> float:
    x, y = np.asarray(x, float), np.asarray(y, float)
    return float(np.polyfit(x, y, 1)[0]) if len(x) > 1 and x.std() > 0 else float("nan")


def summarize(devs: list[dict], plans: list[dict], comm: list[dict]) -> dict:
    ratios = np.array([d["reported_ms"] / d["independent_ms"] for d in devs])
    ind = np.array([d["independent_ms"] for d in devs])
    lo, hi = np.percentile(ind, [100 / 3, 200 / 3])
    classes = {"light": ind <= lo, "medium": (ind > lo) & (ind <= hi), "heavy": ind > hi}
    by_size = {k: {"devices": int(m.sum()), "independent_ms": [round(float(ind[m].min()), 2), round(float(ind[m].max()), 2)],
                   "ratio": [round(float(ratios[m].min()), 3), round(float(np.median(ratios[m])), 3),
                             round(float(ratios[m].max()), 3)]} for k, m in classes.items() if m.any()}
    by_kind = {}
    for kind in ("one table", "several tables", "column blocks", "row blocks", "replicas"):
        m = np.array([kind in d["holds"] for d in devs])
        if m.any():
            by_kind[kind] = {"devices": int(m.sum()), "ratio": [round(float(ratios[m].min()), 3),
                                                                round(float(np.median(ratios[m])), 3),
                                                                round(float(ratios[m].max()), 3)]}
    plan_dev = [abs(c - statistics.median(p["costs_ms"])) / statistics.median(p["costs_ms"])
                for p in plans for c in p["costs_ms"]]
    dev_dev = [abs(c - statistics.median(d["rounds_ms"])) / statistics.median(d["rounds_ms"])
               for d in devs for c in d["rounds_ms"] if statistics.median(d["rounds_ms"]) > 0]
    out = {"devices": len(devs), "slope": round(fit_slope(ind, [d["reported_ms"] for d in devs]), 3),
           "within_band": int(((ratios >= BAND[0]) & (ratios <= BAND[1])).sum()),
           "ratio": [round(float(ratios.min()), 3), round(float(np.median(ratios)), 3), round(float(ratios.max()), 3)],
           "by_size": by_size, "by_kind": by_kind,
           "repeatability": {"plan_mean_dev_pct": round(100 * float(np.mean(plan_dev)), 2),
                             "device_mean_dev_pct": round(100 * float(np.mean(dev_dev)), 2)}}
    out["rules"] = {}
    for rule in SPEED_RULES:   # the same samples under each speed rule; those at the nominal speed against it
        have = [d for d in devs if d.get("rules_ms", {}).get(rule)]
        if len(have) != len(devs):
            continue
        x = np.array([d["independent_ms" if rule == "none" else "independent_nominal_ms"] for d in have])
        y = np.array([statistics.median(d["rules_ms"][rule]) for d in have])
        q = y / x
        dev = [abs(c - statistics.median(d["rules_ms"][rule])) / statistics.median(d["rules_ms"][rule])
               for d in have for c in d["rules_ms"][rule] if statistics.median(d["rules_ms"][rule]) > 0]
        heavy = x > np.percentile(x, 200 / 3)
        out["rules"][rule] = {"within_band": int(((q >= BAND[0]) & (q <= BAND[1])).sum()),
                              "slope": round(fit_slope(x, y), 3),
                              "ratio": [round(float(q.min()), 3), round(float(np.median(q)), 3), round(float(q.max()), 3)],
                              "light_over_heavy": round(float(np.median(q[x <= np.percentile(x, 100 / 3)]) /
                                                              np.median(q[heavy])), 3),
                              "device_mean_dev_pct": round(100 * float(np.mean(dev)), 2)}
    if comm:
        cr = np.array([c["reported_ms"] / c["independent_ms"] for c in comm if c["independent_ms"] > 0])
        out["exchange"] = {"devices": len(comm), "slope": round(fit_slope([c["independent_ms"] for c in comm],
                                                                          [c["reported_ms"] for c in comm]), 3),
                           "ratio": [round(float(cr.min()), 3), round(float(np.median(cr)), 3), round(float(cr.max()), 3)]}
    return out


RULE_NAMES = {"none": "none: the lower quartile of the warm samples (reported)",
              "window": "the reference blocks of the last 16 measurements",
              "beside": "the reference blocks beside this measurement alone",
              "session": "every reference block of the session so far"}


def rule_lines(s: dict) -> list[str]:
    """The same samples under every speed rule of the oracle (shardcore.oracles.measured.driver.SPEED_RULES)."""
    if not s.get("rules"):
        return []
    from shardcore.evaluation.report import format_table

    rows = [[RULE_NAMES.get(r, r), f"{v['within_band']} of {s['devices']}", str(v["slope"]),
             f"{v['ratio'][0]} / {v['ratio'][1]} / {v['ratio'][2]}", str(v["light_over_heavy"]),
             f"{v['device_mean_dev_pct']}%"] for r, v in s["rules"].items()]
    return ["", "the same samples under each speed rule (a protocol change is judged on both truth and repeatability):",
            format_table(["speed correction", "within band", "slope", "ratio min / median / max",
                          "light / heavy ratio", "device compute mean deviation"], rows), ""]


def render(s: dict, hardware: str, meta: dict | None = None) -> str:
    from shardcore.evaluation.report import format_table

    rows = [[k, str(v["devices"]), f"{v['independent_ms'][0]}-{v['independent_ms'][1]}",
             f"{v['ratio'][0]} / {v['ratio'][1]} / {v['ratio'][2]}"] for k, v in s["by_size"].items()]
    rows += [[k, str(v["devices"]), "", f"{v['ratio'][0]} / {v['ratio'][1]} / {v['ratio'][2]}"]
             for k, v in s["by_kind"].items()]
    ok_band = s["within_band"] == s["devices"]
    ok_slope = SLOPE[0] <= s["slope"] <= SLOPE[1]
    speed = (f"the rules that divide by the reference shard give ms at its nominal speed ({meta['reference_nominal_ms']} ms); "
             f"the reference timed beside the independent timings took {meta['reference_wall_ms']} ms, so those are "
             f"judged against the independent timings x {meta['reference_nominal_ms'] / meta['reference_wall_ms']:.3f}"
             if meta else "")
    lines = [f"measured CPU oracle against an independent timing, {hardware}", speed, "",
             format_table(["shards", "devices", "independent ms", "reported / independent: min / median / max"], rows), "",
             f"compute: {s['within_band']} of {s['devices']} devices within {BAND[0]}-{BAND[1]}x "
             f"({'met' if ok_band else 'NOT met'}); slope of reported against independent {s['slope']} "
             f"({'met' if ok_slope else 'NOT met'}: {SLOPE[0]}-{SLOPE[1]})",
             *rule_lines(s),
             f"repeatability: plan cost mean deviation from its median over the rounds "
             f"{s['repeatability']['plan_mean_dev_pct']}%, device compute {s['repeatability']['device_mean_dev_pct']}%"]
    if "exchange" in s:
        e = s["exchange"]
        lines.append(f"exchange (pooled all-to-all, forward): reported / independent min / median / max "
                     f"{e['ratio'][0]} / {e['ratio'][1]} / {e['ratio'][2]}, slope {e['slope']} over {e['devices']} devices")
    return "\n".join(lines) + "\n"


def main(argv=None):
    from shardcore.dataset import load_dataset
    from shardcore.io import atomic_open
    from shardcore.oracles.factory import open_oracle
    from shardcore.types import CommLayout

    args = build_parser().parse_args(argv)
    made_by = head_commit()   # the code that makes the records: taken before they are made
    if args.ndevices < 2:
        raise ShardError("--ndevices: at least 2 (the exchange is part of the check)")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    data_dir = dataset_dir(args)
    ds = load_dataset(data_dir)
    rng = random.Random(args.seed)
    if args.task_tables > ds.num_tables:
        raise ShardError(f"--task-tables {args.task_tables}: the dataset has {ds.num_tables} tables")
    tasks = [sorted(rng.sample(range(ds.num_tables), args.task_tables)) for _ in range(args.tasks)]
    plans = []
    for k, ids in enumerate(tasks):
        tables = [ds.tables[i] for i in ids]
        cap = max(1.5 * sum(t.memory_gb() for t in tables) / args.ndevices, 1.2 * max(t.memory_gb() for t in tables)) + 0.01
        for name, plan in plans_of(tables, args.ndevices, cap, args.seed + k).items():
            plans.append({"task": k, "alg": name, "tables": tables, "plan": plan,
                          "shards": plan.device_pieces, "costs_ms": [], "device_rounds": [], "rule_rounds": []})
    order = list(range(len(plans)))
    t0 = time.perf_counter()
    with open_oracle(data_dir, args.ndevices, oracle="measured", device_ids=list(range(args.ndevices)),
                     batch_size=args.batch_size, cache=False) as ev:
        getattr(ev, "oracle", ev).speed_rules = True   # the reference beside every sample: every rule judged
        ev.start()
        hardware = ev.hardware
        nominal = ev.reference_nominal()
        comm_rep = {}
        for r in range(args.rounds):
            rng.shuffle(order)
            for i in order:
                p = plans[i]
                res = ev.evaluate(p["shards"], no_cache=True)
                p["costs_ms"].append(res.cost_ms)
                p["device_rounds"].append([c.fw_comp + c.bw_comp for c in res.devices])
                rules = getattr(getattr(ev, "oracle", ev), "speed_rule_costs", {})   # the same samples, other rules
                p["rule_rounds"].append({d: {r: c.fw_ms + c.bw_ms for r, c in by.items()} for d, by in rules.items()})
                print(f"round {r + 1}/{args.rounds} task {p['task']} {p['alg']}: {res.cost_ms:.2f} ms", flush=True)
        for i, p in enumerate(plans):   # the pooled all-to-all alone, as the independent timing runs it
            dims = [sum(t.dim for t in s if getattr(t, "kind", None) != "data_parallel") for s in p["shards"]]
            fwbw, _ = ev.measure_comm(CommLayout(dims))
            comm_rep[i] = (dims, [f for f, _b in fwbw])
    oracle_s = time.perf_counter() - t0
    shards = [s for p in plans for s in p["shards"]]
    ind, ref_wall = independent_compute(ds, shards, args.batch_size, args.warmup, args.iters)
    # the rules that divide by the reference give ms at its nominal speed (the reference's cost the oracle
    # calibrated): they are judged against the independent timings at that speed, by the reference timed beside them
    speed = nominal / ref_wall
    comm_ind = independent_exchange([comm_rep[i][0] for i in range(len(plans))], args.ndevices, args.batch_size,
                                    args.comm_iters)
    devs, comm, k = [], [], 0
    for i, p in enumerate(plans):
        for d, pieces in enumerate(p["shards"]):
            mn, med = ind[k]
            k += 1
            if not pieces:
                continue
            rounds = [row[d] for row in p["device_rounds"]]
            full = {t.index: t.dim for t in p["tables"]}
            devs.append({"task": p["task"], "alg": p["alg"], "device": d, "tables": len(pieces),
                         "holds": tags_of(pieces, full),
                         "reported_ms": statistics.median(rounds), "rounds_ms": rounds, "independent_ms": mn,
                         "independent_nominal_ms": mn * speed, "independent_median_ms": med,
                         "rules_ms": {r: [row[d][r] for row in p["rule_rounds"] if d in row]
                                      for r in SPEED_RULES if all(d in row for row in p["rule_rounds"])}})
        for d in range(args.ndevices):
            comm.append({"task": p["task"], "alg": p["alg"], "device": d, "reported_ms": comm_rep[i][1][d],
                         "independent_ms": comm_ind[i][d]})
    s = summarize(devs, [{"costs_ms": p["costs_ms"]} for p in plans], comm)
    from shardcore.oracles.setting import cpu_name

    meta = {"hardware": hardware, "cpu": cpu_name() or platform.machine(), "cpus": os.cpu_count(),
            "reference_nominal_ms": round(nominal, 4), "reference_wall_ms": round(ref_wall, 4),
            "command": "python tools/cpu_truth.py " +
            " ".join(sys.argv[1:] if argv is None else map(str, argv)), "oracle_seconds": round(oracle_s, 1)}
    meta["commit"] = made_by
    text = render(s, hardware, meta)
    with atomic_open(args.out_dir / "truth.json") as fh:
        fh.write(json.dumps({"summary": s, "meta": meta, "devices": devs, "exchange": comm}, indent=1) + "\n")
    with atomic_open(args.out_dir / "truth.md") as fh:
        fh.write(text)
    write_views(args.out_dir, s, meta, argv)
    print(text)
    return 0


def write_views(out: Path, s: dict, meta: dict, argv) -> None:
    """``classes.csv`` and ``checks.csv`` (the report's tables) and a result manifest beside them
    (results/README.md's format), so that the folder can be a result of its own."""
    import csv
    import io as _io

    from shardcore.io import atomic_open

    def write_csv(name, header, rows):
        buf = _io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)
        with atomic_open(out / name) as fh:
            fh.write(buf.getvalue())

    rows = [[k, v["devices"], f"{v['independent_ms'][0]}-{v['independent_ms'][1]}",
             f"{v['ratio'][0]} / {v['ratio'][1]} / {v['ratio'][2]}"] for k, v in s["by_size"].items()]
    rows += [[k, v["devices"], "", f"{v['ratio'][0]} / {v['ratio'][1]} / {v['ratio'][2]}"] for k, v in s["by_kind"].items()]
    rows.append(["every device", s["devices"], "", f"{s['ratio'][0]} / {s['ratio'][1]} / {s['ratio'][2]}"])
    write_csv("classes.csv", ["shards", "devices", "independent ms", "reported / independent (min / median / max)"], rows)
    checks = [["devices within 0.75-1.33x", f"{s['within_band']} of {s['devices']}", "all",
               "met" if s["within_band"] == s["devices"] else "not met"],
              ["slope of reported against independent", s["slope"], f"{SLOPE[0]}-{SLOPE[1]}",
               "met" if SLOPE[0] <= s["slope"] <= SLOPE[1] else "not met"],
              ["plan cost: mean deviation from its median over the rounds", f"{s['repeatability']['plan_mean_dev_pct']}%",
               "", ""],
              ["device compute: mean deviation from its median over the rounds",
               f"{s['repeatability']['device_mean_dev_pct']}%", "", ""]]
    if "exchange" in s:
        e = s["exchange"]
        checks.append(["pooled all-to-all: reported / independent (min / median / max), slope",
                       f"{e['ratio'][0]} / {e['ratio'][1]} / {e['ratio'][2]}, slope {e['slope']}", "", ""])
    write_csv("checks.csv", ["check", "figure", "goal", "verdict"], checks)
    write_csv("rules.csv", ["speed correction", "within band", "slope", "ratio min / median / max",
                            "light / heavy ratio", "device compute mean deviation"],
              [[RULE_NAMES.get(r, r), f"{v['within_band']} of {s['devices']}", v["slope"],
                f"{v['ratio'][0]} / {v['ratio'][1]} / {v['ratio'][2]}", v["light_over_heavy"],
                f"{v['device_mean_dev_pct']}%"] for r, v in s.get("rules", {}).items()])
    rel = out.resolve().relative_to(ROOT) if out.resolve().is_relative_to(ROOT) else out
    manifest = {"format": "shardkit-result/1",
                "title": "The measured CPU oracle against an independent timing of the same shards",
                "landscape": "measured CPU", "hardware": meta["hardware"],
                "setup": "every device's shard timed alone after the oracle: one thread, wall clock, the minimum of "
                         "the timed iterations after warm-ups; the pooled all-to-all between fresh gloo processes",
                "command": meta["command"], "commit": meta["commit"],
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "records": [{"path": f"{rel}/truth.json", "what": "every device's reported and independent figures"},
                            {"path": f"{rel}/classes.csv", "what": "the ratio by shard size and by what a device holds"},
                            {"path": f"{rel}/checks.csv", "what": "the checks and their goals"},
                            {"path": f"{rel}/rules.csv", "what": "the same samples under each speed rule"}],
                "views": {"classes": {"kind": "csv", "path": f"{rel}/classes.csv"},
                          "checks": {"kind": "csv", "path": f"{rel}/checks.csv"},
                          "rules": {"kind": "csv", "path": f"{rel}/rules.csv"}}}
    with atomic_open(out / "manifest.json") as fh:
        fh.write(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    run_main(main)
