#!/usr/bin/env python3
"""Rebuild the learned anchors (DreamShard, AutoShard, NeuroShard) with fixed seeds, trained against
the emulated H200 (held-out fit) on the 50 training tasks of DLRM-50 (4), and write them with a
manifest of how each was made.

  make anchors                        # = python tools/train_anchors.py
  python tools/train_anchors.py --stages neuroshard      # one method again; the others are kept

Stages, each a subprocess of this interpreter with its output in <work-dir>/logs/<stage>.log:
(1) tasks: tools/gen_tasks.py --T 50 --num-train 50 --num-test 10 with its default seed; its
    test.txt must equal --expected-test (the shipped DLRM-50 test tasks), else one line and stop;
(2) NeuroShard: collect_compute_cost_data.py (random shards of every table of the dataset, as the
    original pre-trains: the test tasks' tables included), collect_comm_cost_data.py (all-to-alls of
    each of --ns-comm-devices, default 4 and 8: the device counts it plans for),
    train_compute_cost_model.py, train_comm_cost_model.py (on every comm folder);
(3) DreamShard: train_dreamshard.py on the training tasks;
(4) AutoShard: train_autoshard.py (model.pt, the last weights, and best.pt, those of its best check of
    the greedy policy on the training tasks: the anchor evaluated) on 50 tasks of 50 tables drawn from
    every table of the dataset (gen_tasks.py --all-tables, as AutoShard's gen_dlrm_data.py draws them
    without --transfer: the test tasks' tables included; --as-tasks train gives it DreamShard's training
    tasks instead); the steps reached are in the manifest.
Every method runs with its scripts' default flags (the method as a user trains it) plus the task, data,
device, cap, seed and oracle flags; --ds-*, --as-*, --ns-* override one flag each. AutoShard's anchor
keeps what planning needs; the learner's resume state (optimizers, cost-model buffer: 95% of the file)
stays in the full checkpoint in <work-dir>/autoshard/model.pt.

Outputs (<out-dir>, default models/anchors/h200): dreamshard/<N-1>.pt and dreamshard/best.pt (the
iteration whose learning-curve plans of the training tasks cost least), autoshard/model.pt,
autoshard/best.pt and autoshard/train_tasks.txt, neuroshard/{compute,fw_comm,bw_comm}.pt,
train_tasks.txt and MANIFEST.json (per checkpoint: the
commands, seed, oracle and its fit, batch, device count, cap, training tasks digest, wall time, date,
machine, size and sha256). Everything is built in a hidden staging folder beside <out-dir> and
swapped in only when every stage succeeded: a failed or interrupted run leaves <out-dir> as it was.
Stages not run (--stages) keep their checkpoints and manifest entries from <out-dir>.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:          # run as a script: this checkout's packages, not an installed copy
    sys.path.insert(0, str(ROOT))

from shardcore.cli.common import make_parser, run_main  # noqa: E402
from shardcore.argtypes import device_count, int_list, nonnegative_int, positive_float, positive_int  # noqa: E402
from shardcore.errors import ShardError  # noqa: E402
from shardcore.topology import DEFAULT_MAX_MEMORY_GB

METHODS = ("neuroshard", "dreamshard", "autoshard")    # the order they run in
MANIFEST = "MANIFEST.json"
TASKS_T, TASKS_TRAIN, TASKS_TEST = 50, 50, 10            # DLRM-50: 50 tables, 50 training and 10 test tasks
RESUME_STATE = ("optimizer", "cost_optimizer", "cost_buffer")   # AutoShard's learner state, only for --resume


def build_parser():
    p = make_parser(description=__doc__)
    p.add_argument("--out-dir", default="models/anchors/h200",
                   help="where the checkpoints and MANIFEST.json go (default models/anchors/h200)")
    p.add_argument("--work-dir", default=None,
                   help="logs, cost data, intermediate checkpoints (default models/anchors_work/<out-dir name>; "
                        "each stage's folder there is emptied before it runs)")
    p.add_argument("--data-dir", default="data/gpu_measurements/dlrm_b65536",
                   help="dataset (table configs) the tasks and the oracle use (default "
                        "data/gpu_measurements/dlrm_b65536, batch 65536)")
    p.add_argument("--expected-test", default="data/gpu_measurements/tasks/dlrm_tasks_50_test.txt",
                   help="the generated test.txt must equal this file, so the training tasks are the ones the "
                        "shipped test tasks were split from (default data/gpu_measurements/tasks/dlrm_tasks_50_test.txt)")
    p.add_argument("--stages", default=",".join(METHODS),
                   help=f"methods to (re)train, comma-separated (default {','.join(METHODS)}); the tasks are "
                        "always generated")
    p.add_argument("--oracle", default="emulated:h200", help="cost oracle of every stage (default emulated:h200)")
    p.add_argument("--emulator-fit", default="heldout", choices=["heldout", "full"],
                   help="the emulated oracle's fit (default heldout: a plan is judged by a fit without every "
                        "measured shard holding one of its tables)")
    p.add_argument("--ndevices", type=device_count, default=4, help="devices of a training plan (default 4)")
    p.add_argument("--max-memory", type=positive_float, default=DEFAULT_MAX_MEMORY_GB,
                   help="memory cap per device in GiB, fp16 weights (default %(default)g)")
    p.add_argument("--seed", type=nonnegative_int, default=0,
                   help="seed of every training and collection (default 0; the tasks use gen_tasks.py's "
                        "default seed, which the expected test file fixes)")
    # each method's own flags: left out (None) the training script's default applies, as a user runs it
    g = p.add_argument_group("DreamShard (each flag's default: train_dreamshard.py's)")
    g.add_argument("--ds-iterations", type=positive_int, default=None,
                   help="train_dreamshard.py --num-iterations (default: the script's; the checkpoint kept is the last)")
    g.add_argument("--ds-bench-steps", type=positive_int, default=None,
                   help="train_dreamshard.py --bench-steps (default: the script's)")
    g = p.add_argument_group("AutoShard (each flag's default: train_autoshard.py's)")
    g.add_argument("--as-steps", type=positive_int, default=None,
                   help="train_autoshard.py --total-steps (default: the script's)")
    g.add_argument("--as-time-limit", type=positive_float, default=None,
                   help="train_autoshard.py --time-limit in minutes (default: the script's; the manifest records the "
                        "steps reached)")
    g.add_argument("--as-actors", type=positive_int, default=None,
                   help="train_autoshard.py --num-actors (default: the script's)")
    g.add_argument("--as-tasks", choices=["all", "train"], default="all",
                   help="AutoShard's training tasks: all = 50 tasks of 50 tables drawn from every table (the "
                        "original's protocol: gen_dlrm_data.py without --transfer; the test tasks' tables "
                        "included, as NeuroShard's pre-training sees them); train = the DreamShard-style training "
                        "tasks, none of whose tables is in a test task (default all)")
    g = p.add_argument_group("NeuroShard (each flag's default: its script's)")
    g.add_argument("--ns-compute-samples", type=positive_int, default=None,
                   help="collect_compute_cost_data.py --data_size (default: the script's)")
    g.add_argument("--ns-comm-samples", type=positive_int, default=None,
                   help="collect_comm_cost_data.py --data_size (default: the script's)")
    g.add_argument("--ns-max-tables", type=positive_int, default=None,
                   help="collect_compute_cost_data.py --max_tables (default: the script's)")
    g.add_argument("--ns-epochs", type=positive_int, default=None,
                   help="train_compute_cost_model.py --epochs (default: the script's)")
    g.add_argument("--ns-comm-epochs", type=positive_int, default=None,
                   help="train_comm_cost_model.py --epochs (default: the script's)")
    g.add_argument("--ns-comm-devices", type=int_list, default=[4, 8], metavar="N,N",
                   help="device counts of the all-to-alls NeuroShard's communication data are collected on, one "
                        "folder each, its models trained on all of them: the counts it plans for, as the original "
                        "collects on the GPUs it will use (default 4,8: DLRM-50's and DLRM-100's)")
    return p


# -- helpers ---------------------------------------------------------------------------------------
def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def rel(path: Path) -> str:
    """``path`` relative to the repository root where it lies inside it (commands stay portable)."""
    path = Path(os.path.abspath(path))
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def machine() -> dict:
    from shardcore.oracles.setting import cpu_name

    return {"cpu": cpu_name(), "platform": platform.platform(), "host_cores": os.cpu_count()}


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on Linux
        return None


def code_version() -> dict:
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    commit = git("rev-parse", "HEAD")
    return {"commit": commit or None, "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))
            if commit else None}


def last_lines(log: Path, n: int = 3) -> list[str]:
    """The last ``n`` non-empty lines of a log, progress-bar redraws (\\r) reduced to their last state."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return []
    lines = [ln.split("\r")[-1].strip() for ln in text.splitlines()]
    return [ln for ln in lines if ln][-n:]


class Runner:
    """Runs the stages' subprocesses (cwd: the repository root), one log each, one progress line each."""

    def __init__(self, logs: Path, total: int):
        self.logs = logs
        self.total = total
        self.done = 0

    def __call__(self, name: str, argv: list[str]) -> dict:
        self.done += 1
        log = self.logs / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        shown = shlex.join(["python", *argv])
        print(f"[{self.done}/{self.total}] {name}: {shown}", flush=True)
        load0, t0 = load_average(), time.perf_counter()
        rc = self.execute([sys.executable, *argv], log)
        wall = time.perf_counter() - t0
        if rc != 0:
            tail = " | ".join(last_lines(log, 2)) or "no output"
            raise ShardError(f"stage {name} failed (exit status {rc}) after {wall:.0f} s: {tail} (log: {rel(log)}); "
                             "nothing was written to the output directory")
        print(f"[{self.done}/{self.total}] {name}: done in {wall:.1f} s", flush=True)
        return {"command": shown, "wall_s": round(wall, 1), "finished": now(),
                "load_average_before": load0, "load_average_after": load_average(),
                "log": rel(log), "log_tail": last_lines(log)}

    @staticmethod
    def execute(cmd: list[str], log: Path) -> int:
        """The command's exit status; interrupted (Ctrl-C, SIGTERM), it is asked to stop (SIGTERM, so
        a trainer stops its own workers), killed after 60 s, and the interruption goes on."""
        with open(log, "w") as fh:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
            try:
                return proc.wait()
            except BaseException:
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                raise


def given(flag: str, value) -> list[str]:
    """``[flag, value]``, or nothing where the value is None (the training script's default applies)."""
    return [] if value is None else [flag, f"{value:g}" if isinstance(value, float) else str(value)]


def oracle_flags(args) -> list[str]:
    return ["--oracle", args.oracle, "--emulator-fit", args.emulator_fit]


def check_checkpoint(path: Path, what: str) -> None:
    """The checkpoint exists and loads with ``weights_only=True``."""
    import torch

    if not path.is_file():
        raise ShardError(f"{what}: the stage ended without writing {rel(path)}; nothing was written to the output "
                         "directory")
    try:
        torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any load failure is the same verdict
        raise ShardError(f"{what}: {rel(path)} does not load with weights_only=True ({exc}); nothing was written "
                         "to the output directory") from None


# -- the stages ------------------------------------------------------------------------------------
def stage_tasks(args, run: Runner, work: Path) -> dict:
    tasks = work / "tasks"
    if tasks.exists():
        shutil.rmtree(tasks)
    info = run("tasks", ["-m", "tools.gen_tasks", "--data-dir", args.data_dir, "--T", str(TASKS_T),
                         "--num-train", str(TASKS_TRAIN), "--num-test", str(TASKS_TEST), "--out-dir", rel(tasks)])
    train, test = tasks / "train.txt", tasks / "test.txt"
    if not train.is_file() or not test.is_file():
        raise ShardError(f"tasks: gen_tasks.py wrote no train.txt/test.txt in {rel(tasks)}")
    if test.read_bytes() != (ROOT / args.expected_test).read_bytes():
        raise ShardError(f"tasks: the generated {rel(test)} differs from {args.expected_test}: these are not the "
                         "training tasks the shipped test tasks were split from (another dataset or generator?)")
    info.update(train=train, test=test, sha256=sha256(train), test_sha256=sha256(test))
    return info


def stage_autoshard_tasks(args, run: Runner, work: Path) -> dict:
    """AutoShard's own training tasks (``--as-tasks all``): drawn from every table, as its original's."""
    tasks = work / "tasks_autoshard"
    if tasks.exists():
        shutil.rmtree(tasks)
    info = run("autoshard_tasks", ["-m", "tools.gen_tasks", "--data-dir", args.data_dir, "--T", str(TASKS_T),
                                   "--all-tables", "--num-train", str(TASKS_TRAIN), "--num-test", "0",
                                   "--seed", str(args.seed), "--out-dir", rel(tasks)])
    train = tasks / "train.txt"
    if not train.is_file():
        raise ShardError(f"autoshard_tasks: gen_tasks.py wrote no train.txt in {rel(tasks)}")
    info.update(train=train, sha256=sha256(train))
    return info


def stage_neuroshard(args, run: Runner, work: Path) -> dict:
    ns = work / "neuroshard"
    if ns.exists():
        shutil.rmtree(ns)
    ns.mkdir(parents=True)
    common = oracle_flags(args) + ["--seed", str(args.seed), "--quiet"]
    compute_data = run("neuroshard_compute_data", [
        "collect_compute_cost_data.py", *given("--data_size", args.ns_compute_samples), "--dataset_dir", args.data_dir,
        *given("--max_tables", args.ns_max_tables), "--max-memory", f"{args.max_memory:g}",
        "--weights-precision", "fp16", "--pool", "all",
        "--out_dir", rel(ns / "compute")] + common)
    comm_data = [run(f"neuroshard_comm_data_{n}", [
        "collect_comm_cost_data.py", *given("--data_size", args.ns_comm_samples), "--dataset_dir", args.data_dir,
        "--gpu-devices", ",".join(str(d) for d in range(n)), "--weights-precision", "fp16",
        "--out_dir", rel(ns / f"comm_{n}")] + common) for n in args.ns_comm_devices]
    compute_model = run("neuroshard_compute_model", [
        "train_compute_cost_model.py", "--data_dir", rel(ns / "compute"), *given("--epochs", args.ns_epochs),
        "--seed", str(args.seed), "--quiet", "--out_path", rel(ns / "compute.pt")])
    comm_models = run("neuroshard_comm_models", [
        "train_comm_cost_model.py", "--data_dir", ",".join(rel(ns / f"comm_{n}") for n in args.ns_comm_devices),
        *given("--epochs", args.ns_comm_epochs),
        "--seed", str(args.seed), "--quiet", "--fw_out_path", rel(ns / "fw_comm.pt"),
        "--bw_out_path", rel(ns / "bw_comm.pt")])
    out = {}
    for name, data, model in (("compute.pt", [compute_data], compute_model), ("fw_comm.pt", comm_data, comm_models),
                              ("bw_comm.pt", comm_data, comm_models)):
        check_checkpoint(ns / name, "neuroshard")
        out[f"neuroshard/{name}"] = {
            "source": ns / name, "stages": [*data, model],
            "note": "cost data from random shards of every table of the dataset (the original's pre-training: "
                    "the test tasks' tables included) and random all-to-alls of "
                    f"{' and '.join(str(n) for n in args.ns_comm_devices)} devices, not from the task file itself"}
    return out


def training_flags(args, train: Path) -> list[str]:
    """The flags DreamShard's and AutoShard's trainers share: the tasks, data, devices, cap, precision."""
    return ["--task-path", rel(train), "--data-dir", args.data_dir,
            "--gpu-devices", ",".join(str(d) for d in range(args.ndevices)), "--max-memory", f"{args.max_memory:g}",
            "--weights-precision", "fp16"]


def stage_dreamshard(args, run: Runner, work: Path, train: Path) -> dict:
    ds = work / "dreamshard"
    if ds.exists():
        shutil.rmtree(ds)
    info = run("dreamshard", ["train_dreamshard.py"] + training_flags(args, train)
               + given("--num-iterations", args.ds_iterations) + given("--bench-steps", args.ds_bench_steps)
               + ["--seed", str(args.seed), "--out-dir", rel(ds)] + oracle_flags(args))
    from shardcore.registry import numbered_checkpoints

    found = numbered_checkpoints(ds)
    if not found:
        raise ShardError(f"dreamshard: the stage ended without writing a numbered checkpoint in {rel(ds)}; nothing "
                         "was written to the output directory")
    name = found[-1][1].name
    out = {}
    # the last iteration (the paper's model) and best.pt (the iteration whose learning-curve plans of the
    # training tasks cost least: the anchor evaluated)
    for kept in [name] + (["best.pt"] if (ds / "best.pt").is_file() else []):
        check_checkpoint(ds / kept, "dreamshard")
        out[f"dreamshard/{kept}"] = {"source": ds / kept, "stages": [info],
                                     "train_log": _csv_tail(ds / "train_log.csv")}
    return out


def stage_autoshard(args, run: Runner, work: Path, train: Path, own_tasks: dict | None = None) -> dict:
    """``own_tasks``: :func:`stage_autoshard_tasks`' result (its tasks are then ``train``), recorded as the
    checkpoint's training tasks and copied beside it."""
    xp = work / "autoshard"
    if xp.exists():
        shutil.rmtree(xp)
    info = run("autoshard", ["train_autoshard.py"] + training_flags(args, train)
               + given("--total-steps", args.as_steps) + given("--time-limit", args.as_time_limit)
               + given("--num-actors", args.as_actors)
               + ["--seed", str(args.seed), "--savedir", rel(work), "--xpid", "autoshard"] + oracle_flags(args))
    check_checkpoint(xp / "model.pt", "autoshard")
    import torch

    from shardcore.io import torch_save

    full = xp / "model.pt"
    ckpt = torch.load(full, map_location="cpu", weights_only=True)
    steps = ckpt.get("steps")
    extra = dict(ckpt.get("extra") or {})
    dropped = [k for k in RESUME_STATE if k in extra]
    ckpt["extra"] = {k: v for k, v in extra.items() if k not in RESUME_STATE}
    slim = xp / "model.anchor.pt"
    torch_save(ckpt, slim)
    episodes = _count_rows(xp / "episodes.csv")
    shared = {"stages": [info], "steps_reached": steps, "episodes": episodes,
              "budget": (f"--total-steps {args.as_steps or 'default'} or --time-limit "
                         f"{'default' if args.as_time_limit is None else f'{args.as_time_limit:g}'} min, "
                         "whichever first"),
              "note": "the actor-learner is asynchronous: the steps reached within the time limit and the exact "
                      "weights depend on the machine's speed, so a rerun is comparable, not bit-identical"}
    if own_tasks is not None:
        shared["training_tasks"] = {"file": "autoshard/train_tasks.txt", "sha256": own_tasks["sha256"],
                                    "generated_by": own_tasks["command"],
                                    "tables": "every table of the dataset, the test tasks' included (AutoShard's "
                                              "original protocol; --as-tasks train: DreamShard's training tasks)"}
    out = {"autoshard/model.pt": {
        **shared, "source": slim,
        "learner_state_dropped": {
            "keys": [f"extra.{k}" for k in dropped], "full_checkpoint": rel(full), "full_bytes": full.stat().st_size,
            "full_sha256": sha256(full),
            "why": "the learner's resume state (optimizers, the cost model's shard buffer) is not needed to plan "
                   "and is most of the file; --resume needs the full checkpoint, kept in the work folder"},
        **({} if own_tasks is None else {"copy": {"autoshard/train_tasks.txt": own_tasks["train"]}})}}
    best = xp / "best.pt"
    if best.is_file():   # the policy check with the lowest cost over the lookup greedy's: the anchor evaluated
        check_checkpoint(best, "autoshard")
        selected = (torch.load(best, map_location="cpu", weights_only=True).get("extra") or {}).get("selected")
        out["autoshard/best.pt"] = {**shared, "source": best, "selected": selected}
    return out


def _csv_tail(path: Path) -> dict | None:
    import csv

    try:
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError:
        return None
    return rows[-1] if rows else None


def _count_rows(path: Path) -> int | None:
    try:
        with open(path) as fh:
            return max(0, sum(1 for _ in fh) - 1)
    except OSError:
        return None


# -- main ------------------------------------------------------------------------------------------
def check_args(args) -> list[str]:
    from shardcore.cli.common import check_outputs
    from shardcore.dataset import configs_batch_size
    from shardcore.planning import parse_landscape

    stages = [s.strip().lower() for s in str(args.stages).split(",") if s.strip()]
    bad = [s for s in stages if s not in METHODS]
    if bad or not stages:
        raise ShardError(f"--stages: unknown method {', '.join(bad) or '(none given)'}: choose from {', '.join(METHODS)}")
    args.oracle = parse_landscape(args.oracle)
    if not args.ns_comm_devices or min(args.ns_comm_devices) < 2:
        raise ShardError(f"--ns-comm-devices: device counts of an all-to-all, each at least 2, got {args.ns_comm_devices}")
    args.ns_comm_devices = sorted(set(args.ns_comm_devices))
    if not (Path(args.data_dir) / "table_configs.json").is_file():
        raise ShardError(f"--data-dir {args.data_dir}: no table_configs.json there")
    if not Path(args.expected_test).is_file():
        raise ShardError(f"--expected-test {args.expected_test}: no such file")
    args.data_dir, args.expected_test = rel(Path(args.data_dir)), rel(Path(args.expected_test))
    args.batch_size = configs_batch_size(ROOT / args.data_dir)
    if args.oracle != "measured" and args.batch_size is None:
        raise ShardError(f"--data-dir {args.data_dir}: its table configs name no batch size")
    out = Path(args.out_dir)
    if out.name in ("", ".", ".."):
        raise ShardError(f"--out-dir {args.out_dir!r}: not a folder name")
    if args.work_dir is None:
        args.work_dir = str(Path("models") / "anchors_work" / out.name)
    # both folders are rebuilt in parts (a stage's folder, the anchors swapped in whole): never over an input
    check_outputs(args, {"--out-dir": out, "--work-dir": args.work_dir}, dirs=["--out-dir", "--work-dir"],
                  replaced=["--out-dir", "--work-dir"], inputs={"--data-dir": args.data_dir})
    return [m for m in METHODS if m in stages]


def write_manifest(staging: Path, args, tasks: dict, entries: dict, old: dict, argv: list[str], started: str,
                   code: dict) -> dict:
    """Copy the new checkpoints into ``staging`` and write its MANIFEST.json (entries of methods not
    run are kept from ``old``, the existing manifest)."""
    import torch

    from shardcore.io import write_json

    shutil.copyfile(tasks["train"], staging / "train_tasks.txt")
    shared = {"seed": args.seed, "oracle": args.oracle,
              "emulator_fit": args.emulator_fit if args.oracle != "measured" else None,
              "batch_size": args.batch_size, "ndevices": args.ndevices, "max_memory_gb": args.max_memory,
              "weights_precision": "fp16", "data_dir": args.data_dir,
              "training_tasks": {"file": "train_tasks.txt", "sha256": tasks["sha256"],
                                 "generated_by": tasks["command"], "test_sha256": tasks["test_sha256"],
                                 "test_equals": args.expected_test}}
    ckpts = {k: v for k, v in (old.get("checkpoints") or {}).items() if k.split("/")[0] not in
             {key.split("/")[0] for key in entries}}
    mach = machine()
    for key, e in sorted(entries.items()):
        dest = staging / key
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(e["source"], dest)
        torch.load(dest, map_location="cpu", weights_only=True)
        stages = e["stages"]
        rec = {"method": key.split("/")[0], "file": key, "bytes": dest.stat().st_size, "sha256": sha256(dest),
               "commands": [s["command"] for s in stages],
               "wall_s": round(sum(s["wall_s"] for s in stages), 1),
               "wall_s_per_command": [s["wall_s"] for s in stages],
               "date": stages[-1]["finished"], "machine": mach,
               "load_average": [s["load_average_before"] for s in stages],
               "logs": [s["log"] for s in stages], "log_tail": stages[-1]["log_tail"]}
        rec["code"] = code
        rec.update(shared)
        for name, src in (e.get("copy") or {}).items():   # files the checkpoint depends on, beside it
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, staging / name)
        rec.update({k: v for k, v in e.items() if k not in ("source", "stages", "copy")})
        ckpts[key] = rec
    manifest = {
        "what": (f"learned anchors trained against {args.oracle}"
                 + (f" ({args.emulator_fit} fit)" if args.oracle != "measured" else "")
                 + f" at batch {args.batch_size} on the {TASKS_TRAIN} training tasks of DLRM-{TASKS_T} "
                   f"({args.ndevices} devices, cap {args.max_memory:g} GiB)"
                 + ("; AutoShard on its own tasks, drawn from every table (its checkpoint's training_tasks)"
                    if "autoshard/model.pt" in ckpts and ckpts["autoshard/model.pt"]["training_tasks"]["file"]
                    != "train_tasks.txt" else "")),
        "command": shlex.join(["python", rel(Path(__file__)), *argv]),
        "started": started, "finished": now(), "code": code,
        "python": sys.version.split()[0], "torch": torch.__version__, "machine": mach,
        "checkpoints": dict(sorted(ckpts.items())),
    }
    write_json(staging / MANIFEST, manifest)
    return manifest


def swap_in(staging: Path, out: Path) -> None:
    """Replace ``out`` by ``staging`` (renames on one file system; ``out`` is never half-written)."""
    old = out.parent / f".{out.name}.old"
    if old.exists():
        shutil.rmtree(old)
    if out.exists():
        os.replace(out, old)
    os.replace(staging, out)
    if old.exists():
        shutil.rmtree(old)


def main(argv=None) -> int:
    import signal
    import threading

    def on_term(signum, frame):
        raise KeyboardInterrupt   # unwinds like Ctrl-C: the running stage is stopped, the staging folder removed

    if threading.current_thread() is not threading.main_thread():
        return build(argv)
    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        return build(argv)
    finally:
        signal.signal(signal.SIGTERM, previous)


def build(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    methods = check_args(args)
    started, code = now(), code_version()     # the code as it was when the run started
    out, work = Path(args.out_dir), Path(args.work_dir)
    old = {}
    if (out / MANIFEST).is_file():
        try:
            old = json.loads((out / MANIFEST).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ShardError(f"{out / MANIFEST}: unreadable ({exc}); move it away to rebuild every stage") from None
    nsub = {"neuroshard": 4, "dreamshard": 1, "autoshard": 1 + (args.as_tasks == "all")}
    run = Runner(work / "logs", 1 + sum(nsub[m] for m in methods))
    print(f"anchors -> {out}/ ({', '.join(methods)}; {args.oracle}"
          + (f", {args.emulator_fit} fit" if args.oracle != "measured" else "")
          + f", batch {args.batch_size}, {args.ndevices} devices, cap {args.max_memory:g} GiB, seed {args.seed}); "
            f"logs in {work / 'logs'}/", flush=True)
    staging = out.parent / f".{out.name}.partial"
    work.mkdir(parents=True, exist_ok=True)
    try:
        tasks = stage_tasks(args, run, work)
        entries: dict = {}
        for m in methods:
            if m == "neuroshard":
                entries.update(stage_neuroshard(args, run, work))
            elif m == "dreamshard":
                entries.update(stage_dreamshard(args, run, work, tasks["train"]))
            elif args.as_tasks == "all":
                own = stage_autoshard_tasks(args, run, work)
                entries.update(stage_autoshard(args, run, work, own["train"], own))
            else:
                entries.update(stage_autoshard(args, run, work, tasks["train"]))
        if staging.exists():
            shutil.rmtree(staging)
        if out.exists():
            shutil.copytree(out, staging)
            for m in methods:                      # retrained methods start empty
                shutil.rmtree(staging / m, ignore_errors=True)
        else:
            staging.mkdir(parents=True)
        manifest = write_manifest(staging, args, tasks, entries, old, argv, started, code)
        swap_in(staging, out)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    total = 0
    for key, rec in manifest["checkpoints"].items():
        total += rec["bytes"]
        print(f"  {out / key}: {rec['bytes'] / 1e3:.0f} kB, {rec['wall_s']:.0f} s")
    print(f"done: {len(manifest['checkpoints'])} checkpoints ({total / 1e6:.2f} MB) and {out / MANIFEST}")
    return 0


if __name__ == "__main__":
    run_main(main)
