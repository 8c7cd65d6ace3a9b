"""Planning time and peak memory of every algorithm as tables and devices grow
(``tools/bench_planning.py``, :func:`bench_planning`).

Every algorithm plans in a fresh child process (``python -m experiments.planning --bench-child``):
time = median of a few calls; memory = the rise of the process's peak resident set size (``VmHWM``,
reset through ``/proc/self/clear_refs`` after ``malloc_trim``) during one call above its resident size
just before it, which counts native (torch, numpy) allocations as well as Python objects. Where the
kernel does not offer the reset, ``tracemalloc``'s peak (Python and numpy allocations only) is
reported instead and the output says so. No hardware is measured.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import re
import selectors
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from shardcore import registry

from shardcore.evaluation import report
from shardcore.errors import InfeasibleError, ShardError
from shardcore.io import write_text
from shardcore.tables import TableConfig, total_memory_gb
from shardcore.topology import DEFAULT_MAX_MEMORY_GB, Topology

from .config import PLUGINS, all_algs, known_algs, label, learned_methods, order_algs, planners
from .facts import machine_info, now, software_versions
from .output import write_csv
from .procs import kill_group
from .training import model_checkpoint

ROOT = Path(__file__).resolve().parent.parent   # the repository: the child imports this package from it
# ------------------------------------------------------------------------------------------------
# Planning time and memory (tools/bench_planning.py)
# ------------------------------------------------------------------------------------------------

DEFAULT_TABLE_SIZES = (50, 100, 200, 400, 856)
DEFAULT_DEVICE_COUNTS = (4, 8, 16, 32, 64, 128)


@dataclass
class BenchConfig:
    data_dir: str = "data/dlrm_datasets"
    out_dir: str = "results"
    algs: tuple[str, ...] | None = None
    table_sizes: tuple[int, ...] = DEFAULT_TABLE_SIZES
    tables_ndevices: int = 4
    device_counts: tuple[int, ...] = DEFAULT_DEVICE_COUNTS
    devices_tables: int = 400
    max_memory: float = DEFAULT_MAX_MEMORY_GB
    headroom: float = 1.5
    precision: str = "fp16"
    repeats: int = 3
    time_limit_s: float = 30.0
    seed: int = 0
    model_paths: dict = field(default_factory=dict)
    models_dir: str | None = "models/experiments/small"
    quiet: bool = False
    plugin_oracle: str = "emulated:h200"   # the landscape the declared planners (shardkit_methods.PLANNERS) plan for
    devices_per_host: int = 0              # hosts of G devices (the planners that model the exchange plan for them)
    command: list = field(default_factory=lambda: list(sys.argv))


def table_sizes_for(sizes: Sequence[int], num_tables: int) -> list[int]:
    """Sizes up to the dataset's table count; a size above it becomes the whole dataset."""
    out = sorted({min(int(s), num_tables) for s in sizes if int(s) >= 1})
    return out


def bench_cap(tables: Sequence[TableConfig], ndevices: int, max_memory: float, headroom: float,
              precision: str) -> float:
    """The per-device cap: the usual cap, raised so that the task fits with ``headroom`` to spare."""
    biggest = max(t.memory_gb(precision) for t in tables)
    need = max(headroom * total_memory_gb(tables, precision) / ndevices, 1.01 * biggest)
    return float(max(max_memory, need))


def _bench_learned(cfg: BenchConfig, notes: list[str]) -> dict[str, str]:
    out = {}
    for method in learned_methods():
        if cfg.algs and method not in cfg.algs:
            continue
        path = cfg.model_paths.get(method)
        if path:
            if not os.path.isfile(path):
                raise ShardError(f"--{method}-model: checkpoint not found: {path}")
            out[method] = str(path)
            continue
        try:
            spec = registry.get(method)
        except ShardError:
            notes.append(f"{method}: skipped: the {method} package is not in this installation")
            continue
        found = None
        if cfg.models_dir and Path(cfg.models_dir).is_dir():
            for folder in sorted(Path(cfg.models_dir).glob(f"{method}_*dev"),
                                 key=lambda p: int(re.sub(r"\D", "", p.name.split("_")[-1]) or 0)):
                found = model_checkpoint(spec, folder)
                if found is not None:
                    break
        if found is None:
            notes.append(f"{method}: skipped: no checkpoint (give --{method}-model, or train it with "
                         f"tools/run_experiments.py; looked in {cfg.models_dir})")
        else:
            out[method] = str(found)
    return out


def _read_status() -> dict[str, int]:
    with open("/proc/self/status") as fh:
        text = fh.read()
    return {k: int(re.search(k + r":\s+(\d+)", text).group(1)) for k in ("VmRSS", "VmHWM")}


def _reset_peak() -> bool:
    try:
        import ctypes
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _bench_child_main() -> None:
    """Child process of :func:`bench_planning`: a JSON spec on stdin, one ``BENCH {json}`` line per point."""
    import numpy as np
    import torch

    torch.set_num_threads(int(os.environ.get("SHARDKIT_NUM_THREADS", "1")))
    spec = json.loads(sys.stdin.read())
    from shardcore.cli import algorithms
    from shardcore.dataset import load_dataset
    from shardcore.planning import Landscape, PlanningContext

    def emit(obj):
        sys.stdout.write("BENCH " + json.dumps(obj) + "\n")
        sys.stdout.flush()

    try:
        tables = load_dataset(spec["data_dir"], with_lookups=False).tables
        # every size is planned on its own topology; the context's gives the precision and the hosts
        hosts = int(spec.get("devices_per_host") or 0)
        ctx = PlanningContext(Topology(max(2, hosts), 1.0, spec["precision"], devices_per_host=hosts),
                              spec.get("batch_size"), Landscape(spec.get("oracle"), data_dir=spec["data_dir"]),
                              spec["seed"])
        sharder = algorithms.build(spec["alg_path"], ctx)
        # warm-up on a small task: lazy initialisation is not charged to the first size
        warm = tables[: min(8, len(tables))]
        try:
            sharder.shard(warm, Topology(2, bench_cap(warm, 2, spec["max_memory"], spec["headroom"], spec["precision"]),
                                         spec["precision"]))
        except ShardError:
            pass
    except Exception as exc:
        emit({"fatal": f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"})
        return
    perm = np.random.default_rng(spec["seed"]).permutation(len(tables)).tolist()
    stopped: dict[str, str] = {}
    rss_ok = _reset_peak() and os.path.exists("/proc/self/status")
    for point in spec["points"]:
        sweep = point["sweep"]
        base = {"index": point["index"]}
        if sweep in stopped:
            emit(dict(base, status="skipped", error=stopped[sweep]))
            continue
        task = [tables[i] for i in sorted(perm[: point["num_tables"]])]
        d = point["ndevices"]
        cap = bench_cap(task, d, spec["max_memory"], spec["headroom"], spec["precision"])
        times = []
        mem_mb = None
        status, error = "ok", ""
        try:
            topology = Topology(d, cap, spec["precision"], devices_per_host=int(spec.get("devices_per_host") or 0))
            gc.collect()
            if rss_ok:
                _reset_peak()
                before = _read_status()["VmRSS"]
                t0 = time.perf_counter()
                sharder.shard(task, topology)
                times.append(time.perf_counter() - t0)
                mem_mb = max(0, _read_status()["VmHWM"] - before) / 1024.0
            else:
                import tracemalloc
                tracemalloc.start()
                sharder.shard(task, topology)
                mem_mb = tracemalloc.get_traced_memory()[1] / 2 ** 20
                tracemalloc.stop()
            while len(times) < spec["repeats"] and sum(times) < spec["time_limit_s"]:
                t0 = time.perf_counter()
                sharder.shard(task, topology)
                times.append(time.perf_counter() - t0)
        except InfeasibleError as exc:
            status, error = "infeasible", str(exc)
        except Exception as exc:
            status, error = "failed", f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        row = dict(base, status=status, error=error, cap_gb=cap, repeats=len(times),
                   planning_ms=1e3 * statistics.median(times) if times else None,
                   planning_ms_min=1e3 * min(times) if times else None, peak_mem_mb=mem_mb,
                   mem_method="rss" if rss_ok else "tracemalloc")
        emit(row)
        if times and min(times) > spec["time_limit_s"]:
            stopped[sweep] = (f"skipped: a smaller size took {min(times):.1f} s, over the "
                              f"{spec['time_limit_s']:g} s limit")
        elif status == "failed":
            stopped[sweep] = "skipped after a failure at a smaller size"


def _run_bench_child(spec: dict, points: list[dict], hard_s: float, start_s: float
                     ) -> tuple[dict[int, dict], str, str]:
    """Run one child over ``points``; returns rows by point index (missing ones: not reached), the
    reason it ended early ('' when it finished) and how: "failed", "timeout" or ''."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    import tempfile

    errfile = tempfile.TemporaryFile()   # not a pipe: a chatty child can never block on it
    proc = subprocess.Popen([sys.executable, "-m", "experiments.planning", "--bench-child"], cwd=str(ROOT),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errfile, env=env,
                            start_new_session=True)
    proc.stdin.write(json.dumps(dict(spec, points=points)).encode())
    proc.stdin.close()
    rows: dict[int, dict] = {}
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    buf = b""
    deadline = time.perf_counter() + start_s + hard_s
    why, ended = "", ""
    try:
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                why, ended = f"stopped: no answer within {hard_s:g} s", "timeout"
                kill_group(proc)
                break
            if not sel.select(timeout=min(left, 1.0)):
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                text = line.decode(errors="replace")
                if not text.startswith("BENCH "):
                    continue
                obj = json.loads(text[6:])
                if "fatal" in obj:
                    why, ended = f"failed: {obj['fatal']}", "failed"
                    continue
                rows[obj["index"]] = obj
                deadline = time.perf_counter() + hard_s
    except BaseException:
        kill_group(proc)
        raise
    finally:
        sel.close()
    proc.stdout.close()
    try:
        rc = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        rc = proc.wait()
    errfile.seek(0)
    err = errfile.read().decode(errors="replace")
    errfile.close()
    if not why and len(rows) < len(points):
        tail = " / ".join(l.strip() for l in err.strip().splitlines()[-2:])
        why = f"failed: the planning process exited with status {rc}" + (f": {tail}" if tail else "")
        ended = "failed"
    return rows, why, ended


BENCH_FIELDS = ["alg", "label", "sweep", "num_tables", "ndevices", "cap_gb", "status", "planning_ms",
                "planning_ms_min", "repeats", "peak_mem_mb", "mem_method", "error"]


def bench_planning(cfg: BenchConfig, progress: bool | None = None) -> dict:
    """Planning time and peak memory per algorithm as tables and devices grow; returns a summary."""
    from tqdm import tqdm

    from shardcore.evaluation import plots
    from shardcore.dataset import load_dataset

    if cfg.repeats < 1 or cfg.time_limit_s <= 0 or cfg.headroom < 1.0:
        raise ShardError("--repeats must be >= 1, --time-limit > 0 and --headroom >= 1")
    t_start = time.perf_counter()
    dataset = load_dataset(cfg.data_dir, with_lookups=False)
    n = dataset.num_tables
    sizes = table_sizes_for(cfg.table_sizes, n)
    dev_tables = min(cfg.devices_tables, n)
    counts = sorted(set(int(d) for d in cfg.device_counts))
    if not sizes or not counts or min(counts) < 1 or cfg.tables_ndevices < 1:
        raise ShardError("--tables and --devices need positive values")
    notes: list[str] = []
    algs = list(cfg.algs) if cfg.algs else [a for a in all_algs() if a not in learned_methods()]
    bad = [a for a in algs if a not in known_algs()]
    if bad:
        raise ShardError(f"--algs: unknown algorithm {bad[0]!r}")
    for plugin in [a for a in algs if a in PLUGINS]:
        if importlib.util.find_spec(plugin) is None:
            notes.append(f"{plugin}: skipped: TorchRec is not installed")
            algs.remove(plugin)
    learned = _bench_learned(cfg, notes)
    targets = [(a, a) for a in algs if a not in learned_methods()] + [(m, p) for m, p in learned.items()]
    targets = sorted(targets, key=lambda x: order_algs([t[0] for t in targets]).index(x[0]))
    batch_size = None
    try:
        batch_size = load_dataset(cfg.data_dir).batch_size
    except ShardError:
        pass
    points = ([{"sweep": "tables", "num_tables": s, "ndevices": cfg.tables_ndevices} for s in sizes]
              + [{"sweep": "devices", "num_tables": dev_tables, "ndevices": d} for d in counts])
    for i, p in enumerate(points):
        p["index"] = i
    mem_methods = set()
    rows = []
    print(f"planning benchmark: {', '.join(a for a, _ in targets)}; tables {sizes} on {cfg.tables_ndevices} "
          f"devices; devices {counts} with {dev_tables} tables; median of up to {cfg.repeats} calls, "
          f"{cfg.time_limit_s:g} s limit per size")
    hard = max(4 * cfg.time_limit_s, cfg.time_limit_s + 60)
    with tqdm(total=len(targets) * len(points), desc="planning", unit="size",
              disable=(not progress) if progress is not None else None) as bar:
        for alg, path in targets:
            spec = {"data_dir": os.path.abspath(cfg.data_dir), "alg_path": path, "seed": cfg.seed,
                    "batch_size": batch_size, "max_memory": cfg.max_memory, "headroom": cfg.headroom,
                    "precision": cfg.precision, "repeats": cfg.repeats, "time_limit_s": cfg.time_limit_s}
            if alg in planners():   # a declared planner with its own cost model plans for the emulated landscape here
                spec["oracle"] = cfg.plugin_oracle
            if cfg.devices_per_host:   # shardkit's model and TorchRec's topology (local_world_size) alike
                spec["devices_per_host"] = cfg.devices_per_host
            todo = list(points)
            got: dict[int, dict] = {}
            while todo:
                res, why, ended = _run_bench_child(spec, todo, hard, start_s=180.0)
                got.update(res)
                rest = [p for p in todo if p["index"] not in got]
                if not rest:
                    break
                # the point the child was on ended it: record it, skip the rest of its sweep
                cur = rest[0]
                got[cur["index"]] = {"status": ended or "timeout",
                                     "error": why or "the planning process ended early"}
                same = [p for p in rest[1:] if p["sweep"] == cur["sweep"]]
                for p in same:
                    got[p["index"]] = {"status": "skipped", "error": f"skipped after: {why}"}
                if ended == "failed" and not res:
                    for p in rest:
                        got.setdefault(p["index"], {"status": "failed", "error": why})
                todo = [p for p in rest if p["index"] not in got]
            for p in points:
                r = got.get(p["index"], {})
                if r.get("mem_method"):
                    mem_methods.add(r["mem_method"])
                rows.append({"alg": alg, "label": label(alg), "sweep": p["sweep"], "num_tables": p["num_tables"],
                             "ndevices": p["ndevices"],
                             "cap_gb": f"{r['cap_gb']:.4f}" if r.get("cap_gb") is not None else "",
                             "status": r.get("status", "failed"),
                             "planning_ms": f"{r['planning_ms']:.4f}" if r.get("planning_ms") is not None else "",
                             "planning_ms_min": (f"{r['planning_ms_min']:.4f}"
                                                 if r.get("planning_ms_min") is not None else ""),
                             "repeats": r.get("repeats", 0),
                             "peak_mem_mb": f"{r['peak_mem_mb']:.3f}" if r.get("peak_mem_mb") is not None else "",
                             "mem_method": r.get("mem_method", ""), "error": r.get("error", "")})
                bar.update(1)
            bad_rows = [x for x in rows if x["alg"] == alg and x["status"] not in ("ok",)]
            if bad_rows and not cfg.quiet:
                tqdm.write(f"{alg}: {len(bad_rows)} size(s) not planned ({bad_rows[0]['status']}: "
                           f"{bad_rows[0]['error'][:120]})")
    out = Path(cfg.out_dir)
    tab = [r for r in rows if r["sweep"] == "tables"]
    dev = [r for r in rows if r["sweep"] == "devices"]
    write_csv(out / "planning_tables.csv", tab, BENCH_FIELDS)
    write_csv(out / "planning_devices.csv", dev, BENCH_FIELDS)
    method = ("rss" if mem_methods == {"rss"} else "tracemalloc" if mem_methods == {"tracemalloc"}
              else "mixed" if mem_methods else "none")
    mem_text = {"rss": "peak resident set size (VmHWM) during one planning call above the resident size just "
                       "before it, in a fresh process per algorithm (native and Python allocations)",
                "tracemalloc": "tracemalloc's peak during one planning call (Python and numpy allocations only; "
                               "torch tensors are not counted)",
                }.get(method, method)
    series = {}
    for r in rows:
        if r["status"] == "ok" and r["planning_ms"]:
            key = "num_tables" if r["sweep"] == "tables" else "ndevices"
            series.setdefault((r["sweep"], r["label"]), []).append(
                (int(r[key]), float(r["planning_ms"]), float(r["peak_mem_mb"]) if r["peak_mem_mb"] else None))
    plots.plot_planning(series, out / "planning.png",
                        tables_title=f"tables grow ({cfg.tables_ndevices} devices)",
                        devices_title=f"devices grow ({dev_tables} tables)")
    info = {"date": now(), "command": list(cfg.command), "machine": machine_info(), "versions": software_versions(),
            "memory_method": mem_text, "notes": notes, "seconds": round(time.perf_counter() - t_start, 1)}
    md = planning_markdown(cfg, rows, sizes, counts, dev_tables, info)
    write_text(out / "planning.md", md)
    files = ["planning_tables.csv", "planning_devices.csv", "planning.md", "planning.png"]
    print()
    print(md.split("## Peak memory")[0].rstrip())
    for n_ in notes:
        print(f"note: {n_}")
    print(f"wrote {', '.join(files)} to {cfg.out_dir}/ in {info['seconds']:.0f} s")
    info["files"] = files
    return info


def planning_markdown(cfg: BenchConfig, rows: Sequence[dict], sizes, counts, dev_tables, info) -> str:
    def table(sweep, key, values, field_, fmt):
        labels = list(dict.fromkeys(r["label"] for r in rows))
        out = []
        for lab in labels:
            cells = []
            for v in values:
                r = next((x for x in rows if x["label"] == lab and x["sweep"] == sweep and int(x[key]) == v), None)
                if r is None:
                    cells.append("")
                elif r["status"] != "ok":
                    cells.append(r["status"])
                else:
                    cells.append(fmt(float(r[field_])) if r[field_] != "" else "-")
            out.append([lab] + cells)
        return report.format_table(["algorithm"] + [str(v) for v in values], out)

    ms = lambda v: f"{v:.3g}" if v < 100 else f"{v:.0f}"  # noqa: E731
    mb = lambda v: f"{v:.2f}"  # noqa: E731
    lines = ["# Planning time and memory", "",
             f"Generated by `{shlex.join(cfg.command)}` on {info['date']} ({info['machine'].get('cpu')}, "
             f"{info['machine'].get('cpu_count')} CPU cores). Planning only: no hardware measurement. Tables "
             f"drawn at random (seed {cfg.seed}) from the dataset, nested; memory cap per device = max("
             f"{cfg.max_memory:g} GiB, {cfg.headroom:g} × the task's memory / devices) so every task is "
             f"feasible. Time: median of up to {cfg.repeats} calls, ms; after one size takes longer than "
             f"{cfg.time_limit_s:g} s the larger sizes of that sweep are skipped.", "",
             f"## Planning time (ms), tables grow ({cfg.tables_ndevices} devices)", "",
             table("tables", "num_tables", sizes, "planning_ms", ms), "",
             f"## Planning time (ms), devices grow ({dev_tables} tables)", "",
             table("devices", "ndevices", counts, "planning_ms", ms), "",
             "## Peak memory (MB)", "", f"Method: {info['memory_method']}.", "",
             f"Tables grow ({cfg.tables_ndevices} devices):", "",
             table("tables", "num_tables", sizes, "peak_mem_mb", mb), "",
             f"Devices grow ({dev_tables} tables):", "",
             table("devices", "ndevices", counts, "peak_mem_mb", mb), ""]
    if info["notes"]:
        lines += ["## Notes", ""] + [f"- {n}" for n in info["notes"]] + [""]
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:] == ["--bench-child"]:
        from shardcore.processes import exit_now

        _bench_child_main()
        exit_now(0)   # without the interpreter's teardown (0.5-0.9 s once torch is imported)
    else:
        print("usage: python -m experiments.planning --bench-child (internal; see tools/bench_planning.py)",
              file=sys.stderr)
        sys.exit(2)
