#!/usr/bin/env python3
"""Plan your own embedding tables with one or more planners, compare them on a cost oracle, write the plan.

  python plan.py --tables my_tables.csv --ndevices 8 --max-memory 40 --batch-size 65536 \\
      --alg size_lookup_greedy,torchrec,shardkit --oracle emulated:h200 --out plan.json --torchrec
  python plan.py --tables my_tables.csv --ndevices 4 --max-memory 16 --alg lookup_greedy --out plan.json

--tables is a CSV with columns name, rows, dim, pooling_factor (optional: bin_0 .. bin_16, the access-reuse
histogram: of a table's distinct rows in one batch, the share looked up once, twice, 3-4 times, ...; a line
"# batch_size: B" states the batch the statistics were taken at) or a table_configs.json ({"tables": [{"row",
"dim", "pooling_factor", ...}], "batch_size": B}; names default to table_<index>). --alg takes one or more
(comma-separated) of: a baseline (random, naive, dim_greedy, size_greedy, lookup_greedy, size_lookup_greedy),
torchrec (TorchRec's planner; needs TorchRec), torchrec-tw, torchrec-emu, shardkit, a learned method's name or
a trained checkpoint.

With --oracle every plan is priced on that oracle (emulated:h200: an NVIDIA H200 emulated from real
measurements, which needs only the tables and the batch; measured: this machine, for a dataset's
table_configs.json with its data.pt beside it) and the plans are printed side by side, cheapest first; --out
writes the cheapest (or --pick ALG). Without --oracle each plan is summarised by its lookup load (dim x pooling
factor per device), a hardware-free proxy. --out writes the plan as JSON; --torchrec also writes
<out>.torchrec.json, which shardcore.interop.plan_export.load_torchrec_plan turns into TorchRec's ShardingPlan
(docs/planning-your-tables.md).
"""

import argparse
import dataclasses
from pathlib import Path


from shardcore.cli import algorithms
from shardcore.data.user_tables import read_batch_size, read_tables
from shardcore.cli.common import (add_device_args, add_memory_args, device_ids, num_devices, planning_context, run_main,
                                  topology_of)
from shardcore.argtypes import name_list, nonnegative_float, nonnegative_int, positive_float
from shardcore.oracles.commmodel import (DEFAULT_COMM_BANDWIDTH_GBPS, DEFAULT_COMM_LATENCY_US,
                                        DEFAULT_INTER_HOST_BANDWIDTH_GBPS, DEFAULT_INTER_HOST_LATENCY_US)
from shardcore.errors import ShardError
from shardcore.oracles.factory import batch_size_int
from shardcore.evaluation.compare import lookup_load
from shardcore.io import write_json
from shardcore.evaluation.report import format_table
from shardcore.interop.plan_export import plan_json, torchrec_path_for, torchrec_plan_json
from shardcore.interop.memory import EXACT_SGD
from shardcore.planning import DEFAULT_BATCH_SIZE, EMULATOR_FITS, HELDOUT, MEASURED, parse_landscape
from shardkit_torchrec.torchrec_memory import compare_memory
from shardcore.cli import common as cli
from shardcore.cli.common import ArgumentParser as OneLineParser
from shardcore.argtypes import seed_int

def check_fits(tables, names, topology):
    """A planner that places whole tables only needs every table to fit one device: the largest that
    does not is named."""
    precision = topology.precision
    for t, n in sorted(zip(tables, names), key=lambda x: -x[0].memory_gb(precision))[:1]:
        need = t.memory_gb(precision)
        if not topology.holds(need):
            raise ShardError(f"table {n!r} ({t.row} x {t.dim}, {need:.3f} GiB in {precision}) is larger than "
                             f"the {topology.max_memory_gb:g} GiB per-device memory cap: no plan of these planners can hold it "
                             "(raise --max-memory, or add shardkit or torchrec to --alg: they split a table over devices)")


def summary(names, plan, devices, device_costs_ms=None):
    """Where each table went: per device its tables or blocks, memory and, priced (``device_costs_ms``,
    the oracle's four parts per device), its cost parts; else its lookup load, a hardware-free proxy."""
    from shardcore.costs import COST_PARTS

    max_memory_gb = plan.topology.max_memory_gb
    mem = plan.device_memory_gb()
    load = lookup_load(plan)
    mean = sum(load) / len(load) if load else 0.0
    rows = []
    # a name per piece: a split table's pieces are named by what they hold
    tags = {"table_wise": "", "column_wise": " [cols]", "row_wise": " [rows]", "data_parallel": " [replica]",
            "grid": " [grid]"}
    pieces, replicated = [], []
    for n, t, s in zip(names, plan.tables, plan.shardings):
        pieces += [None if s.type == "data_parallel" else n + tags[s.type]] * len(s.pieces(t, plan.ndevices))
        if s.type == "data_parallel":   # on every device: named once, below the table
            replicated.append(n)
    for d, shard in enumerate(plan.device_positions):
        shown = ", ".join(pieces[i] for i in shard if pieces[i] is not None)
        if len(shown) > 100:
            shown = shown[:97] + "..."
        if device_costs_ms is None:
            work = [f"{load[d]:.1f}", f"{load[d] / mean:.3f}" if mean > 0 else "-"]
        else:
            work = [f"{c:.3f}" for c in device_costs_ms[d]] + [f"{sum(device_costs_ms[d]):.3f}"]
        rows.append([devices[d], len(shard), f"{mem[d]:.3f}", f"{100 * mem[d] / max_memory_gb:.1f}%"] + work + [shown])
    work = (["lookup load (dim x pf)", "load / mean"] if device_costs_ms is None
            else [f"{p} ms" for p in COST_PARTS] + ["total ms"])
    table = format_table(["device", "tables or blocks", "memory GiB", "of cap"] + work + ["names"], rows)
    if replicated:
        table += f"\nreplicated on every device (data-parallel): {', '.join(replicated)}"
    imb = max(load) / mean if mean > 0 else 1.0
    return table, imb, max(mem)


# planners whose plan depends on the batch (TorchRec's planners and shardkit price lookups per batch)
BATCH_PLANNERS = ("torchrec", "torchrec-tw", "torchrec-emu", "shardkit", "shardkit-tw")
# planners that may split a table larger than the per-device cap by rows
ROW_SPLITTERS = ("torchrec", "torchrec-emu", "shardkit")


def build_parser():
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tables", required=True, metavar="FILE",
                   help="CSV (name,rows,dim,pooling_factor[,bin_0..bin_16]; a line '# batch_size: B' states the "
                        "batch) or table_configs.json (a 'batch_size' key states the batch)")
    add_device_args(p)
    add_memory_args(p)
    p.add_argument("--alg", default="lookup_greedy", type=name_list, metavar="ALGS",
                   help="one or more planners, comma-separated: random, naive, dim_greedy, size_greedy, lookup_greedy, "
                        "size_lookup_greedy, torchrec (TorchRec's planner, every sharding type: table-, column-, "
                        "row-wise, data-parallel), torchrec-tw (table-wise only), torchrec-emu (TorchRec's planner "
                        "priced by the emulated H200), shardkit (shardkit's own planner: every sharding type, cost "
                        "model and local search), shardkit-tw (its search, table-wise only), a learned method's name or a trained checkpoint (default "
                        "lookup_greedy)")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the random baseline (default 0)")
    p.add_argument("--batch-size", type=batch_size_int, default=None, metavar="B",
                   help="the global batch the plans are made and priced for (default: the tables file's batch_size; "
                        f"without --oracle, {DEFAULT_BATCH_SIZE} for the planners that need one, said in a note). "
                        "With an --oracle it must be known: from the file or this flag")
    o = p.add_argument_group("pricing the plans (side by side)")
    o.add_argument("--oracle", default=None, metavar="NAME",
                   help="price every plan on this oracle and print them side by side: emulated:h200 (an NVIDIA H200 "
                        "emulated from real measurements; needs only the tables and the batch), emulated:CARD.json (a "
                        "card tools/calibrate.py wrote of the hardware it ran on; docs/cards.md) or measured (this "
                        "machine's hardware: --tables must be a dataset's table_configs.json with its data.pt). "
                        "Default: none (a hardware-free lookup-load summary per plan)")
    o.add_argument("--pick", default=None, metavar="ALG",
                   help="the plan --out writes (default: the cheapest on --oracle; without --oracle the only --alg)")
    o.add_argument("--emulator-fit", default=HELDOUT, choices=EMULATOR_FITS,
                   help="which fit of the emulated GPU prices a plan (default heldout: never fitted on the plan's "
                        "own tables, if they were among the measured ones; devices: never fitted on a device made "
                        "only of them; full: the shipped fit)")
    o.add_argument("--comm-bandwidth", type=positive_float, default=DEFAULT_COMM_BANDWIDTH_GBPS, metavar="GB/S",
                   help="modelled all-to-all bandwidth per device and direction on an emulated oracle (default "
                        f"{DEFAULT_COMM_BANDWIDTH_GBPS:g}: NVLink 4 within one 8-GPU node, assumed)")
    o.add_argument("--comm-latency", type=nonnegative_float, default=DEFAULT_COMM_LATENCY_US, metavar="US",
                   help=f"modelled start-up of one all-to-all in microseconds (default {DEFAULT_COMM_LATENCY_US:g})")
    o.add_argument("--devices-per-host", type=nonnegative_int, default=0, metavar="G",
                   help="devices per host: with more devices than G they form hosts of G (device d on host d // G), "
                        "every modelled exchange runs on two levels, and shardkit and TorchRec (local_world_size) "
                        "plan for the same hosts (default 0: one host)")
    o.add_argument("--inter-host-bandwidth", type=positive_float, default=DEFAULT_INTER_HOST_BANDWIDTH_GBPS,
                   metavar="GB/S", help="modelled bandwidth between hosts per device and direction (default "
                                        f"{DEFAULT_INTER_HOST_BANDWIDTH_GBPS:g}: 8 x 400 Gb/s NICs per 8-GPU host, "
                                        "assumed); only with --devices-per-host")
    o.add_argument("--inter-host-latency", type=nonnegative_float, default=DEFAULT_INTER_HOST_LATENCY_US, metavar="US",
                   help="modelled start-up of an exchange between hosts in microseconds (default "
                        f"{DEFAULT_INTER_HOST_LATENCY_US:g}, assumed); only with --devices-per-host")
    o.add_argument("--cache-path", default=None, metavar="FILE",
                   help="measurement cache of --oracle measured (default data/cost_cache.sqlite)")
    algorithms.add_planner_args(p, measuring=False)   # each planner's own flags: --shardkit-time, --torchrec-time, ...
    p.add_argument("--out", default=None, metavar="PLAN.json", help="write the plan as JSON (atomically)")
    p.add_argument("--torchrec", action="store_true",
                   help="also write the TorchRec-loadable form beside --out (PLAN.torchrec.json)")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="with --oracle: draw the compared plans side by side (per planner one stacked bar per "
                        "device: forward compute, forward and backward exchange, backward compute; below it each "
                        "device's memory with the cap as a line), a PNG written atomically")
    p.add_argument("--torchrec-module", default="", metavar="FQN",
                   help="where the EmbeddingBagCollection sits in your model, for the TorchRec form "
                        "(default '': the model is the collection)")
    return p


def no_reuse_warning(tables, names) -> str | None:
    """One line naming the tables without reuse statistics and what is assumed for them."""
    missing = [n for t, n in zip(tables, names) if not any(t.bins) and t.pooling_factor > 0]
    if not missing:
        return None
    shown = ", ".join(missing[:6]) + (f", ... ({len(missing)} in all)" if len(missing) > 6 else "")
    return (f"warning: {len(missing)} of {len(tables)} tables have no reuse statistics (bin_0..bin_16): {shown}; "
            "they are priced as if every lookup in a batch hit a different row (at most the table's rows), "
            "which overstates their cost if some rows are hot")


def _dataset_dir_of(path: Path, tables) -> Path | None:
    """The dataset directory when ``--tables`` is a dataset's own table_configs.json (tables 0..T-1)."""
    if path.name != "table_configs.json":
        return None
    if [t.index for t in tables] != list(range(len(tables))):
        return None
    return path.parent


def open_pricing_oracle(args, tables, batch, ndevices, devices, workdir):
    """The oracle of ``--oracle`` for these tables and the data directory the planners are given."""
    from shardcore.oracles.commmodel import CommModel, comm_kwargs
    from shardcore.dataset import save_table_configs
    from shardcore.oracles.factory import open_oracle

    spec = parse_landscape(args.oracle)
    dataset_dir = _dataset_dir_of(Path(args.tables), tables)
    comm = CommModel.of(**comm_kwargs(args))
    if spec == MEASURED:
        if dataset_dir is None or not (dataset_dir / "data.pt").is_file():
            raise ShardError("--oracle measured measures lookups, which a tables file does not hold: give a dataset's "
                             "table_configs.json with its data.pt beside it (tools/gen_dlrm_data.py), or price on "
                             "--oracle emulated:h200")
        oracle = open_oracle(dataset_dir, ndevices, oracle=MEASURED, device_ids=devices, batch_size=batch,
                             precision=args.weights_precision, comm_model=comm, cache=args.cache_path or True)
        return oracle, str(dataset_dir)
    if dataset_dir is None:   # the emulated oracle reads table configs: write them, with the batch
        dataset_dir = Path(workdir)
        save_table_configs(dataset_dir / "table_configs.json", tables, batch)
    return open_oracle(dataset_dir, ndevices, oracle=spec, batch_size=batch, precision=args.weights_precision,
                       comm_model=comm, emulator_fit=args.emulator_fit), str(dataset_dir)


def side_by_side(results, best_alg) -> str:
    """One row per planner, cheapest first: the plan cost (slowest device), its four parts, memory,
    sharding types, planning time."""
    from shardcore.costs import COST_PARTS
    from shardcore.oracles.measured.shardings import TYPE_ABBREV

    ok = sorted((r for r in results if r.cost_ms is not None), key=lambda r: r.cost_ms)
    best = ok[0].cost_ms if ok else None
    rows = []
    for r in ok + [r for r in results if r.cost_ms is None]:
        if r.cost_ms is None:
            rows.append([r.alg, "-", "-", "-", "-", "-", r.error or "infeasible", f"{r.planning_seconds:.2f}"])
            continue
        slow = max(range(len(r.device_costs_ms)), key=lambda d: sum(r.device_costs_ms[d]))
        parts = " / ".join(f"{c:.3f}" for c in r.device_costs_ms[slow])
        counts: dict = {}
        for s in r.shardings or []:
            counts[s["type"]] = counts.get(s["type"], 0) + 1
        types = ", ".join(f"{TYPE_ABBREV.get(k, k)} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
        mark = " *" if r.alg == best_alg else ""
        rows.append([r.alg + mark, f"{r.cost_ms:.3f}", f"{100 * (r.cost_ms / best - 1):+.1f}%" if best else "-",
                     parts, f"{max(r.memory_gb):.3f}", f"{max(r.memory_gb) / r.max_memory_gb * 100:.0f}%", types,
                     f"{r.planning_seconds:.2f}"])
    return format_table(["planner", "cost ms", "vs best", f"slowest device: {' / '.join(COST_PARTS)} ms",
                         "max memory GiB", "of cap", "sharding types", "planning s"], rows)


def keep_torchrec_expressible(sharder, ndevices: int) -> None:
    """shardkit's search kept to what TorchRec applies on one host (``--torchrec``): a row-wise table over
    every rank in rank order, never over a subset (shardkit_torchrec's cost model; without TorchRec
    installed, no row-wise tables at all)."""
    try:
        from shardkit_torchrec.planner import TorchRecCostModel
    except Exception:   # noqa: BLE001 - TorchRec missing or broken: the plain file can still be written
        sharder.types = tuple(t for t in sharder.types if t != "row_wise")
        return
    sharder.model_factory = dataclasses.replace(sharder.model_factory,
                                                wrap=lambda model: TorchRecCostModel.wrap(model, ndevices))


def torchrec_problem(names, plan) -> str | None:
    """Why TorchRec cannot apply ``plan`` on its topology's hosts (one where it has none), None when it
    can (plan_export.torchrec_problem: row-wise over every rank or one host's, grid blocks one host each)."""
    from shardcore.interop.plan_export import torchrec_problem as problem

    for n, s in zip(names, plan.shardings):
        why = problem(s, plan.ndevices, plan.topology.devices_per_host or plan.ndevices)
        if why:
            return f"table {n!r}: {why}"
    return None


def main(argv=None):
    return plan_tables(build_parser().parse_args(argv))


def check_batch(args, tables, file_batch: int | None) -> None:
    """Reuse statistics (bin_0..bin_16, length_cv) hold for the batch they were taken at: a --batch-size
    other than the one the tables file states would price them at a batch they do not describe."""
    if file_batch is None or args.batch_size is None or args.batch_size == file_batch:
        return
    if any(any(t.bins) or t.length_cv is not None for t in tables):
        raise ShardError(f"--batch-size {args.batch_size}: {args.tables} states its reuse statistics (bin_*, "
                         f"length_cv) were taken at batch {file_batch}, and they differ at another batch; plan for "
                         f"--batch-size {file_batch}, or take the statistics at {args.batch_size}")


def plan_tables(args):
    """The command; its temporary folder (the tables' configs for the emulated oracle) goes with the run, on
    SIGTERM too (run_main turns it into an exception that unwinds)."""
    import tempfile

    from shardcore.evaluation.compare import evaluate
    from shardcore.tasks import Task

    algs = list(args.alg)
    if args.torchrec and not args.out:
        raise ShardError("--torchrec writes beside the plan: give --out PLAN.json too")
    if args.pick is not None and args.pick not in algs:
        raise ShardError(f"--pick {args.pick}: not among --alg ({', '.join(algs)})")
    if args.out and len(algs) > 1 and args.oracle is None and args.pick is None:
        raise ShardError("several --alg and --out: say which plan to write with --pick ALG, or price them with "
                         "--oracle emulated:h200 to write the cheapest")
    if args.plot is not None and args.oracle is None:
        raise ShardError("--plot draws the plans' costs: price them with --oracle (e.g. emulated:h200)")
    cli.check_outputs(args, {"--out": args.out, "--torchrec": torchrec_path_for(args.out) if args.out and args.torchrec
                             else None, "--plot": args.plot}, {"--plot": "a PNG image"})
    devices = device_ids(args)
    ndevices = num_devices(args)
    # the plan's devices by their ids where --gpu-devices names each; more plan devices (--ndevices) than
    # ids are measured in turns on those: then the plan's own numbers 0..N-1
    labels = devices if len(devices) == ndevices else list(range(ndevices))
    tables, names = read_tables(args.tables)
    file_batch = read_batch_size(args.tables)
    check_batch(args, tables, file_batch)
    batch = args.batch_size or file_batch
    needs_batch = [a for a in algs if a in BATCH_PLANNERS]
    if args.oracle is not None and batch is None:
        if parse_landscape(args.oracle) != MEASURED:
            raise ShardError(f"--oracle {args.oracle} prices lookups per batch and the batch is not known: give "
                             "--batch-size B (the global batch your model trains with) or a batch_size in the tables "
                             "file" + (f" ({', '.join(needs_batch)} plan for it too)" if needs_batch else ""))
    topology = topology_of(args, ndevices)
    if not any(a in ROW_SPLITTERS for a in algs):   # TorchRec's and shardkit's planners may split a table by rows
        check_fits(tables, names, topology)
    topology.check_fits(tables)   # all devices' memory together
    warning = no_reuse_warning(tables, names) if (args.oracle or needs_batch) else None
    if warning:
        print(warning)
    # planners and oracles see the tables at their positions 0..n-1 (a plan is by position)
    positions = [dataclasses.replace(t, index=k) for k, t in enumerate(tables)]
    with tempfile.TemporaryDirectory(prefix="plan-") as workdir:
        if args.oracle is None:
            if needs_batch and batch is None:
                batch = DEFAULT_BATCH_SIZE
                print(f"note: {', '.join(needs_batch)} plan for batch {batch}, assumed (give --batch-size B or a "
                      "batch_size in the tables file for yours)")
            oracle, data_dir = None, None
        else:
            oracle, data_dir = open_pricing_oracle(args, tables, batch, ndevices, devices, workdir)
        # one context for every planner: the landscape that prices the plans (none without --oracle)
        ctx = planning_context(args, topology, batch, oracle=args.oracle, data_dir=data_dir)
        configs = algorithms.planner_configs(args)
        sharders = {a: algorithms.build(a, ctx, configs) for a in algs}
        if args.torchrec and "shardkit" in sharders:
            keep_torchrec_expressible(sharders["shardkit"], ndevices)
        task = [Task(tuple(t.index for t in positions))]
        if oracle is None:
            results = evaluate(task, positions, sharders, topology)
            hardware = None
        else:
            algorithms.attach_oracle(sharders.values(), oracle)   # checked before any worker starts
            with oracle as ev:
                ev.start()
                results = evaluate(task, positions, sharders, topology, oracle=ev)
                hardware, batch = ev.hardware, ev.batch_size
    if oracle is None and len(algs) == 1 and not results[0].feasible:
        raise ShardError(results[0].error or f"infeasible: {algs[0]} found no plan")

    print(f"{len(tables)} tables from {args.tables} on {ndevices} devices, cap {args.max_memory:g} GiB "
          f"({args.weights_precision}), alg {', '.join(algs)}")
    feasible = [r for r in results if r.feasible]
    if not feasible:
        raise ShardError("no planner found a feasible plan: " + "; ".join(f"{r.alg}: {r.error}" for r in results))
    if oracle is not None:
        ranked = sorted((r for r in feasible if r.cost_ms is not None), key=lambda r: r.cost_ms)
        chosen = next(r for r in results if r.alg == args.pick) if args.pick else ranked[0]
        print(f"priced on: {hardware}, batch {batch} ({args.weights_precision} weights); cost = the slowest "
              "device's forward + backward, compute and exchange")
        note = getattr(oracle, "domain_note", lambda *a: None)(positions, names)
        if note:
            print(note)
        print(side_by_side(results, chosen.alg))
        print(f"* the plan written: {chosen.alg}" + ("" if args.pick else " (the cheapest)"))
    else:
        chosen = next(r for r in results if r.alg == (args.pick or algs[0]))
    if not chosen.feasible:
        raise ShardError(f"--pick {chosen.alg}: {chosen.error}")
    plan = dataclasses.replace(chosen.plan(), tables=tuple(tables))   # the tables as the file names them
    why = torchrec_problem(names, plan) if args.torchrec else None
    if why:
        raise ShardError(f"--torchrec: {chosen.alg}'s plan cannot be applied by TorchRec: {why}; --pick another planner")
    table, imb, worst = summary(names, plan, labels, chosen.device_costs_ms if oracle is not None else None)
    if oracle is None:
        for r in results:
            if r is not chosen:
                print(f"{r.alg}: " + ("feasible" if r.feasible else r.error or "infeasible"))
    else:
        print(f"where each table went in {chosen.alg}'s plan (its cost parts as priced above):")
    print(table)
    print(f"feasible: max device memory {worst:.3f} GiB of {args.max_memory:g} GiB; "
          f"lookup-load imbalance (max / mean) {imb:.3f}")
    print(compare_memory(plan, batch, getattr(args, "optimizer", None) or EXACT_SGD, names,
                         topology.devices_per_host or None, devices).text(format_table))
    if args.plot:
        from shardcore.evaluation.plots import plot_plans

        shown = sorted(results, key=lambda r: (r.cost_ms is None, r.cost_ms or 0.0))
        plot_plans([(r.alg, r.device_costs_ms, r.memory_gb, r.cost_ms, r.error) for r in shown], args.plot,
                   args.max_memory, title=f"{len(tables)} tables of {Path(args.tables).name} on {ndevices} devices, "
                                          f"cap {args.max_memory:g} GiB, priced on {hardware.split(' (')[0]}, batch {batch}")
        print(f"wrote {args.plot}")
    if args.out:
        meta = {"alg": chosen.alg}
        if oracle is not None:
            meta.update(cost_ms=round(chosen.cost_ms, 6), priced_on=hardware, batch_size=batch)
        write_json(args.out, plan_json(plan, names, device_ids=devices if labels is devices else None, **meta))
        print(f"wrote {args.out}")
        if args.torchrec:
            path = torchrec_path_for(args.out)
            write_json(path, torchrec_plan_json(plan, names, module_path=args.torchrec_module,
                                                local_world_size=topology.devices_per_host or None))
            print(f"wrote {path} (TorchRec: shardcore.interop.plan_export.load_torchrec_plan)")
    return 0


if __name__ == "__main__":
    run_main(main)
