#!/usr/bin/env python
"""Measure one plan, given by its shardings, end to end on the measured oracle, and write its
TorchRec form.

The plan file is JSON: ``{"tables": [dataset table ids, in task order], "shardings": [per table
{"type", "devices", "dims"}, ...]}`` (the ``"shardings"`` of an ``eval.py --out`` record; any type,
grid and table-row-wise included). It prints the plan's cost and per-device parts; ``--out`` writes
them as JSON (``cost_ms``, ``device_costs_ms``, ``parts``, ``hardware``), ``--torchrec`` the plan's
TorchRec form (:func:`shardcore.interop.plan_export.torchrec_plan_json`, for hosts of
``--devices-per-host`` or torchrun's ``LOCAL_WORLD_SIZE``; a table TorchRec cannot apply stops it
with one line).

Under ``--launcher torchrun`` every host runs the same command: the ranks are the plan's devices,
rank 0 measures and prints, and ``parts.hosts`` says each rank's torchrun node. Two "hosts" of 2 CPU
devices on one machine (K = 0 and 1)::

    torchrun --nnodes 2 --nproc-per-node 2 --node-rank K --master-addr 127.0.0.1 --master-port 29500 \\
        tools/measure_plan.py --launcher torchrun --data-dir DS --plan plan.json --torchrec plan.torchrec.json
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shardcore import io
from shardcore.argtypes import device_count, nonnegative_int, positive_float, positive_int
from shardcore.cli.common import ArgumentParser, check_outputs, run_main, serve_if_torchrun_rank
from shardcore.errors import ShardError


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", required=True, help="dataset directory (table_configs and lookups)")
    p.add_argument("--plan", required=True, metavar="PLAN.json", help='{"tables": [ids], "shardings": [...]}')
    p.add_argument("--ndevices", type=device_count, default=None,
                   help="devices of the plan (default: torchrun's world size, else the plan's highest device + 1)")
    p.add_argument("--launcher", choices=("spawn", "torchrun"), default="spawn",
                   help="spawn: workers on this machine; torchrun: one rank per device on every host")
    p.add_argument("--devices-per-host", type=nonnegative_int, default=0, metavar="G",
                   help="hosts of G devices for --torchrec (default: torchrun's LOCAL_WORLD_SIZE, else unknown)")
    p.add_argument("--bench-iters", type=positive_int, default=5, help="timed iterations (default 5)")
    p.add_argument("--warmup-iters", type=nonnegative_int, default=2, help="warm-up iterations (default 2)")
    p.add_argument("--comm-iters", type=positive_int, default=None,
                   help="timed repetitions of each all-to-all (default: the timed iterations, on a CPU at least 21)")
    p.add_argument("--timeout", type=positive_float, default=300.0, help="per-phase deadline in s (default 300)")
    p.add_argument("--out", default=None, metavar="FILE.json", help="write the measured record here")
    p.add_argument("--torchrec", default=None, metavar="FILE.json", help="write the plan's TorchRec form here")
    return p


def read_plan(path: str) -> tuple[list[int], list]:
    """``(table ids, shardings)`` of a plan file, or a one-line error."""
    if not Path(path).is_file():
        raise ShardError(f"--plan: {path} {'is a directory' if Path(path).is_dir() else 'not found'}")
    obj = io.parse_json(io.read_text(Path(path), "plan (JSON)"), f"--plan {path}")
    ids = obj.get("tables") if isinstance(obj, dict) else None
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ShardError(f'--plan {path}: expected an object whose "tables" is a non-empty list of dataset table ids')
    if not isinstance(obj.get("shardings"), list):
        raise ShardError(f'--plan {path}: "shardings" must be a list (one per table)')
    return ids, obj["shardings"]


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    served = serve_if_torchrun_rank(args)   # torchrun ranks other than 0 measure, nothing else
    if served is not None:
        return served
    from shardcore.dataset import load_table_configs
    from shardcore.interop.plan_export import torchrec_plan_json
    from shardcore.oracles.measured.driver import PlanEvaluator
    from shardcore.plan import Plan
    from shardcore.topology import Topology

    check_outputs(args, {"--out": args.out, "--torchrec": args.torchrec})   # never --plan nor the dataset
    ids, objs = read_plan(args.plan)
    configs = load_table_configs(os.path.join(args.data_dir, "table_configs.json"))
    bad = [i for i in ids if not 0 <= i < len(configs)]
    if bad:
        raise ShardError(f"--plan {args.plan}: table id {bad[0]} is not in the dataset's {len(configs)} tables")
    tables = [configs[i] for i in ids]
    local = args.devices_per_host or None
    if args.launcher == "torchrun":
        from shardcore.oracles.measured.launch import rank_env

        env = rank_env()
        ndevices, local = args.ndevices or env.world_size, local or env.local_world_size
    else:
        ndevices = args.ndevices or 1 + max((d for o in objs if isinstance(o, dict)
                                             for d in o.get("devices") or [] if isinstance(d, int)), default=0)
    # a plan file says no cap: the plan is measured as it is
    plan = Plan.from_json(tables, objs, Topology(ndevices, float("inf")), where=f"--plan {args.plan}")
    trec = torchrec_plan_json(plan, local_world_size=local) if args.torchrec else None
    ev = PlanEvaluator(args.data_dir, ndevices, bench_iters=args.bench_iters, warmup_iters=args.warmup_iters,
                       comm_iters=args.comm_iters, timeout_s=args.timeout, launcher=args.launcher,
                       device_ids=None if args.launcher == "torchrun" else list(range(ndevices)))
    with ev:
        r = ev.evaluate(plan.device_pieces, no_cache=True)
    print(f"hardware: {r.hardware}")
    print(f"plan of {len(tables)} tables ({', '.join(plan.sharding_types)}) "
          f"on {ndevices} devices: cost {r.cost_ms:.2f} ms")
    for d, c in enumerate(r.device_costs_ms):
        host = f" (host {r.parts['hosts'][d]})" if "hosts" in r.parts and d < len(r.parts["hosts"]) else ""
        print(f"  device {d}{host}: fw compute {c[0]:.2f}, fw comm {c[1]:.2f}, bw comm {c[2]:.2f}, "
              f"bw compute {c[3]:.2f} ms")
    print(f"comm: {r.parts.get('comm')}")
    if args.out:
        io.write_json(args.out, {"tables": ids, "shardings": objs, "ndevices": ndevices, "cost_ms": r.cost_ms,
                                 "device_costs_ms": r.device_costs_ms, "parts": r.parts, "hardware": r.hardware})
        print(f"wrote {args.out}")
    if trec is not None:
        io.write_json(args.torchrec, trec)
        print(f"wrote {args.torchrec} (TorchRec: {', '.join(t['sharding_type'] for t in trec['tables'])})")
    return 0


if __name__ == "__main__":
    run_main(main)
