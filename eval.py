#!/usr/bin/env python3
"""Shard tasks with one or more algorithms and evaluate the plans.

  python eval.py --alg random,lookup_greedy --task-path data/dlrm_tasks_50/test.txt \\
      --gpu-devices 0,1,2,3 --max-memory 5 --plan-only

--alg takes baselines (random, naive, dim_greedy, size_greedy, lookup_greedy, size_lookup_greedy)
or a trained model's checkpoint (.pt); several comma-separated algorithms are evaluated side by side
on the same tasks. Without --plan-only every plan is measured on this machine's hardware (the FBGEMM
micro-benchmark and a real all-to-all between one worker per device; see README, "Measurement");
--plan-only plans without hardware: allocation, per-device memory, feasibility.
"""

import argparse
import json
import os


from tqdm import tqdm

from shardcore.cli import algorithms

from shardcore.evaluation import report
from shardcore.cli import common as cli
from shardcore.cli.common import serve_if_torchrun_rank
from shardcore.argtypes import seed_int
from shardcore.cli.common import (add_device_args, add_task_args, add_memory_args, add_oracle_args, device_ids,
                                  num_devices, open_evaluator, planning_context, prestart_oracle, run_main, topology_of)
from shardcore.dataset import load_dataset
from shardcore.errors import ShardError
from shardcore.evaluation.compare import evaluate
from shardcore.io import atomic_open
from shardcore.oracles.setting import PRODUCED_BY, produced_by
from shardcore.oracles.measured.shardings import type_counts_text
from shardcore.tasks import load_tasks
from shardcore.oracles.factory import pricing
from shardcore.cli.common import ArgumentParser as OneLineParser
from shardcore.argtypes import positive_int


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--alg", default="random",
                   help="algorithm(s), comma-separated: random, naive, dim_greedy, size_greedy, "
                        "lookup_greedy, size_lookup_greedy, torchrec (TorchRec's planner choosing among table-, "
                        "column-, row-wise and data-parallel sharding), torchrec-tw (the same, table-wise "
                        "only), neuroshard, autoshard, shardkit (shardkit's own planner: every sharding type, a cost "
                        "model of the oracle, local search; flags below), shardkit-tw (its search, table-wise only: the "
                        "table-wise optimum the learned methods are measured against), or a model checkpoint path (default random)")
    add_task_args(p, "data/dlrm_tasks_50/test.txt")
    add_device_args(p)
    add_memory_args(p)
    p.add_argument("--max-tasks", type=positive_int, default=None, metavar="N", help="evaluate only the first N tasks")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the random baseline (default 0)")
    p.add_argument("--plan-only", action="store_true",
                   help="plan without hardware: print allocations, per-device memory and feasibility")
    p.add_argument("--out", default=None, metavar="FILE.jsonl",
                   help="write one JSON object per task and algorithm (written atomically at the end)")
    p.add_argument("--quiet", action="store_true", help="no per-task lines, only the summary")
    p.add_argument("--export-torchrec", default=None, metavar="DIR",
                   help="also write every plan as DIR/<alg>/task_<k>.json (plain) and .torchrec.json "
                        "(TorchRec ParameterSharding, every sharding type) plus DIR/index.json; tables are named as "
                        "table_configs.json names them ('name'), else table_<index>")
    algorithms.add_planner_args(p, measuring=True)   # each planner's own flags: --shardkit-time, --torchrec-time, ...
    p.add_argument("--task-set", default=None, metavar="NAME",
                   help="row label of the paper-style table (default: derived from the task file)")
    add_oracle_args(p)
    p.add_argument("--repeats", type=positive_int, default=1, metavar="N",
                   help="measure every plan N times (noisy hardware such as a shared CPU): a task's plans are "
                        "made first, then measured in N rounds, each plan once per round in --alg order, every "
                        "measurement afresh (the cache is not read); per device and cost part the median is "
                        "reported, and each round's cost is recorded (repeat_costs_ms). Default 1")
    return p


def measured_batch_size(args) -> int | None:
    """The batch size plans are measured at: --batch-size, else the dataset's (from data.pt, which is
    memory-mapped, or the ``batch_size`` its table configs record; None when neither says)."""
    from shardcore.dataset import configs_batch_size

    if args.batch_size is not None:
        return args.batch_size
    if os.path.isfile(os.path.join(args.data_dir, "data.pt")):
        return load_dataset(args.data_dir).batch_size   # memory-mapped, checked against the configs: cheap
    return configs_batch_size(args.data_dir)


def _repeat_counts(tables) -> list[int]:
    """Per table, how many times its index came before it in the task (NeuroShard's tasks repeat ids)."""
    seen: dict[int, int] = {}
    out = []
    for t in tables:
        out.append(seen.get(t.index, 0))
        seen[t.index] = out[-1] + 1
    return out


def check_outputs(args) -> None:
    """Before any planning or measuring: --out and --export-torchrec can be written and replace no input
    (the export rewrites DIR/index.json and a folder per algorithm as a whole)."""
    from shardcore.interop.plan_export import alg_slug

    outputs, replaced = {"--out": args.out}, []
    if args.export_torchrec:
        for name in (a.strip() for a in args.alg.split(",") if a.strip()):
            flag = f"--export-torchrec ({alg_slug(name)}/)"
            outputs[flag] = os.path.join(args.export_torchrec, alg_slug(name))
            replaced.append(flag)
    cli.check_outputs(args, outputs, dirs=replaced, replaced=replaced,
                      folders={"--export-torchrec": (args.export_torchrec, ["index.json"])})


def check_repeats(args) -> None:
    """``--repeats N`` takes medians of noisy measurements: with nothing measured (--plan-only), or on an
    emulated oracle (a model: the same answer every time), it would only repeat the work."""
    from shardcore.planning import MEASURED, parse_landscape

    if args.repeats > 1 and (args.plan_only or parse_landscape(args.oracle) != MEASURED):
        why = "--plan-only measures nothing" if args.plan_only else \
            f"the {args.oracle} oracle is a model that answers a plan the same every time"
        raise ShardError(f"--repeats {args.repeats}: {why}; --repeats is for a measured oracle's noise (drop it)")


def main(argv=None):
    args = build_parser().parse_args(argv)
    served = serve_if_torchrun_rank(args)   # torchrun ranks other than 0 measure, nothing else
    if served is not None:
        return served
    check_outputs(args)
    devices = device_ids(args)
    ndevices = num_devices(args)
    names = [a.strip() for a in args.alg.split(",") if a.strip()]
    if not names:
        raise ShardError("--alg names no algorithm")
    if len(set(names)) != len(names):
        raise ShardError(f"--alg names an algorithm twice: {args.alg}")
    dataset = load_dataset(args.data_dir, with_lookups=False)
    tasks = load_tasks(args.task_path, num_tables=dataset.num_tables)
    if args.max_tasks is not None:
        tasks = tasks[: args.max_tasks]
    topology = topology_of(args, ndevices)   # under torchrun, its hosts (TorchRec's local_world_size)
    # the one context every planner is built with; a planner that calibrates on the machine (shardkit) never
    # measures the evaluated tasks' tables
    ctx = planning_context(args, topology, measured_batch_size(args), evaluated_tasks=[args.task_path])
    configs = algorithms.planner_configs(args)   # each planner's own flags, bound to its own config
    if getattr(args, "shardkit_refine", None) and args.plan_only:
        raise ShardError("--shardkit-refine measures candidates: it cannot be used with --plan-only")
    check_repeats(args)
    prestart_oracle(args)   # the workers' imports beside the planners' set-up
    sharders = {name: algorithms.build(name, ctx, configs) for name in names}

    def show(result, task):
        if args.quiet:
            return
        if not result.feasible:
            tqdm.write(f"task {result.task:3d} {result.alg:>20s}: {result.error}")
        elif result.cost_ms is not None:
            per = " ".join(f"{sum(c):.2f}" for c in result.device_costs_ms)
            tqdm.write(f"task {result.task:3d} {result.alg:>20s}: cost {result.cost_ms:8.3f} ms, devices [{per}] ms, "
                       f"planning {1e3 * result.planning_seconds:.1f} ms")
        else:
            mem = " ".join(f"{m:.3f}" for m in result.memory_gb)
            tqdm.write(f"task {result.task:3d} {result.alg:>20s}: feasible, memory GiB [{mem}], "
                       f"allocation {result.allocation}")

    mode = "plan only" if args.plan_only else ("measured on hardware" if not ctx.landscape.emulated
                                               else f"judged by the {ctx.oracle} oracle")
    print(f"{len(tasks)} tasks from {args.task_path}, {ndevices} devices, cap {args.max_memory:g} GiB "
          f"({args.weights_precision}), {mode}; algorithms: {', '.join(names)}")
    if args.plan_only:
        with tqdm(total=len(tasks) * len(sharders), desc="planning", unit="plan", disable=None) as bar:
            results = evaluate(tasks, dataset.tables, sharders, topology, on_result=show, progress=bar)
        print()
        print(report.plan_only_summary(results))
        print(type_counts_text(results))
    else:
        oracle = open_evaluator(args, args.data_dir, devices, ndevices)
        algorithms.attach_oracle(sharders.values(), oracle)   # checked before any worker starts
        with oracle as ev:
            ev.start()
            print(f"oracle ready in {ev.info.startup_s:.1f} s: {ev.hardware} "
                  f"(batch {ev.batch_size}, {ev.optimizer}, {ev.precision}); compute {ev.parts['compute']}, "
                  f"communication {ev.parts['comm']}")
            note = getattr(ev, "domain_note", lambda *a: None)(
                [dataset.tables[i] for i in sorted({i for t in tasks for i in t.table_ids})])
            if note:
                print(note)

            setting = pricing(ev)   # what the costs depend on besides the plans, so that a reader compares like with like

            def show_and_mark(result, task):
                if result.measured is not None:
                    result.extra.update(hardware=result.measured.hardware, parts=result.measured.parts,
                                        batch_size=ev.batch_size, pricing={**setting, "oracle": result.measured.hardware})
                show(result, task)

            with tqdm(total=len(tasks) * len(sharders), desc="measuring", unit="plan", disable=None) as bar:
                results = evaluate(tasks, dataset.tables, sharders, topology, oracle=ev, on_result=show_and_mark,
                                   progress=bar, repeats=args.repeats)
            hardware, noise_pct = ev.hardware, ev.info.noise_pct
        task_set = args.task_set or f"{os.path.basename(os.path.dirname(os.path.abspath(args.task_path)))}/" \
                                    f"{os.path.basename(args.task_path)} ({ndevices})"
        print()
        print(f"costs on: {hardware}, batch {ev.batch_size}")
        summary = report.summarize(results, task_set)   # the statistics, computed once
        print(report.summary_table(summary))
        print()
        verdict = report.noise_verdict(summary, noise_pct)
        if verdict:
            print(verdict)
        print(report.paper_table(summary, bold=not verdict))
        print()
        print(type_counts_text(results))
        refined = [r.extra["shardkit_measurements"] for r in results if "shardkit_measurements" in r.extra]
        if any(refined):
            print(f"shardkit's measured refinement: {sum(refined)} plan measurements over {len(refined)} tasks "
                  f"(up to {max(r.extra.get('shardkit_refine_k', 0) for r in results)} per task)")
    if args.export_torchrec:
        from shardcore.interop.plan_export import PlanRecord, export_plans

        from shardcore.dataset import table_names
        from shardcore.interop.plan_export import default_names

        named = table_names(args.data_dir)   # the tables' own names where the configs give them

        def names_of(tables):
            return [named[t.index] if t.index in named and k == 0 else d
                    for t, d, k in zip(tables, default_names(tables), _repeat_counts(tables))]

        records = [PlanRecord(r.task, r.alg, r.plan(), names_of(tasks[r.task].tables(dataset.tables)))
                   for r in results]
        paths = export_plans(args.export_torchrec, records, args.max_memory, args.weights_precision)
        print(f"exported {len(paths) - 1} plan files to {args.export_torchrec}/ (index.json lists them)")
    if args.out:
        stamp = produced_by("eval.py", None if args.plan_only else hardware)   # an oracle's costs, never predicted
        with atomic_open(args.out) as fh:
            for r in results:
                fh.write(json.dumps({**r.to_json(), PRODUCED_BY: stamp}) + "\n")
        print(f"wrote {len(results)} records to {args.out}")


if __name__ == "__main__":
    run_main(main)
