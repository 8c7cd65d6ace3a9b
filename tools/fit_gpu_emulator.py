#!/usr/bin/env python3
"""Refit the emulated-GPU compute model from the shipped shard measurements.

Reads data/gpu_measurements/ (NVIDIA H200; manifest.json names the files): the batch-65536 shards (the
primary landscape: the shared plan and random shard files and the fitted gpu_check runs' shard files, whole
tables and column pieces: a device with row-wise or data-parallel pieces is its run's pieces file's,
which fits the replica kernel instead; a shard
measured more than once enters once, with the mean of its measurements) and the batch-4096 plan
shards, fits the forward and backward
weights of shardcore.oracles.emulated.emulator's features at each batch by non-negative least squares on the
relative error (deterministic), and rewrites data/gpu_measurements/h200_emulator.json atomically.

  python tools/fit_gpu_emulator.py                 # rewrite the shipped parameters
  python tools/fit_gpu_emulator.py --out /tmp/h200.json
"""

import json
import os


from shardcore import io
from shardcore.cli.common import check_out_file, make_parser, run_main
from shardcore.oracles.emulated.emulator import (DEFAULT_SPEC, MANIFEST, MEASUREMENTS_DIR, PIECE_ERROR_FILES, SHARD_FILES,
                                default_cv_of, fit_params, heldout_model, known_index, load_gpu_model,
                                load_measurements, measurement_features, model_path, piece_errors_json,
                                synthetic_length_cv)
from shardcore.errors import ShardError

CARD = "h200"
MEASURED = MANIFEST["cards"][CARD]["measured"]   # the card and software measured, as the parameter file states them


def fit_from_measurements(directory=MEASUREMENTS_DIR, spec=None) -> dict:
    """The parameter dict fitted on the measurement files in ``directory``."""
    spec = dict(spec or DEFAULT_SPEC)
    known = synthetic_length_cv()
    idx = known_index(known)
    sets, counts, default_cv = {}, [], None
    for batch in sorted(SHARD_FILES, reverse=True):
        meas = load_measurements(batch, directory)
        if default_cv is None:
            default_cv = default_cv_of(known, meas["tables"], batch)
        X = measurement_features(meas, batch, spec, idx, default_cv)
        fw = [s["fw_ms"] for s in meas["shards"]]
        bw = [s["bw_ms"] for s in meas["shards"]]
        sets[batch] = (X, fw, bw)
        nmeas = sum(len(s["measured"]) for s in meas["shards"])
        counts.append(f"batch {batch}: {len(fw)} shards ({nmeas} measurements, a shard's averaged; "
                      f"{', '.join(SHARD_FILES[batch])})")
    fitted_on = f"{MEASURED}; fp16 weights, exact SGD, each shard alone; " + "; ".join(counts)
    return fit_params(sets, spec, card=CARD, fitted_on=fitted_on, known_tables=known, default_cv=default_cv)


def format_params(params: dict) -> str:
    """JSON with one top-level key per line (diff-friendly, small)."""
    lines = []
    for key, value in params.items():
        if key == "sets":
            inner = ",\n".join(f"  {json.dumps(b)}: {json.dumps(v)}" for b, v in value.items())
            lines.append(f' "sets": {{\n{inner}\n }}')
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main(argv=None):
    p = make_parser(__doc__)
    p.add_argument("--measurements", default=str(MEASUREMENTS_DIR), metavar="DIR",
                   help="folder with the measured shards, plans, table configs and tasks (default %(default)s)")
    p.add_argument("--out", default=str(model_path(CARD)), metavar="FILE",
                   help="parameter file to write, atomically (default %(default)s)")
    p.add_argument("--piece-errors-only", action="store_true",
                   help="fit nothing: only write the held-out judge's errors on the measured devices with row-wise "
                        "blocks or replicas for the shipped parameter file (data/gpu_measurements/"
                        f"{PIECE_ERROR_FILES[CARD]}; the stressed judge and shardkit read it)")
    args = p.parse_args(argv)
    piece_path = os.path.join(str(MEASUREMENTS_DIR), PIECE_ERROR_FILES[CARD])
    if args.piece_errors_only:
        io.write_text(piece_path, piece_errors_json(CARD))
        print(f"wrote {piece_path}")
        return
    check_out_file(args, args.out)   # before the fit; never a measurement file it reads
    if not os.path.isdir(args.measurements):
        raise ShardError(f"measurement folder not found: {args.measurements}")
    params = fit_from_measurements(args.measurements)
    io.write_text(args.out, format_params(params))
    if os.path.abspath(args.out) == os.path.abspath(str(model_path(CARD))):   # the shipped fit: its piece errors
        load_gpu_model.cache_clear()
        heldout_model.cache_clear()
        io.write_text(piece_path, piece_errors_json(CARD))
        print(f"wrote {piece_path}")
    for batch, s in params["sets"].items():
        nz_f = sum(1 for w in s["fw"] if w > 0)
        nz_b = sum(1 for w in s["bw"] if w > 0)
        print(f"batch {batch}: {s['shards']} shards, {len(s['fw'])} features, non-zero weights fw {nz_f}, bw {nz_b}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    run_main(main)
