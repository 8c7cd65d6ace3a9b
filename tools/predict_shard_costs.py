#!/usr/bin/env python3
"""Predict shards' forward and backward costs on an emulated GPU.

Reads shard lines {"tables": [[table_index, dim], ...], ...} (the format of
data/gpu_measurements/*_shards.jsonl; a dim below the table's own is a column shard: same rows and
lookups, narrower) and writes them back with "fw_ms" and "bw_ms" set to the emulator's predictions
and "oracle" naming it. Other keys are kept; a line's own "fw_ms"/"bw_ms" (measurements) move to
"measured_fw_ms"/"measured_bw_ms", and the MAPE against them is printed.

  python tools/predict_shard_costs.py --oracle emulated:h200 \\
      --shards data/gpu_measurements/h200_b65536_plan_shards.jsonl --out /tmp/predicted.jsonl
"""

import json
import os


import numpy as np

from shardcore import io
from shardcore.cli.common import check_outputs, make_parser, run_main
from shardcore.dataset import load_table_configs
from shardcore.oracles.emulated.card import card_model
from shardcore.oracles.emulated.emulator import MEASUREMENTS_DIR, MODEL_FILES, read_shard_lines
from shardcore.errors import ShardError
from shardcore.oracles.factory import batch_size_int
from shardcore.oracles.setting import PRODUCED_BY, produced_by
from shardcore.planning import is_card_file, parse_landscape

DEFAULT_CONFIGS = os.path.join(MEASUREMENTS_DIR, "dlrm_b65536", "table_configs.json")
ORACLES = tuple(f"emulated:{card}" for card in MODEL_FILES)


def parse_oracle(text: str) -> str:
    """An emulated card's landscape (a shipped card or a card file), by the one rule
    (:func:`shardcore.planning.parse_landscape`)."""
    key = parse_landscape(text)
    if key not in ORACLES and not is_card_file(key.split(":", 1)[1] if key.startswith("emulated:") else None):
        raise ShardError(f"--oracle {text!r}: this tool predicts an emulated card's costs: choose one of "
                         f"{', '.join(ORACLES)} or emulated:CARD.json")
    return key


def main(argv=None):
    p = make_parser(__doc__)
    p.add_argument("--oracle", default="emulated:h200",
                   help=f"cost model: {', '.join(ORACLES)} or emulated:CARD.json (a card tools/calibrate.py wrote) "
                        "(default %(default)s)")
    p.add_argument("--shards", required=True, metavar="IN.jsonl",
                   help='shard lines {"tables": [[table_index, dim], ...], ...}; measured "fw_ms"/"bw_ms" optional')
    p.add_argument("--out", required=True, metavar="OUT.jsonl",
                   help='where the lines go with predicted "fw_ms"/"bw_ms" (measured ones kept as '
                        '"measured_fw_ms"/"measured_bw_ms"); written atomically')
    p.add_argument("--table-configs", default=DEFAULT_CONFIGS, metavar="PATH",
                   help="table_configs.json the table ids refer to; its pooling factors and reuse bins "
                        "should be taken at --batch-size (default %(default)s)")
    p.add_argument("--batch-size", type=batch_size_int, default=65536, metavar="B",
                   help="samples per iteration: lookups = B x pooling factor (default %(default)s)")
    p.add_argument("--allow-wider-dims", action="store_true",
                   help="accept dims above a table's own dim (the shipped random shards re-dim tables up to "
                        "128); by default such a dim is an error")
    args = p.parse_args(argv)
    check_outputs(args, {"--out": args.out})   # never the shard file it reads (measurements lost)
    card = parse_oracle(args.oracle).split(":", 1)[1]
    tables = load_table_configs(args.table_configs)
    lines = read_shard_lines(args.shards, tables, allow_wider=args.allow_wider_dims)
    model = card_model(card)
    pred = model.predict_many([obj["configs"] for obj in lines], args.batch_size)
    measured = []
    with io.atomic_open(args.out) as fh:
        for obj, (fw, bw) in zip(lines, pred):
            out = {k: v for k, v in obj.items() if k != "configs"}
            had = out.get("fw_ms") is not None and out.get("bw_ms") is not None
            if had:
                measured.append((out["fw_ms"], out["bw_ms"], float(fw), float(bw)))
            for key in ("fw_ms", "bw_ms"):
                if key in out:
                    out["measured_" + key] = out.pop(key)
            out["fw_ms"], out["bw_ms"], out["oracle"] = round(float(fw), 6), round(float(bw), 6), args.oracle
            out["predicted"] = True   # what produced it: never read back as a measurement
            out[PRODUCED_BY] = produced_by("tools/predict_shard_costs.py", args.oracle, predicted=True)
            fh.write(json.dumps(out) + "\n")
    print(f"{len(lines)} shards predicted by {args.oracle} at batch {args.batch_size}; wrote {args.out}")
    m = np.array([r for r in measured if r[0] > 0 and r[1] > 0], dtype=float).reshape(-1, 4)
    if len(m):
        def mape(pr, tr):
            return float(np.mean(np.abs(pr - tr) / tr) * 100)
        print(f"MAPE vs the file's measurements ({len(m)} shards): fw {mape(m[:, 2], m[:, 0]):.2f}%, "
              f"bw {mape(m[:, 3], m[:, 1]):.2f}%, fw+bw {mape(m[:, 2] + m[:, 3], m[:, 0] + m[:, 1]):.2f}%")


if __name__ == "__main__":
    run_main(main)
