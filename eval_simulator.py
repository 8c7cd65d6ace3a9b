#!/usr/bin/env python3
"""Shard tasks with one or more algorithms and score the plans with NeuroShard's simulator.

  python eval_simulator.py --alg neuroshard,lookup_greedy,random --task-path data/ns_tasks/test.txt \\
      --ndevices 4 --max_mem 0.75

--alg takes neuroshard, the baselines (random, naive, dim_greedy, size_greedy, lookup_greedy,
size_lookup_greedy) or a checkpoint, comma-separated; every plan is scored by the simulator built
from --compute-model, --fw-comm-model and --bw-comm-model (defaults under models/neuroshard/), no
hardware involved. With --measure the plans are also measured on this machine's hardware (as
eval.py does) and the simulator's error against the measurements is reported (MAPE of the plan
cost and of each of the four per-device costs).
"""

import argparse
import json
import os
import statistics


from tqdm import tqdm

from neuroshard.simulator import Simulator
from shardcore.cli import algorithms
from shardcore.evaluation import report
from shardcore.cli.common import check_outputs, serve_if_torchrun_rank
from shardcore.argtypes import seed_int
from shardcore.cli.common import (add_device_args, add_task_args, add_memory_args, add_oracle_args, device_ids, num_devices,
                                  open_evaluator, oracle_batch_size, planning_context, run_main, topology_of)
from shardcore.dataset import configs_batch_size, load_dataset
from shardcore.errors import ShardError
from shardcore.evaluation.compare import evaluate
from shardcore.io import atomic_open
from shardcore.oracles.setting import PRODUCED_BY, produced_by
from shardcore.tasks import load_tasks
from shardcore.cli.common import ArgumentParser as OneLineParser
from shardcore.argtypes import positive_int
from shardcore.costs import COST_PARTS


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--alg", default="neuroshard",
                   help="algorithm(s), comma-separated: neuroshard, random, naive, dim_greedy, size_greedy, "
                        "lookup_greedy, size_lookup_greedy, shardkit (planned for --oracle), or a checkpoint (default neuroshard)")
    add_task_args(p, "data/dlrm_tasks_50/test.txt")
    add_device_args(p)
    add_memory_args(p, default_precision="fp32")
    p.add_argument("--max-tasks", type=positive_int, default=None, metavar="N", help="only the first N tasks")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the random baseline (default 0)")
    p.add_argument("--measure", action="store_true",
                   help="also measure every plan on hardware and report the simulator's error")
    p.add_argument("--out", default=None, metavar="FILE.jsonl", help="one JSON object per task and algorithm")
    p.add_argument("--quiet", action="store_true", help="no per-task lines, only the summary")
    add_oracle_args(p)
    # each planner's own flags: NeuroShard's models (which also score every plan) and search, --shardkit-time, ...
    algorithms.add_planner_args(p, measuring=False)
    return p


def mape_table(results) -> str:
    rows = []
    groups: dict = {}
    for r in results:
        if r.cost_ms is not None and "simulated_cost_ms" in r.extra:
            groups.setdefault(r.alg, []).append(r)
    everything = [r for rs in groups.values() for r in rs]
    for alg, rs in list(groups.items()) + ([("all", everything)] if len(groups) > 1 else []):
        plan = [abs(r.extra["simulated_cost_ms"] - r.cost_ms) / r.cost_ms * 100 for r in rs]
        comp = []
        for j in range(4):
            errs = [abs(s[j] - m[j]) / max(m[j], 1e-3) * 100
                    for r in rs for s, m in zip(r.extra["simulated_device_costs_ms"], r.device_costs_ms)]
            comp.append(f"{statistics.fmean(errs):.1f}%")
        sim = statistics.fmean(r.extra["simulated_cost_ms"] for r in rs)
        meas = statistics.fmean(r.cost_ms for r in rs)
        rows.append([alg, len(rs), f"{sim:.2f}", f"{meas:.2f}", f"{statistics.fmean(plan):.1f}%",
                     f"{max(plan):.1f}%"] + comp)
    return report.format_table(["alg", "plans", "simulated ms", "measured ms", "plan cost MAPE", "worst",
                                *(f"{c} MAPE" for c in COST_PARTS)], rows)


def main(argv=None):
    args = build_parser().parse_args(argv)
    served = serve_if_torchrun_rank(args)   # torchrun ranks other than 0 measure, nothing else
    if served is not None:
        return served
    check_outputs(args, {"--out": args.out})   # never the task file, the dataset or a model it reads
    devices = device_ids(args)
    ndevices = num_devices(args)
    names = [a.strip() for a in args.alg.split(",") if a.strip()]
    if not names or len(set(names)) != len(names):
        raise ShardError(f"--alg must name distinct algorithms, got {args.alg!r}")
    dataset = load_dataset(args.data_dir, with_lookups=False)
    tasks = load_tasks(args.task_path, num_tables=dataset.num_tables)
    if args.max_tasks is not None:
        tasks = tasks[: args.max_tasks]
    configs = algorithms.planner_configs(args)
    models = configs["neuroshard"]   # the simulator that scores every plan: NeuroShard's models
    sim = Simulator.load(models.compute_model, models.fw_comm_model, models.bw_comm_model)
    topology = topology_of(args, ndevices)
    # shardkit plans for the landscape of --oracle (its own cost model; the simulator then scores it)
    ctx = planning_context(args, topology, args.batch_size)
    sharders = {name: algorithms.build(name, ctx, configs) for name in names}

    def show(result, task):
        if args.measure and result.measured is not None:   # the simulator's verdict on the measured plan
            simulated = sim.evaluate(result.plan().device_pieces)
            result.extra["simulated_cost_ms"] = simulated.cost_ms
            result.extra["simulated_device_costs_ms"] = simulated.device_costs_ms
        if args.quiet:
            return
        if not result.feasible:
            tqdm.write(f"task {result.task:3d} {result.alg:>20s}: {result.error}")
            return
        split = f", {sum(result.splits) - len(result.splits)} column splits" if result.splits else ""
        line = f"task {result.task:3d} {result.alg:>20s}: "
        if args.measure:
            line += f"measured {result.cost_ms:8.3f} ms, simulated {result.extra['simulated_cost_ms']:8.3f} ms"
        else:
            line += f"simulated {result.cost_ms:8.3f} ms"
        tqdm.write(line + f", planning {1e3 * result.planning_seconds:.1f} ms{split}")

    mode = "simulated and measured on hardware" if args.measure else "simulated"
    print(f"{len(tasks)} tasks from {args.task_path}, {ndevices} devices, cap {args.max_memory:g} GiB "
          f"({args.weights_precision}), {mode}; algorithms: {', '.join(names)}")
    if args.measure:
        # the models' setting against the batch the plans will run at, said before any worker starts
        sim.check_setting(batch_size=oracle_batch_size(args) or configs_batch_size(args.data_dir))
        with open_evaluator(args, args.data_dir, devices) as ev:
            print(f"workers up in {ev.info.startup_s:.1f} s on {ev.info.device_type} (batch {ev.batch_size})")

            with tqdm(total=len(tasks) * len(sharders), desc="measuring", unit="plan", disable=None) as bar:
                results = evaluate(tasks, dataset.tables, sharders, topology, oracle=ev, on_result=show,
                                   progress=bar)
    else:
        with tqdm(total=len(tasks) * len(sharders), desc="simulating", unit="plan", disable=None) as bar:
            results = evaluate(tasks, dataset.tables, sharders, topology, oracle=sim, on_result=show, progress=bar)
    task_set = f"{os.path.basename(os.path.dirname(os.path.abspath(args.task_path)))}/" \
               f"{os.path.basename(args.task_path)} ({ndevices})"
    print()
    if args.measure:
        print("measured on hardware:")
        print(report.measured_summary(results))
        print()
        simulated = []
        for r in results:
            c = type(r)(**{**r.__dict__, "extra": dict(r.extra)})
            if r.cost_ms is not None:
                c.cost_ms = r.extra["simulated_cost_ms"]
                c.device_costs_ms = r.extra["simulated_device_costs_ms"]
            simulated.append(c)
        print("simulated:")
        print(report.measured_summary(simulated))
        print()
        print("simulator error against the measurements:")
        print(mape_table(results))
        print("(fw_comm differs by design: the simulator's forward exchange includes each device's wait for the "
              "slowest one, the start delays of imbalanced compute; the evaluator times it from a barrier. The "
              "plan cost, the max over devices, compares like with like.)")
    else:
        print("simulated:")
        print(report.measured_summary(results))
        print()
        print(report.paper_table(results, task_set))
    if args.out:
        # without --measure every cost is the simulator's prediction: stamped so, never read as measured
        stamp = produced_by("eval_simulator.py", ev.hardware if args.measure else "NeuroShard's simulator",
                            predicted=not args.measure)
        with atomic_open(args.out) as fh:
            for r in results:
                obj = {**r.to_json(), PRODUCED_BY: stamp}
                if not args.measure and r.cost_ms is not None:
                    obj["simulated_cost_ms"] = obj.pop("cost_ms")
                    obj["simulated_device_costs_ms"] = obj.pop("device_costs_ms")
                fh.write(json.dumps(obj) + "\n")
        print(f"wrote {len(results)} records to {args.out}")


if __name__ == "__main__":
    run_main(main)
