#!/usr/bin/env python3
"""Calibrate a card of this machine's hardware: one command, then plan against it anywhere, offline.

  python tools/calibrate.py --data-dir data/dlrm_datasets --ndevices 4 --out card.json
  python eval.py --alg shardkit,lookup_greedy --oracle emulated:card.json --data-dir data/dlrm_datasets ...
  python tools/calibrate.py --export h200 --out data/cards/h200.json     # the shipped H200 as a card

Measures a counted design of shards (--shards, drawn with --seed from the dataset's tables outside
--exclude-tasks: single tables, multi-table shards, column and row blocks, data-parallel replicas; see
shardcore/oracles/emulated/calibration.py) through the measured oracle and its measurement cache (the
CPU with logical devices here, CUDA GPUs where there are), with a progress bar; --budget is an outer
time cap that stops early and says so in the card. With two or more devices it sweeps the all-to-all and
all-reduce over message sizes and fits latency and bandwidth; with one, the card keeps the exchange
model's figures. Then fits the card's compute model, prints its held-out accuracy and writes the card
atomically (docs/cards.md: the format, and what the accuracy means). One host only: exchanges between
hosts (torchrun) are not swept by this tool.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shardcore.argtypes import positive_int, seed_int  # noqa: E402
from shardcore.cli.common import (ArgumentParser as OneLineParser, add_device_args, add_oracle_args,  # noqa: E402
                                  check_out_file, device_ids, num_devices, open_evaluator, run_main)
from shardcore.dataset import DEFAULT_DATA_DIR  # noqa: E402
from shardcore.errors import ShardError  # noqa: E402
from shardcore.planning import EMULATED_CARDS, MEASURED, parse_landscape  # noqa: E402

DEFAULT_BUDGET_S = 600.0


def build_parser() -> argparse.ArgumentParser:
    from shardcore.argtypes import positive_float
    from shardcore.oracles.emulated.calibration import DEFAULT_SHARDS

    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, metavar="CARD.json", help="the card to write (JSON, atomically)")
    p.add_argument("--export", choices=EMULATED_CARDS, default=None,
                   help="write a shipped card (its fit on data/gpu_measurements/) in the card format instead of "
                        "measuring; the measuring flags do not apply")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=f"dataset whose tables are measured (default "
                                                                f"{DEFAULT_DATA_DIR})")
    p.add_argument("--shards", type=positive_int, default=DEFAULT_SHARDS, metavar="N",
                   help=f"devices the design measures (default {DEFAULT_SHARDS}: groups of 8 drawn from pools of "
                        "tables); counted, so the same command measures the same shards")
    p.add_argument("--budget", type=positive_float, default=DEFAULT_BUDGET_S, metavar="S",
                   help=f"outer time cap in seconds on measuring the shards (default {DEFAULT_BUDGET_S:g}): past it "
                        "the remaining groups are left out and the card says so")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the design's draws (default 0)")
    p.add_argument("--exclude-tasks", default=None, metavar="FILES",
                   help="comma-separated task files whose tables are never measured (the tasks you will judge "
                        "plans on); their sizes also set --tables-per-device")
    p.add_argument("--tables-per-device", type=positive_int, default=None, metavar="K",
                   help="the largest multi-table shard (default: twice the --exclude-tasks' mean tables per device, "
                        "else 12)")
    p.add_argument("--name", default=None, help="the card's short name (default cpu, or the GPU's name)")
    p.add_argument("--weights-precision", choices=("fp16", "fp32"), default="fp16",
                   help="weights precision measured (default fp16)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_device_args(p)
    add_oracle_args(p)
    return p


def _exclusions(args, num_tables: int, ndevices: int) -> tuple[set, int | None]:
    from shardcore.tasks import load_tasks

    exclude, sizes = set(), []
    for path in (args.exclude_tasks.split(",") if args.exclude_tasks else []):
        for task in load_tasks(path.strip(), num_tables=num_tables):
            exclude.update(task.table_ids)
            sizes.append(len(task))
    per_device = args.tables_per_device
    if per_device is None and sizes:
        per_device = max(2, round(2 * sum(sizes) / len(sizes) / ndevices))
    return exclude, per_device


def summary(card: dict) -> list[str]:
    """What a card says of itself, in a few lines (printed after calibrating or exporting)."""
    acc, ex, cal = card["accuracy"], card["exchange"], card.get("calibration", {})
    lines = [f"card {card['name']}: {card['hardware']} ({card['device_type']}), batch {card['batch_size']}, "
             f"{card['precision']}, {card['optimizer']}"]
    if "measured" in cal:
        lines.append(f"  measured {cal['measured']} of {cal['designed']} designed devices in {cal['groups']} groups "
                     f"({', '.join(f'{k} {v}' for k, v in cal['kinds'].items())}) in {cal['compute_s']:g} s"
                     + (f"; {cal['stop']}" if cal.get("stop") else ""))
    if acc.get("mape_pct") is not None:
        kinds = ", ".join(f"{k} {v['mape_pct']:.1f}%" for k, v in acc.get("by_kind", {}).items())
        rho = acc.get("spearman_within_groups")
        lines.append(f"  accuracy: held-out MAPE {acc['mape_pct']:.1f}% over {acc['predicted']} devices"
                     + (f" ({kinds})" if kinds else "")
                     + (f"; within-group Spearman {rho:.3f} over {acc['groups_ranked']} groups" if rho is not None else ""))
        lines.append(f"    ({acc['method']})")
    else:
        lines.append(f"  accuracy: {acc.get('method')}")
    lines.append(f"  exchange ({ex['source']}): {ex['latency_us']:.1f} us + bytes / {ex['bandwidth_gbps']:.3g} GB/s; "
                 f"{ex['note']}")
    dom = card["domain"]
    lines.append(f"  domain: rows <= {dom['max_rows']}, pooling <= {dom['max_pooling']:g}, dims {dom['min_dim']}.."
                 f"{dom['max_dim']}; outside it a plan's output names the tables")
    return lines


def main(argv=None):
    args = build_parser().parse_args(argv)
    check_out_file(args, args.out)     # never over the dataset, the cache or a task file
    from shardcore.oracles.emulated.card import export_shipped, write_card

    if args.export:
        card = export_shipped(args.export)
        write_card(card, args.out)
        print("\n".join(summary(card)))
        print(f"wrote {args.out}")
        return
    if parse_landscape(args.oracle) != MEASURED:
        raise ShardError(f"--oracle {args.oracle}: a card is calibrated by measuring; use the measured oracle "
                         "(the default)")
    if args.launcher != "spawn":
        raise ShardError("--launcher torchrun: tools/calibrate.py calibrates one host (docs/cards.md)")
    from tqdm import tqdm

    from shardcore.dataset import load_dataset
    from shardcore.oracles.emulated.calibration import calibrate, design_shards

    devices, n = device_ids(args), num_devices(args)
    dataset = load_dataset(args.data_dir)
    exclude, per_device = _exclusions(args, dataset.num_tables, n)
    planned = len(design_shards(dataset.tables, args.shards, n, exclude=exclude, tables_per_device=per_device,
                                seed=args.seed))   # a design that cannot be drawn stops before any worker starts
    with open_evaluator(args, args.data_dir, devices, n) as ev:
        ev.start()
        print(f"calibrating on {ev.hardware} (batch {ev.batch_size}, {ev.optimizer}, {ev.precision}): {planned} "
              f"devices designed, budget {args.budget:g} s", flush=True)
        with tqdm(total=planned, desc="calibrating", unit="shard", disable=True if args.quiet else None) as bar:
            card = calibrate(ev, dataset, shards=args.shards, seed=args.seed, budget_s=args.budget, exclude=exclude,
                             tables_per_device=per_device, name=args.name, progress=bar.update,
                             say=lambda s: tqdm.write(s))
    write_card(card, args.out)
    print("\n".join(summary(card)))
    print(f"wrote {args.out}: plan against it with --oracle emulated:{args.out}")


if __name__ == "__main__":
    run_main(main)
