#!/usr/bin/env python
"""Build a dataset directory (table_configs.json + data.pt) from Meta's raw dlrm_datasets file,
or from synthetic data of the same raw format and statistics when the real file is absent.

    python tools/gen_dlrm_data.py --data PATH/fbgemm_t856_bs65536.pt.gz --out-dir data/dlrm_datasets
    python tools/gen_dlrm_data.py --synthetic --out-dir data/dlrm_datasets
    python tools/gen_dlrm_data.py --synthetic --batch-size 65536 --out-dir data/dlrm_b65536   # for GPUs

On a GPU, measure at the full batch of 65536: at the default 4096 a shard's cost is launch-bound
(0.5-1.5 ms whatever its tables on an H200) and plans cannot be told apart. The full batch takes
about 92 s and 11.7 GB of memory to generate and writes a 3.8 GB data.pt.

Without --data or --synthetic it reads the original scripts' default raw path,
dlrm_datasets/embedding_bag/fbgemm_t856_bs65536.pt (or ../dlrm_datasets/..., AutoShard's), and
stops with the way forward when that file is absent. AutoShard's gen_dlrm_data.py flags work too:
--dim-range (= --dims) and its task flags (--T-range, --num-train, --num-test, --test-as-train,
--transfer, --transfer-ratio), which also write train.txt and test.txt into --out-dir as AutoShard did.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Sequence


from shardcore.data import dlrm
from shardcore.argtypes import int_list, positive_int, fraction, nonnegative_int, seed_int
from shardcore.cli.common import original_range, run_main
from shardcore.dataset import DEFAULT_DATA_DIR
from shardcore.errors import ShardError
from shardcore.oracles.factory import batch_size_int
from shardcore.cli.common import ArgumentParser as OneLineParser
from shardcore.cli.common import check_outputs
from shardcore.tables import dim_problem
from shardcore.tasks import save_tasks
from shardcore.data.taskgen import generate_transfer_tasks

# the raw file the original scripts read when --data is not given (DreamShard/NeuroShard, AutoShard)
ORIGINAL_DEFAULT_DATA = ("dlrm_datasets/embedding_bag/fbgemm_t856_bs65536.pt",
                         "../dlrm_datasets/embedding_bag/fbgemm_t856_bs65536.pt")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        description="Process a raw DLRM dataset (Meta's dlrm_datasets format: a torch.save'd tuple "
                    "(indices, offsets, lengths), optionally gzipped) into table_configs.json + data.pt, "
                    "or generate a synthetic one with the published statistics. For GPUs use "
                    "--batch-size 65536: at 4096 a GPU cannot tell plans apart.")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--data", metavar="PATH", default=None,
                     help="raw dataset file (.pt or .pt.gz), e.g. fbgemm_t856_bs65536.pt.gz; a .gz is "
                          "decompressed to a temporary file in --out-dir (about 8 GB for the main file), "
                          "deleted afterwards (default, as the original scripts: "
                          f"{ORIGINAL_DEFAULT_DATA[0]} or {ORIGINAL_DEFAULT_DATA[1]}, .gz accepted)")
    src.add_argument("--synthetic", action="store_true",
                     help="generate synthetic raw data (the same format, calibrated to the main file's "
                          "published statistics); implied by --num-tables and --raw-out")
    p.add_argument("--out-dir", default=DEFAULT_DATA_DIR, metavar="DIR",
                   help=f"where to write table_configs.json and data.pt (default {DEFAULT_DATA_DIR})")
    p.add_argument("--dim", type=positive_int, default=dlrm.DEFAULT_DIM,
                   help=f"embedding dimension given to every table (default {dlrm.DEFAULT_DIM})")
    p.add_argument("--dims", "--dim-range", dest="dims", type=int_list, default=None, metavar="D1,D2,...",
                   help="draw each table's dim from this list instead of --dim (uniformly, reproducibly "
                        "with --seed), e.g. 4,8,16,32,64,128; --dim-range is AutoShard's spelling")
    p.add_argument("--seed", type=seed_int, default=0,
                   help="random seed of the synthetic data and of the --dims draw (default 0)")
    p.add_argument("--batch-size", type=batch_size_int, default=None, metavar="N",
                   help="samples per table to keep: with --data the first N of the file (default: all of "
                        f"them); synthetic: the batch generated (default {dlrm.DEFAULT_SYNTHETIC_BATCH}). "
                        "For GPUs generate --batch-size 65536 (the real dataset's, the papers'): at 4096 a "
                        "GPU is launch-bound and measured plans differ only by noise (README, 'GPUs')")
    p.add_argument("--num-tables", type=positive_int, default=None, metavar="T",
                   help=f"synthetic only: number of tables (default {dlrm.DEFAULT_SYNTHETIC_TABLES})")
    p.add_argument("--raw-out", metavar="PATH", default=None,
                   help="synthetic only: also keep the generated raw tuple (indices, offsets, lengths) "
                        "here, in the dlrm_datasets format (a .gz suffix gzips it)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    a = p.add_argument_group("AutoShard's tasks (its gen_dlrm_data.py wrote train.txt and test.txt beside the "
                             "dataset; any of these flags does so here too; tools/gen_tasks.py is the usual way)")
    a.add_argument("--T-range", dest="T_range", type=original_range, default=None, metavar="MIN,MAX",
                   help="tables per task, MIN..MAX-1 (MAX exclusive, as AutoShard; default 80,81: 80 tables)")
    a.add_argument("--num-train", type=nonnegative_int, default=None, metavar="N", help="training tasks (default 1)")
    a.add_argument("--num-test", type=nonnegative_int, default=None, metavar="N", help="test tasks (default 1)")
    a.add_argument("--test-as-train", action="store_true",
                   help="the test task is the training task (needs --num-train 1 --num-test 1)")
    a.add_argument("--transfer", action="store_true",
                   help="train on the first half of the tables, test on --transfer-ratio of the second half "
                        "(the rest from the first half); without it both draw from all tables")
    a.add_argument("--transfer-ratio", type=fraction, default=None, metavar="R",
                   help="with --transfer: share of test tables from the unseen half (default 1.0)")
    p.epilog = ("The summary at the end gives the aggregate reuse histograms: the fraction of all lookups, "
                "and of all distinct (table, row) pairs, whose row is looked up (0,1], (1,2], (2,4], ... "
                "times in the batch.")
    return p


def _fmt_hist(values) -> str:
    return " ".join(f"{label}:{v:.3f}" for label, v in zip(dlrm.BIN_LABELS, values))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    progress = not args.quiet
    for d in [args.dim] + list(args.dims or []):
        if dim_problem(d):
            raise ShardError(f"--dim/--dims: {dim_problem(d)}")
    check_outputs(args, {"--raw-out": args.raw_out}, {"--raw-out": None},
                  folders={"--out-dir": (args.out_dir, ["table_configs.json", "data.pt", "train.txt", "test.txt"])})
    t0 = time.time()
    autoshard_tasks = (args.T_range is not None or args.num_train is not None or args.num_test is not None
                       or args.test_as_train or args.transfer or args.transfer_ratio is not None)
    if args.test_as_train and (args.num_train or 1, args.num_test or 1) != (1, 1):
        raise ShardError("--test-as-train takes one training and one test task (--num-train 1 --num-test 1)")
    if args.transfer_ratio is not None and not 0.0 <= args.transfer_ratio <= 1.0:
        raise ShardError(f"--transfer-ratio must be in [0, 1], got {args.transfer_ratio}")
    synthetic = args.synthetic or args.num_tables is not None or args.raw_out is not None
    if args.data is None and not synthetic:
        found = [c for base in ORIGINAL_DEFAULT_DATA for c in (base, base + ".gz") if os.path.isfile(c)]
        if not found:
            raise ShardError(f"no --data given and the original scripts' default {ORIGINAL_DEFAULT_DATA[0]} "
                             "(or ../dlrm_datasets/..., .gz) is absent: pass --data PATH to Meta's "
                             "fbgemm_t856_bs65536.pt(.gz), or --synthetic for synthetic data of the same format")
        args.data = found[0]
        print(f"no --data given: reading the original default {args.data}", flush=True)
    if args.data is not None:
        if args.num_tables is not None or args.raw_out is not None:
            raise ShardError("--num-tables and --raw-out apply to synthetic data only, not with --data")
        print(f"loading {args.data}", flush=True)
        raw = dlrm.load_raw(args.data, tmp_dir=args.out_dir)
        batch = args.batch_size
    else:
        num_tables = args.num_tables or dlrm.DEFAULT_SYNTHETIC_TABLES
        batch = args.batch_size or dlrm.DEFAULT_SYNTHETIC_BATCH
        print(f"generating synthetic data: {num_tables} tables, batch {batch}, seed {args.seed}", flush=True)
        raw = dlrm.generate_synthetic_raw(num_tables, batch, seed=args.seed, progress=progress)
        if args.raw_out is not None:
            dlrm.save_raw(raw, args.raw_out)
            print(f"wrote raw data to {args.raw_out}", flush=True)
    data = dlrm.process_raw(raw, batch_size=batch, dim=args.dim, dims=args.dims, seed=args.seed,
                            progress=progress)
    del raw
    dlrm.write_dataset(args.out_dir, data)

    by_lookups, by_rows = data.reuse_histograms()
    used = [t for t in data.tables if t.pooling_factor > 0]
    rows = sorted(t.row for t in used) or [0]
    print(f"tables: {data.num_tables} ({data.num_tables - len(used)} without lookups)  batch: {data.batch_size}  "
          f"total lookups: {data.total_lookups:,}  mean pooling factor: {data.mean_pooling_factor:.2f}  "
          f"rows of tables with lookups: {rows[0]:,} .. {rows[-1]:,}")
    print(f"reuse by lookups:       {_fmt_hist(by_lookups)}")
    print(f"reuse by distinct rows: {_fmt_hist(by_rows)}")
    print(f"wrote {os.path.join(args.out_dir, 'table_configs.json')} and "
          f"{os.path.join(args.out_dir, 'data.pt')} in {time.time() - t0:.1f} s")
    if autoshard_tasks:
        t_min, t_max = args.T_range or (80, 80)
        train, test = generate_transfer_tasks(
            data.num_tables, t_min, t_max, num_train=1 if args.num_train is None else args.num_train,
            num_test=1 if args.num_test is None else args.num_test, transfer=args.transfer,
            transfer_ratio=1.0 if args.transfer_ratio is None else args.transfer_ratio,
            test_as_train=args.test_as_train, seed=args.seed)
        save_tasks(os.path.join(args.out_dir, "train.txt"), train)
        save_tasks(os.path.join(args.out_dir, "test.txt"), test)
        print(f"wrote {len(train)} train and {len(test)} test tasks (AutoShard style, {t_min}..{t_max} tables) "
              f"to {os.path.join(args.out_dir, 'train.txt')} and test.txt")
    return 0


if __name__ == "__main__":
    run_main(main)
