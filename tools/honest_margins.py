#!/usr/bin/env python3
"""Make the honest-margin records again: every planner side by side on the emulated H200, one eval.py
run per task set, and shardkit's margins read from them -- the README's emulated table in one command.

  make honest-margins                                   # = python tools/honest_margins.py
  python tools/honest_margins.py --sets DLRM-50 --out-dir /tmp/hm

For each set (DLRM-50: the shipped DLRM-50 test tasks on 4 devices, 5 GiB; DLRM-100: 8 devices, 5 GiB; NS:
the NeuroShard-style set, 4 devices, 0.5 GiB, `data/gpu_measurements/tasks/`), `eval.py --oracle
emulated:h200` (the judge held out by the tables of each plan, batch 65536) with the planners of
docs/shardkit.md ("The honest margins"): the greedy baselines, TorchRec's planner for the judged H200
(all types, table-wise, and priced by the emulator), the learned anchors of `--anchors` (`make anchors`),
shardkit's table-wise search and shardkit. Then `tools/shardkit_compare.py` on the records: the margin
below the best anchor, its paired interval, and the same under the stressed judge. Every figure is
emulated, computed on this machine: run it with nothing else running (shardkit plans under a time
budget). Outputs in --out-dir: emu_dlrm50.jsonl.gz, emu_dlrm100.jsonl.gz, emu_ns.jsonl.gz,
ns_tasks_test.txt, compare.txt and commands.txt; built in a staging folder beside it and moved in only
when every set succeeded, so a failed run leaves nothing half-written. About 10 minutes on a 2-core CPU.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shardcore.argtypes import name_list, positive_float, positive_int  # noqa: E402
from shardcore.cli.common import check_outputs, make_parser, run_main  # noqa: E402
from shardcore.errors import ShardError  # noqa: E402

TASKS = ROOT / "data" / "gpu_measurements" / "tasks"
DATA = ROOT / "data" / "gpu_measurements" / "dlrm_b65536"
# set name: (task file, devices, cap per device in GiB, record file)
SETS = {"DLRM-50": ("dlrm_tasks_50_test.txt", 4, 5.0, "emu_dlrm50.jsonl"),
        "DLRM-100": ("dlrm_tasks_100_test.txt", 8, 5.0, "emu_dlrm100.jsonl"),
        "NS": ("ns_tasks_test.txt", 4, 0.5, "emu_ns.jsonl")}
BASE_ALGS = ("size_lookup_greedy", "lookup_greedy", "torchrec", "torchrec-tw", "torchrec-emu", "neuroshard")


def build_parser():
    p = make_parser(description=__doc__)
    p.add_argument("--out-dir", type=Path, default=None,
                   help="where the records go (default results/honest_margins/<today, UTC>); must not exist "
                        "unless --force")
    p.add_argument("--force", action="store_true", help="replace --out-dir if it exists")
    p.add_argument("--sets", type=name_list, default=tuple(SETS), help=f"task sets (default {','.join(SETS)})")
    p.add_argument("--anchors", type=Path, default=ROOT / "models" / "anchors" / "h200",
                   help="the learned anchors' folder (make anchors; default %(default)s)")
    p.add_argument("--max-tasks", type=positive_int, default=None, metavar="N",
                   help="only the first N tasks of each set (default all 10)")
    p.add_argument("--shardkit-time", type=positive_float, default=None, metavar="S",
                   help="shardkit's budget per task (default eval.py's, 5 s)")
    p.add_argument("--algs", type=name_list, default=None, metavar="ALGS",
                   help="planners instead of the full list (shardkit must be one of them); for a quick look")
    return p


def algorithms(anchors: Path) -> tuple[list[str], list[str]]:
    """(the planners, NeuroShard's model flags) of docs/shardkit.md's honest-margin commands."""
    ns = [anchors / "neuroshard" / f for f in ("compute.pt", "fw_comm.pt", "bw_comm.pt")]
    # the checkpoints the trainers select (the best learning-curve iteration / policy check), else the last
    learned = [anchors / "dreamshard" / "best.pt",
               next((p for p in (anchors / "autoshard" / "best.pt", anchors / "autoshard" / "model.pt") if p.is_file()),
                    anchors / "autoshard" / "best.pt")]
    missing = [str(f) for f in ns + learned if not f.is_file()]
    if missing:
        raise ShardError(f"--anchors {anchors}: {missing[0]} not found (make anchors builds them)")
    def name(f: Path) -> str:   # relative to the repository (eval.py runs there): the records name it so
        try:
            return str(f.resolve().relative_to(ROOT))
        except ValueError:
            return str(f)

    algs = list(BASE_ALGS) + [name(f) for f in learned] + ["shardkit-tw", "shardkit"]
    flags = ["--compute-model", name(ns[0]), "--fw-comm-model", name(ns[1]), "--bw-comm-model", name(ns[2])]
    return algs, flags


def main(argv=None):
    args = build_parser().parse_args(argv)
    unknown = [s for s in args.sets if s not in SETS]
    if unknown:
        raise ShardError(f"--sets: unknown task set {unknown[0]!r} ({', '.join(SETS)})")
    if args.algs is not None and "shardkit" not in args.algs:
        raise ShardError("--algs must name shardkit (the margins are shardkit's)")
    out = args.out_dir or ROOT / "results" / "honest_margins" / _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    if out.exists() and not args.force:
        raise ShardError(f"--out-dir {out} exists (--force replaces it)")
    # --force replaces the folder as a whole: never one holding what the run reads
    check_outputs(args, {"--out-dir": out}, dirs=["--out-dir"], replaced=["--out-dir"],
                  inputs={"the dataset": DATA, "the task sets": TASKS})
    algs, ns_flags = algorithms(args.anchors)
    if args.algs is not None:
        algs = list(args.algs)
    stage = out.with_name(f".{out.name}.staging")
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    try:
        commands, records = [], []
        for name in args.sets:
            task_file, ndev, cap, record = SETS[name]
            cmd = [sys.executable, str(ROOT / "eval.py"), "--alg", ",".join(algs), *ns_flags, "--oracle", "emulated:h200",
                   "--data-dir", str(DATA), "--task-path", str(TASKS / task_file), "--ndevices", str(ndev),
                   "--max-memory", f"{cap:g}", "--out", str(stage / record)]
            if args.max_tasks:
                cmd += ["--max-tasks", str(args.max_tasks)]
            if args.shardkit_time:
                cmd += ["--shardkit-time", f"{args.shardkit_time:g}"]
            commands.append(shlex.join(cmd))
            print(f"== {name} ({ndev} devices, cap {cap:g} GiB): {len(algs)} planners", flush=True)
            if subprocess.run(cmd, cwd=ROOT).returncode != 0:
                raise ShardError(f"{name}: eval.py failed (its output is above)")
            with open(stage / record, "rb") as src, gzip.GzipFile(stage / (record + ".gz"), "wb", mtime=0) as dst:
                shutil.copyfileobj(src, dst)
            os.remove(stage / record)
            records.append(str(stage / (record + ".gz")))
        if "NS" in args.sets:
            shutil.copyfile(TASKS / SETS["NS"][0], stage / SETS["NS"][0])
        cmp_cmd = [sys.executable, "-m", "tools.shardkit_compare", *records]
        done = subprocess.run(cmp_cmd, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            raise ShardError(f"tools/shardkit_compare.py failed: {(done.stderr or done.stdout).strip()[-300:]}")
        text = done.stdout.replace(str(stage), str(out))
        (stage / "compare.txt").write_text(text)
        commands.append(shlex.join(cmp_cmd).replace(str(stage), str(out)))
        portable = "\n".join(commands).replace(str(stage), str(out)).replace(sys.executable, "python")
        (stage / "commands.txt").write_text(portable.replace(str(ROOT) + os.sep, "") + "\n")
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    print(text)
    print(f"wrote {', '.join(sorted(os.listdir(out)))} to {out}")
    complete = set(args.sets) == set(SETS) and args.algs is None and not args.max_tasks and not args.shardkit_time
    manifest = ROOT / "results" / "honest_margins" / "manifest.json"
    if complete and out.resolve().parent == manifest.parent.resolve() and manifest.is_file():
        make_current(manifest, out, argv)
        print(f"{manifest.relative_to(ROOT)}: {out.name} is the current run (make results regenerates the tables)")
    return 0


def make_current(manifest: Path, out: Path, argv=None) -> None:
    """Name the complete run in ``out`` as the folder's current one in its manifest (results/README.md):
    every path of the run it replaces is re-pointed, that run joins the history, and the command, commit
    and date are this run's. Written atomically."""
    import json

    from shardcore import io

    obj = json.loads(manifest.read_text())
    old = obj.get("current")
    new = str(out.resolve().relative_to(ROOT))
    if old == new:
        return

    def repoint(v):
        if isinstance(v, str) and old and v.startswith(old + "/"):
            return new + v[len(old):]
        if isinstance(v, list):
            return [repoint(x) for x in v]
        if isinstance(v, dict):
            return {k: repoint(x) for k, x in v.items()}
        return v

    history = obj.get("history", [])
    obj = repoint({k: v for k, v in obj.items() if k != "history"})
    if old:
        history = [{"folder": old, "note": "the run before " + out.name}] + history
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    obj.update(current=new, history=history,
               command=shlex.join(["python", "tools/honest_margins.py", *(sys.argv[1:] if argv is None else argv)]),
               commit=git.stdout.strip() if git.returncode == 0 else "unknown",
               date=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    io.write_text(manifest, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    run_main(main)
