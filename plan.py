#!/usr/bin/env python3
"""Shard your own embedding tables and write the plan.

  python plan.py --tables my_tables.csv --ndevices 4 --max-memory 16 --alg lookup_greedy --out plan.json
  python plan.py --tables data/dlrm_datasets/table_configs.json --gpu-devices 0,1 --alg torchrec --out plan.json --torchrec

--tables is a CSV with columns name, rows, dim, pooling_factor (optional: bin_0 .. bin_16, the access-reuse
histogram that learned models read) or a table_configs.json ({"tables": [{"row", "dim", "pooling_factor", ...}]};
names default to table_<index>). --alg is a baseline (random, naive, dim_greedy, size_greedy, lookup_greedy,
size_lookup_greedy), torchrec (TorchRec's planner; needs TorchRec installed), or a trained model's checkpoint.
The summary's lookup load (dim x pooling factor per device) is a hardware-free proxy of each device's work;
eval.py measures plans on hardware. --out writes the plan as JSON; --torchrec also writes
<out>.torchrec.json, which shardcore.plan_export.load_torchrec_plan turns into TorchRec's ShardingPlan.
"""

import argparse
import csv
import json
import math
from pathlib import Path


from shardcore import algorithms
from shardcore.cli import (add_device_args, add_memory_args, device_ids, num_devices, positive_int,
                           run_main)
from shardcore.errors import ShardError
from shardcore.compare import lookup_load
from shardcore.io import check_output_file, read_text, write_json
from shardcore.report import format_table
from shardcore.tables import BIN_NAMES, NUM_BINS, TableConfig, dim_problem
from shardcore.plan_export import plan_json, torchrec_path_for, torchrec_plan_json
from shardcore import cli
from shardcore.cli import ArgumentParser as OneLineParser, seed_int

REQUIRED_COLUMNS = ("name", "rows", "dim", "pooling_factor")


def _number(text, kind, what, where):
    """Parse one cell; ``kind`` is int or float. Raises a one-line ShardError."""
    s = "" if text is None else str(text).strip()
    if s == "":
        raise ShardError(f"{where}: empty {what}")
    try:
        v = float(s)
    except ValueError:
        raise ShardError(f"{where}: non-numeric {what} {s!r}") from None
    if not math.isfinite(v):
        raise ShardError(f"{where}: non-numeric {what} {s!r}")
    if kind is int:
        if v != int(v):
            raise ShardError(f"{where}: {what} must be a whole number, got {s!r}")
        v = int(v)
    return v


def _make_table(index, rows, dim, pf, bins, where):
    if rows <= 0 or dim <= 0:
        raise ShardError(f"{where}: rows and dim must be positive (got rows={rows}, dim={dim})")
    if pf < 0:
        raise ShardError(f"{where}: pooling_factor must be >= 0, got {pf}")
    if dim_problem(dim):
        raise ShardError(f"{where}: {dim_problem(dim)}")
    return TableConfig(index=index, row=rows, dim=dim, pooling_factor=float(pf), bins=tuple(bins))


def _check_duplicates(names, wheres):
    seen = {}
    for n, w in zip(names, wheres):
        if n in seen:
            raise ShardError(f"{w}: duplicate table name {n!r} (first at {seen[n]})")
        seen[n] = w


def read_tables_csv(path: Path):
    """``name, rows, dim, pooling_factor[, bin_0 .. bin_16]`` -> (tables, names)."""
    text = read_text(path, "CSV or JSON tables file")
    if not text.strip():
        raise ShardError(f"{path}: empty file (expected a header: {', '.join(REQUIRED_COLUMNS)})")
    reader = csv.DictReader(text.splitlines())
    header = [h.strip() for h in (reader.fieldnames or [])]
    reader.fieldnames = header
    aliases = {"row": "rows"}
    cols = {aliases.get(h, h): h for h in header}
    missing = [c for c in REQUIRED_COLUMNS if c not in cols]
    if missing:
        raise ShardError(f"{path}: missing column(s) {', '.join(missing)} (header: {', '.join(header)}; "
                         f"required: {', '.join(REQUIRED_COLUMNS)})")
    bin_cols = [b for b in BIN_NAMES if b in cols]
    tables, names, wheres = [], [], []
    for lineno, row in enumerate(reader, start=2):
        if all((v is None or str(v).strip() == "") for v in row.values()):
            continue
        where = f"{path}:{lineno}"
        if None in row:  # more cells than header columns
            raise ShardError(f"{where}: {len(header) + len(row[None])} values for {len(header)} columns")
        name = (row[cols["name"]] or "").strip()
        if not name:
            raise ShardError(f"{where}: empty table name")
        where = f"{where} (table {name!r})"
        rows = _number(row[cols["rows"]], int, "rows", where)
        dim = _number(row[cols["dim"]], int, "dim", where)
        pf = _number(row[cols["pooling_factor"]], float, "pooling_factor", where)
        bins = [0.0] * NUM_BINS
        for b in bin_cols:
            cell = row[cols[b]]
            if cell is not None and str(cell).strip() != "":
                bins[BIN_NAMES.index(b)] = _number(cell, float, b, where)
        tables.append(_make_table(len(tables), rows, dim, pf, bins, where))
        names.append(name)
        wheres.append(f"{path}:{lineno}")
    if not tables:
        raise ShardError(f"{path}: no tables (only a header)")
    _check_duplicates(names, wheres)
    return tables, names


def read_tables_json(path: Path):
    """A table_configs.json; each entry may carry a ``name`` (default ``table_<index>``) and may use
    ``rows`` for ``row``; a missing ``index`` is the entry's position."""
    text = read_text(path, "CSV or JSON tables file")
    if not text.strip():
        raise ShardError(f"{path}: empty file (expected {{\"tables\": [...]}})")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ShardError(f"{path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    entries = obj.get("tables") if isinstance(obj, dict) else obj
    if not isinstance(entries, list):
        raise ShardError(f'{path}: expected an object with a "tables" list')
    if not entries:
        raise ShardError(f"{path}: no tables")
    tables, names, wheres = [], [], []
    for k, entry in enumerate(entries):
        where = f"{path}: tables[{k}]"
        if not isinstance(entry, dict):
            raise ShardError(f"{where}: expected an object, got {type(entry).__name__}")
        entry = dict(entry)
        if "row" not in entry and "rows" in entry:
            entry["row"] = entry["rows"]
        entry.setdefault("index", k)
        missing = [c for c in ("row", "dim", "pooling_factor") if c not in entry]
        if missing:
            raise ShardError(f"{where}: missing field(s) {', '.join(missing)}")
        index = _number(entry["index"], int, "index", where)
        rows = _number(entry["row"], int, "row", where)
        dim = _number(entry["dim"], int, "dim", where)
        pf = _number(entry["pooling_factor"], float, "pooling_factor", where)
        bins = [_number(entry.get(b, 0.0), float, b, where) for b in BIN_NAMES]
        tables.append(_make_table(index, rows, dim, pf, bins, where))
        names.append(str(entry.get("name", f"table_{index}")))
        wheres.append(where)
    _check_duplicates(names, wheres)
    return tables, names


def read_tables(path):
    path = Path(path)
    if not path.is_file():
        raise ShardError(f"tables file not found: {path}")
    if path.suffix.lower() == ".json":
        return read_tables_json(path)
    return read_tables_csv(path)


def check_fits(tables, names, max_memory_gb, precision):
    for t, n in zip(tables, names):
        need = t.memory_gb(precision)
        if need > max_memory_gb + 1e-12:
            raise ShardError(f"table {n!r} ({t.row} x {t.dim}, {need:.3f} GB in {precision}) is larger than "
                             f"the {max_memory_gb:g} GB per-device memory cap: no plan can hold it "
                             "(raise --max-memory, or split the table)")


def summary(tables, names, plan, devices, max_memory_gb, precision):
    mem = plan.device_memory_gb(tables, precision)
    load = lookup_load(tables, plan)
    mean = sum(load) / len(load) if load else 0.0
    rows = []
    # a name per piece: a split table's pieces are named by what they hold
    tags = {"table_wise": "", "column_wise": " [cols]", "row_wise": " [rows]", "data_parallel": " [replica]"}
    pieces = []
    for n, t, s in zip(names, tables, plan.table_shardings(tables)):
        pieces += [n + tags[s.type]] * len(s.pieces(t, plan.ndevices))
    for d, shard in enumerate(plan.shards):
        shown = ", ".join(pieces[i] for i in shard)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        rows.append([devices[d], len(shard), f"{mem[d]:.3f}", f"{100 * mem[d] / max_memory_gb:.1f}%",
                     f"{load[d]:.1f}", f"{load[d] / mean:.3f}" if mean > 0 else "-", shown])
    table = format_table(["device", "tables", "memory GB", "of cap", "lookup load (dim x pf)", "load / mean",
                          "names"], rows)
    imb = max(load) / mean if mean > 0 else 1.0
    return table, imb, max(mem)


def build_parser():
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tables", required=True, metavar="FILE",
                   help="CSV (name,rows,dim,pooling_factor[,bin_0..bin_16]) or table_configs.json")
    add_device_args(p)
    add_memory_args(p)
    p.add_argument("--alg", default="lookup_greedy",
                   help="random, naive, dim_greedy, size_greedy, lookup_greedy, size_lookup_greedy, torchrec "
                        "(TorchRec's planner, every sharding type: table-, column-, row-wise, data-parallel), "
                        "torchrec-tw (table-wise only), shardkit (shardkit's own planner: every sharding type, cost model "
                        "and local search), or a trained model's checkpoint (default lookup_greedy)")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the random baseline (default 0)")
    p.add_argument("--batch-size", type=positive_int, default=None, metavar="B",
                   help="batch size TorchRec's planner or shardkit's cost model assumes (--alg torchrec / torchrec-tw / "
                        "shardkit only; default 4096)")
    sk = p.add_argument_group("shardkit (--alg shardkit)")
    sk.add_argument("--shardkit-oracle", default="emulated:h200", choices=["emulated:h200", "measured"],
                    help="the landscape shardkit plans for: emulated:h200 (default; the emulator's model, needs "
                         "nothing else) or measured (this machine's fitted model, models/shardkit/cpu_cost_model.json "
                         "or --shardkit-model)")
    algorithms.add_plugin_args(p, measuring=False, groups={"shardkit": sk})   # --shardkit-time, ...
    p.add_argument("--out", default=None, metavar="PLAN.json", help="write the plan as JSON (atomically)")
    p.add_argument("--torchrec", action="store_true",
                   help="also write the TorchRec-loadable form beside --out (PLAN.torchrec.json)")
    p.add_argument("--torchrec-module", default="", metavar="FQN",
                   help="where the EmbeddingBagCollection sits in your model, for the TorchRec form "
                        "(default '': the model is the collection)")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.torchrec and not args.out:
        raise ShardError("--torchrec writes beside the plan: give --out PLAN.json too")
    if args.out:
        check_output_file(args.out, "--out")
        if args.torchrec:
            check_output_file(torchrec_path_for(args.out), "--torchrec")
        cli.check_outputs(args, {"--out": args.out, "--torchrec": torchrec_path_for(args.out) if args.torchrec else None})
    devices = device_ids(args)
    ndevices = num_devices(args)
    tables, names = read_tables(args.tables)
    if args.alg != "torchrec":   # TorchRec's full planner may split a table larger than the cap by rows
        check_fits(tables, names, args.max_memory, args.weights_precision)
    kwargs = {}
    if args.alg in ("torchrec", "torchrec-tw", "shardkit") and args.batch_size is not None:
        kwargs["batch_size"] = args.batch_size
    elif args.batch_size is not None:
        raise ShardError("--batch-size is for --alg torchrec / torchrec-tw / shardkit only")
    if args.alg == "shardkit":
        kwargs.update(oracle=args.shardkit_oracle, **algorithms.plugin_kwargs(args))
    sharder = algorithms.resolve(args.alg, seed=args.seed, **kwargs)
    plan = sharder.shard(tables, ndevices, args.max_memory, args.weights_precision)
    if not plan.is_feasible(tables, args.max_memory, args.weights_precision):
        raise ShardError(f"infeasible: {args.alg} put more than {args.max_memory:g} GB on a device")

    table, imb, worst = summary(tables, names, plan, devices, args.max_memory, args.weights_precision)
    print(f"{len(tables)} tables from {args.tables} on {ndevices} devices, cap {args.max_memory:g} GB "
          f"({args.weights_precision}), alg {args.alg}")
    print(table)
    print(f"feasible: max device memory {worst:.3f} GB of {args.max_memory:g} GB; "
          f"lookup-load imbalance (max / mean) {imb:.3f}")
    if args.out:
        write_json(args.out, plan_json(tables, plan, args.max_memory, args.weights_precision, names,
                                       device_ids=devices, alg=args.alg))
        print(f"wrote {args.out}")
        if args.torchrec:
            path = torchrec_path_for(args.out)
            write_json(path, torchrec_plan_json(tables, plan, names, args.weights_precision,
                                                module_path=args.torchrec_module))
            print(f"wrote {path} (TorchRec: shardcore.plan_export.load_torchrec_plan)")
    return 0


if __name__ == "__main__":
    run_main(main)
