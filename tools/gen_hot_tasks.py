#!/usr/bin/env python3
"""Make a task set in which every task holds one very hot, very large table.

  python tools/gen_hot_tasks.py --tasks data/dlrm_tasks_50/test.txt --out data/hot_tasks_50/test.txt

Each task of --tasks is copied with its first table replaced by the hot table (--hot-table, default:
the dataset's table with the most lookups per sample among those with more than --min-rows rows),
given dim --hot-dim (the other tables keep the dataset's dims, or the task's). The result is a
NeuroShard-style task file (`ids dims` per line) that every loader reads. No table-wise plan can put
less than that one table on a device: the cost floor that row-wise sharding (or replicas, for a
small table) is there to break.
"""

import argparse


from shardcore.cli.common import ArgumentParser as OneLineParser, check_out_file, run_main
from shardcore.argtypes import positive_int
from shardcore.dataset import DEFAULT_DATA_DIR, load_dataset
from shardcore.errors import ShardError
from shardcore.tables import dim_problem
from shardcore.tasks import Task, load_tasks, save_tasks


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", "--data_dir", default=DEFAULT_DATA_DIR,
                   help=f"processed dataset directory with table_configs.json (default {DEFAULT_DATA_DIR})")
    p.add_argument("--tasks", required=True, help="the task file to start from (one task per line)")
    p.add_argument("--out", required=True, help="the task file to write (atomically)")
    p.add_argument("--hot-table", type=int, default=None,
                   help="dataset id of the hot table (default: the most lookups per sample among tables "
                        "with more than --min-rows rows)")
    p.add_argument("--min-rows", type=positive_int, default=1_000_000,
                   help="what counts as very large when choosing the hot table (default 1000000 rows)")
    p.add_argument("--hot-dim", type=positive_int, default=128,
                   help="the hot table's dim in every task (a multiple of 4; default 128)")
    return p


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    problem = dim_problem(args.hot_dim)
    if problem:
        raise ShardError(f"--hot-dim: {problem}")
    check_out_file(args, args.out)   # never --tasks, the file it starts from
    dataset = load_dataset(args.data_dir, with_lookups=False)
    tables = dataset.tables
    if args.hot_table is None:
        big = [t for t in tables if t.row > args.min_rows]
        if not big:
            raise ShardError(f"no table of {dataset.path} has more than {args.min_rows} rows")
        hot = max(big, key=lambda t: (t.pooling_factor, t.row))
    else:
        if not 0 <= args.hot_table < len(tables):
            raise ShardError(f"--hot-table {args.hot_table} out of range: the dataset has {len(tables)} tables")
        hot = tables[args.hot_table]
    out = []
    for task in load_tasks(args.tasks, num_tables=len(tables)):
        ids = list(task.table_ids)
        dims = list(task.dims) if task.dims is not None else [tables[i].dim for i in ids]
        if hot.index in ids:   # already there: move it to the front
            k = ids.index(hot.index)
            ids.pop(k)
            dims.pop(k)
            ids.insert(0, hot.index)
            dims.insert(0, args.hot_dim)
        else:
            ids[0], dims[0] = hot.index, args.hot_dim
        out.append(Task(tuple(ids), tuple(dims)))
    save_tasks(args.out, out)
    print(f"wrote {len(out)} tasks to {args.out}: hot table {hot.index} ({hot.row} rows, "
          f"{hot.pooling_factor:.1f} lookups per sample) at dim {args.hot_dim} first in every task")


if __name__ == "__main__":
    run_main(main)
