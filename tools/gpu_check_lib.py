"""One command for a GPU check (``tools/gpu_check.py``): what a lent GPU should measure, in one run.

On a machine with a CUDA GPU and fbgemm-gpu it

1. generates the default synthetic dataset at batch 65536 (the real dataset's batch; at 4096 a GPU
   is launch-bound and cannot tell plans apart), unless ``--data-dir`` names one, and checks its
   digest against the one the shipped H200 measurements were taken on;
2. measures the micro-benchmark's noise: one shard measured ``--noise-repeats`` times afresh;
3. plans the shipped test tasks (``data/gpu_measurements/tasks``: DLRM-50 on 4 devices, DLRM-100 on
   8) with the baselines, TorchRec (when importable) and any checkpoints given, and measures every
   plan on the GPUs present (more plan devices than GPUs: each device's compute in turn, the
   all-to-all modelled; see :class:`~shardcore.oracles.measured.driver.PlanEvaluator`);
4. prints the side-by-side table per task set, with the emulated-H200 oracle's prediction of the
   same plans beside it (its shard error and within-task rank agreement on these new measurements);
5. appends every measured shard to ``--shards-out`` in the format of
   ``data/gpu_measurements/*_shards.jsonl`` (plus the hardware, batch and date; a plan's device also
   its task and algorithm), and every device with row-wise blocks or data-parallel replicas, each piece
   described, to ``<shards-out>_pieces.jsonl`` (``--special-shards N`` adds N random such devices and
   prints the emulated H200's error on them per class);
6. given ``--compare [SET=]FILE`` (an ``eval.py --out`` file measured elsewhere, same tasks),
   prints the rank correlations of its costs with this run's;
7. writes everything to ``WORK_DIR/gpu_check.json``.

The whole run is bounded by ``--time-budget`` (default 450 s: within 8 minutes on one H100): a
stage that would start past it is skipped and said so, and a stage that runs over is stopped with
its workers. ``--device cpu`` runs the same steps at a tiny size (60 tables, batch 256, 3 tasks per
set) on logical CPU devices; the test suite runs it.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from shardcore import io
from shardcore.errors import ShardError
from shardcore.oracles.setting import refuse_predictions
from shardcore.oracles.setting import DEFAULT_TIMEOUT_S
from shardcore.types import Sharder
from shardcore.planning import PlanningContext
from shardcore.topology import DEFAULT_MAX_MEMORY_GB, Topology

ROOT = Path(__file__).resolve().parent.parent
MEASUREMENTS_DIR = ROOT / "data" / "gpu_measurements"
H200_DIGESTS = {65536: "4e3d570a611cf49a", 4096: "557cf3664262efe6"}
DEFAULT_ALGS = ("random", "lookup_greedy", "size_lookup_greedy", "torchrec")


@dataclass
class TaskSetSpec:
    name: str
    task_path: Path
    ndevices: int
    max_memory: float | None = None   # the set's own cap per device (GiB), else CheckConfig.max_memory


# The shipped test sets: task file, plan devices, the set's own memory cap (None: --max-memory). NS is the
# honest-margin records' NeuroShard-style set (results/honest_margins/, ns_tasks_test.txt: 10-60 tables,
# dims 4-128, 0.5 GB per device), so its records' plans can be measured as they were made.
# The -train sets are tasks of the training pool's tables (gen_tasks.py's default split: none of them is in
# any test task; DLRM-50-train is the learned anchors' 50 training tasks): the devices of their plans are
# cost-model data that a judge held out by a test task's tables never has to leave out.
SHIPPED_SETS = {"DLRM-50": ("dlrm_tasks_50_test.txt", 4, None), "DLRM-100": ("dlrm_tasks_100_test.txt", 8, None),
                "NS": ("ns_tasks_test.txt", 4, 0.5),
                "DLRM-50-train": ("dlrm_tasks_50_train.txt", 4, None), "DLRM-100-train": ("dlrm_tasks_100_train.txt", 8, None)}
SHARD_POOLS = ("all", "train")   # --shard-pool: the tables random and special shards are drawn from


def training_pool(ntables: int) -> list[int]:
    """The training pool of ``tools/gen_tasks.py``'s default split (train fraction 0.5, seed 0): the tables
    the shipped test tasks never hold (on the 856-table dataset: 428 tables; tests/test_gpu_truth.py checks
    the shipped test sets against it)."""
    import numpy as np

    from shardcore.data.taskgen import split_pools

    return sorted(int(i) for i in split_pools(ntables, 0.5, np.random.default_rng(0))[0])


@dataclass
class CheckConfig:
    device: str = "cuda"
    work_dir: Path = Path("results/gpu_check")
    data_dir: Path | None = None
    batch_size: int | None = None
    algs: tuple[str, ...] = DEFAULT_ALGS
    checkpoints: tuple[str, ...] = ()
    max_memory: float = DEFAULT_MAX_MEMORY_GB
    noise_repeats: int = 7
    bench_iters: int | None = None
    comm_iters: int | None = None
    compare: tuple[str, ...] = ()
    plans: tuple[str, ...] = ()
    plans_algs: tuple[str, ...] | None = None   # only these algorithms of the --plans files (None: all)
    random_shards: int = 0
    special_shards: int = 0
    special_slices: tuple[int, ...] = (4, 8)
    shard_pool: str = "all"
    confirm: bool = True
    shards_out: Path | None = None
    time_budget_s: float = 450.0
    sets: tuple[str, ...] = ("DLRM-50", "DLRM-100")
    gpus: tuple[int, ...] | None = None
    max_tasks: int | None = None
    log: list = field(default_factory=list)


class _Deadline(Exception):
    pass


def _say(cfg: CheckConfig, text: str = "") -> None:
    print(text, flush=True)
    cfg.log.append(text)


def _run(cmd: list[str], what: str, timeout: float) -> None:
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ShardError(f"{what} did not finish within {timeout:.0f} s") from None
    if proc.returncode != 0:
        last = (proc.stdout or "").strip().splitlines()[-1:] or ["no output"]
        raise ShardError(f"{what} failed (exit {proc.returncode}): {last[0]}")


def prepare_data(cfg: CheckConfig, remaining: float) -> Path:
    """The dataset directory: ``--data-dir`` or a freshly generated synthetic one."""
    if cfg.data_dir is not None:
        return cfg.data_dir
    out = cfg.work_dir / ("data_b65536" if cfg.device == "cuda" else "data_tiny")
    if (out / "data.pt").is_file() and (out / "table_configs.json").is_file():
        _say(cfg, f"data: reusing {out}")
        return out
    cmd = [sys.executable, str(ROOT / "tools" / "gen_dlrm_data.py"), "--synthetic", "--out-dir", str(out), "--quiet"]
    if cfg.device == "cuda":
        cmd += ["--batch-size", "65536"]
    else:
        cmd += ["--batch-size", str(cfg.batch_size or 256), "--num-tables", "60"]
    t0 = time.perf_counter()
    _run(cmd, "generating the dataset", timeout=max(10.0, remaining))
    _say(cfg, f"data: generated {out} in {time.perf_counter() - t0:.0f} s ({' '.join(cmd[2:])})")
    return out


def task_sets(cfg: CheckConfig, data_dir: Path) -> list[TaskSetSpec]:
    """The shipped test tasks (the ones the H200 measurements used) on the full dataset; on a tiny
    dataset, tasks generated for it."""
    from shardcore.dataset import load_dataset
    from shardcore.data.taskgen import TaskSpec, generate_tasks
    from shardcore.tasks import save_tasks

    tables = load_dataset(data_dir, with_lookups=False).tables
    ntables = len(tables)
    out = []
    if ntables >= 856:
        for name in cfg.sets:
            fname, n, cap = SHIPPED_SETS[name]
            path = MEASUREMENTS_DIR / "tasks" / fname
            if not path.is_file():
                raise ShardError(f"{path}: shipped task file missing")
            out.append(TaskSetSpec(f"{name} ({n})", path, n, cap))
        return out
    small = {"DLRM-50": (10, 4, None), "DLRM-100": (16, 8, None), "NS": (10, 4, (4, 8, 16, 32, 64, 128))}
    for name in cfg.sets:
        base = name.removesuffix("-train")
        T, n, dims = small[base]
        part = "train" if name != base else "test"
        path = cfg.work_dir / f"tasks_{base.lower().replace('-', '')}_{T}_{part}.txt"
        train, test = generate_tasks(tables, TaskSpec(T, T, num_train=3 if part == "train" else 0,
                                                      num_test=3 if part == "test" else 0, train_fraction=0.5, dims=dims))
        save_tasks(path, train if part == "train" else test)
        out.append(TaskSetSpec(f"{name}-tiny T{T} ({n})", path, n, SHIPPED_SETS[name][2]))
    return out


def _open(cfg: CheckConfig, data_dir: Path, ndevices: int, batch: int | None):
    from shardcore.oracles.factory import open_oracle

    kw = {}
    if cfg.bench_iters is not None:
        kw["bench_iters"] = cfg.bench_iters
    if cfg.comm_iters is not None:
        kw["comm_iters"] = cfg.comm_iters
    # no cache: a GPU check measures everything afresh
    return open_oracle(data_dir, ndevices, device_ids=list(cfg.gpus) if cfg.gpus else None, device=cfg.device,
                       batch_size=batch, cache=None, timeout_s=DEFAULT_TIMEOUT_S, host_lock=(cfg.device == "cpu"), **kw)


def _draw_tables(rng, ids_of, max_tables: int):
    """1..max_tables distinct indices of ``ids_of`` (the random stream random and special shards share)."""
    return ids_of[rng.choice(len(ids_of), size=int(rng.integers(1, min(max_tables, len(ids_of)) + 1)), replace=False)]


def random_shards(tables, n: int, seed: int = 0, max_tables: int = 60, pool: Sequence[int] | None = None) -> list:
    """``n`` random shards for cost-model data: 1..max_tables distinct tables of the whole dataset (of
    ``pool``, table indices, when given), in half of them each table given a random dim from 4..128 (a
    column shard below its own dim, a wider table above it)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    dims = (4, 8, 16, 32, 64, 128)
    ids_of = np.arange(len(tables)) if pool is None else np.asarray(sorted(pool), dtype=int)
    out = []
    for k in range(n):
        ids = _draw_tables(rng, ids_of, max_tables)
        shard = [tables[int(i)] for i in ids]
        if k % 2:
            shard = [t.with_dim(int(rng.choice(dims))) for t in shard]
        out.append(shard)
    return out


def special_shards(tables, n: int, seed: int = 1, max_tables: int = 30, slices=(4, 8),
                   pool: Sequence[int] | None = None) -> list:
    """``n`` random shards of row-wise blocks and data-parallel replicas, the pieces no GPU had measured
    before, shaped as a real plan's device: 1..max_tables distinct tables of the whole dataset, the
    even shards row-wise (each table, at random, one row block of it split over 2, 4 or 8 devices, or
    the whole table), the odd ones data-parallel (each table the replica of one batch slice ``(j, n)``,
    the same for the shard, n drawn from ``slices`` (default 4 or 8), or the whole table); 60% pieces, 40%
    whole tables. Other slices draw the same tables and row blocks (one random stream), so shards at 2 or
    16 ranks pair with those measured at 4 and 8. ``pool``: the tables are drawn from these indices only."""
    import numpy as np

    from shardcore.plan import DATA_PARALLEL, ROW_WISE, Sharding

    rng = np.random.default_rng(seed)
    ids_of = np.arange(len(tables)) if pool is None else np.asarray(sorted(pool), dtype=int)
    out = []
    for k in range(n):
        n_dp = int(rng.choice(tuple(slices)))
        j = int(rng.integers(n_dp))
        shard = []
        for i in _draw_tables(rng, ids_of, max_tables):
            t = tables[int(i)]
            if rng.random() < 0.6:
                if k % 2 == 0:
                    blocks = int(rng.choice((2, 4, 8)))
                    pieces = Sharding(ROW_WISE, tuple(range(blocks))).pieces(t, blocks)
                    t = pieces[int(rng.integers(len(pieces)))][1]
                else:
                    t = Sharding(DATA_PARALLEL, tuple(range(n_dp))).pieces(t, n_dp)[j][1]
            shard.append(t)
        out.append(shard)
    return out


CONFIRM_TOL = 0.02   # a device measured again that differs by more is measured a third time


def confirm_slowest(ev, result, shards, tol: float = CONFIRM_TOL) -> tuple[int, list[str]]:
    """Measure the plan's slowest device again afresh; where the two differ by more than ``tol``, a third
    time, and the device counts at the median of the three (fw and bw of that measurement). Repeated
    while the slowest device is one not yet confirmed. A transient that slows one measurement down (an
    H200 once: one device of a TorchRec plan 0.4-0.7 ms slow, the plan 14%) decides a plan's cost
    only through its slowest device. Updates ``result.cost_ms`` and ``result.device_costs_ms`` in place;
    returns (measurements made, a note per changed device)."""
    costs = [[float(x) for x in c] for c in result.device_costs_ms]
    done: set[int] = set()
    made, notes = 0, []
    while True:
        d = max(range(len(costs)), key=lambda i: sum(costs[i]))
        if d in done or not shards[d]:
            break
        done.add(d)
        runs = [(costs[d][0], costs[d][3])]
        for _ in range(2):
            c = ev.measure_devices([shards[d]], no_cache=True)[0]
            made += 1
            runs.append((float(c.fw_ms), float(c.bw_ms)))
            if abs(sum(runs[1]) / max(sum(runs[0]), 1e-12) - 1.0) <= tol:
                break
        if len(runs) == 3:
            med = sorted(runs, key=sum)[1]
            notes.append(f"device {d}: " + " / ".join(f"{sum(r):.3f}" for r in runs) + f" ms, {sum(med):.3f} counts")
            costs[d][0], costs[d][3] = med
    if notes:
        result.device_costs_ms = costs
        result.cost_ms = max(sum(c) for c in costs)
    return made, notes


def shard_class(tables) -> str:
    """``dp`` (holds a data-parallel replica), ``rw`` (a row-wise block) or ``tw/cw``."""
    kinds = {getattr(t, "kind", "table_wise") for t in tables}
    return "dp" if "data_parallel" in kinds else ("rw" if "row_wise" in kinds else "tw/cw")


def shard_line(tables, fw: float, bw: float, **extra) -> dict:
    """A measured shard as a JSON line; a shard with row-wise or data-parallel pieces also lists each
    piece (``pieces``: kind, rows, first row, the table's rows, batch slice ``[j, n]``), and goes to its
    own file: ``tables`` alone would read as whole tables."""
    from shardcore.plan import has_pieces

    line = {"tables": [[int(t.index), int(t.dim)] for t in tables], "fw_ms": fw, "bw_ms": bw, **extra}
    if has_pieces(tables):
        line["pieces"] = [{"index": int(t.index), "dim": int(t.dim), "kind": getattr(t, "kind", "table_wise"),
                           "rows": int(t.row), "row_start": int(getattr(t, "row_start", 0)),
                           "full_row": int(getattr(t, "full_row", 0) or t.row),
                           "batch_part": list(getattr(t, "batch_part", None) or ()) or None} for t in tables]
    return line


def noise_task(ntables: int, first_set_tasks):
    """The task whose first 25 tables are the noise shard: on the full dataset always DLRM-50's task 0 (the
    shard of every shipped H200 run, 5.62-5.71 ms: runs compare their machines by it), whichever
    set comes first; on a tiny dataset the first set's first task."""
    from shardcore.tasks import load_tasks

    if ntables >= 856:
        return load_tasks(MEASUREMENTS_DIR / "tasks" / SHIPPED_SETS["DLRM-50"][0], num_tables=ntables)[0]
    return first_set_tasks[0]


def measure_noise(cfg: CheckConfig, ev, tables) -> dict:
    """One shard (the first up to 25 tables of a task) measured ``noise_repeats`` times afresh."""
    shard = tables[:25]
    totals = []
    for _ in range(cfg.noise_repeats):
        c = ev.measure_devices([shard], no_cache=True)[0]
        totals.append(c.fw_ms + c.bw_ms)
    mean = statistics.fmean(totals)
    cv = 100.0 * (statistics.pstdev(totals) / mean) if mean > 0 else 0.0
    return {"tables": len(shard), "repeats": len(totals), "mean_ms": mean, "cv_pct": cv,
            "min_ms": min(totals), "max_ms": max(totals), "sample_spread_pct": ev.info.noise_pct}


def _eval_records(path: str, flag: str, use) -> None:
    """Feed every record of an ``eval.py --out`` file to ``use(line_number, record)``; an unreadable
    or malformed file is one line naming ``flag``."""
    try:
        lines = io.read_maybe_gzipped(path).decode("utf-8").splitlines()
        for k, line in enumerate(lines, 1):
            if line.strip():
                rec = json.loads(line)
                refuse_predictions(rec, f"{flag} {path}:{k}", "an oracle's costs (eval.py --out)")
                use(k, rec)
    except OSError as exc:
        raise ShardError(f"{flag} {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ShardError(f"{flag} {path}: not an eval.py --out file ({type(exc).__name__})") from None


def _load_compare(spec: str, names: Sequence[str]) -> tuple[str, dict, str]:
    name, _, path = spec.rpartition("=")
    name = _match_set(f"--compare {spec}", name or names[0], names)
    costs = {}

    def use(k, rec):
        if rec.get("cost_ms") is not None:
            costs[(int(rec["task"]), str(rec["alg"]))] = float(rec["cost_ms"])

    _eval_records(path, "--compare", use)
    if not costs:
        raise ShardError(f"--compare {path}: no measured plans (cost_ms) in it")
    return name, costs, path


class PlannedElsewhere(Sharder):
    """A sharder that returns the plans of an ``eval.py --out`` file (made on another machine, e.g.
    TorchRec's where TorchRec imports), matched to a task by its table ids."""

    def __init__(self, alg: str, plans: dict):
        self.name = alg
        self.plans = plans   # tuple of table ids -> the eval.py --out record of its plan

    def shard(self, tables, topology):
        from shardcore.errors import InfeasibleError
        from shardcore.evaluation.compare import record_plan

        rec = self.plans.get(tuple(t.index for t in tables))
        if rec is None:
            raise InfeasibleError(f"{self.name}: the --plans file has no plan for this task")
        if int(rec["ndevices"]) != topology.ndevices:
            raise InfeasibleError(f"{self.name}: the --plans file's plan has {rec['ndevices']} devices, "
                                  f"not {topology.ndevices}")
        try:
            plan = record_plan(rec, tables, topology.precision)
        except ShardError as exc:
            raise ShardError(f"{self.name}'s --plans plan: {exc}") from None
        return dataclasses.replace(plan, topology=topology)


def _load_plans(spec: str, names: Sequence[str], tasks_of: dict,
                algs: Sequence[str] | None = None) -> tuple[str, dict[str, PlannedElsewhere]]:
    """``[SET=]FILE``: the feasible plans of an eval.py --out file, per algorithm, keyed by the task's
    table ids (the file's task numbers index that set's task file); ``algs``: only those algorithms'."""
    name, _, path = spec.rpartition("=")
    name = _match_set(spec, name or names[0], names)
    tasks = tasks_of[name]
    by_alg: dict[str, dict] = {}

    def use(k, rec):
        if not rec.get("feasible") or rec.get("allocation") is None:
            return
        t = int(rec["task"])
        if not 0 <= t < len(tasks):
            raise ShardError(f"--plans {path}: line {k}: task {t} is not in {name}'s {len(tasks)} tasks")
        general = [s for s in rec.get("shardings") or [] if isinstance(s, dict)
                   and s.get("type") in ("row_wise", "data_parallel", "column_wise", "grid")]
        if general and len(rec["shardings"]) != len(tasks[t]):
            raise ShardError(f"--plans {path}: line {k}: the plan does not fit task {t} ({len(tasks[t])} tables)")
        splits = rec.get("splits")
        if not (general and splits is None) and len(splits or rec["allocation"]) != len(tasks[t]):
            raise ShardError(f"--plans {path}: line {k}: the plan does not fit task {t} ({len(tasks[t])} tables)")
        # the plan is built for the task's tables when it is planned (its shardings, or its compact form)
        by_alg.setdefault(str(rec["alg"]), {})[tuple(tasks[t].table_ids)] = rec

    _eval_records(path, "--plans", use)
    if algs is not None:
        by_alg = {a: p for a, p in by_alg.items() if a in algs}
        if not by_alg:
            raise ShardError(f"--plans {path}: no feasible plan of --plans-algs {','.join(algs)} in it")
    if not by_alg:
        raise ShardError(f"--plans {path}: no feasible plan in it")
    return name, {alg: PlannedElsewhere(alg, plans) for alg, plans in by_alg.items()}


def _match_set(spec: str, name: str, names: Sequence[str]) -> str:
    if name in names:
        return name
    matches = [n for n in names if n.startswith(name)]
    if len(matches) != 1:
        raise ShardError(f"{spec}: no task set named {name!r} (sets: {', '.join(names)})")
    return matches[0]


def rank_agreement(a: dict, b: dict) -> dict:
    """Spearman over the (task, alg) pairs both hold, overall and the mean within a task."""
    from shardcore.evaluation.report import spearman

    keys = sorted(set(a) & set(b))
    out = {"plans": len(keys), "overall": spearman([a[k] for k in keys], [b[k] for k in keys])}
    per = []
    for t in sorted({k[0] for k in keys}):
        ks = [k for k in keys if k[0] == t]
        rho = spearman([a[k] for k in ks], [b[k] for k in ks])
        if rho == rho:
            per.append(rho)
    out["within_task"] = statistics.fmean(per) if per else float("nan")
    out["tasks"] = len(per)
    rel = [abs(a[k] - b[k]) / b[k] for k in keys if b[k] > 0]
    out["mean_abs_diff_pct"] = 100.0 * statistics.fmean(rel) if rel else float("nan")
    return out


def run_check(cfg: CheckConfig) -> dict:
    from shardcore.cli import algorithms
    from shardcore.evaluation import report
    from shardcore.oracles.setting import dataset_digest
    from shardcore.dataset import load_dataset
    from shardcore.evaluation.compare import evaluate
    from shardcore.io import write_json
    from shardcore.oracles.emulated.oracle import EmulatedOracle
    from shardcore.tasks import load_tasks

    import torch

    t_start = time.monotonic()
    deadline = t_start + cfg.time_budget_s

    def remaining() -> float:
        return deadline - time.monotonic()

    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ShardError("--device cuda: no CUDA GPU is visible here (use --device cpu for the tiny CPU run)")
    try:
        import fbgemm_gpu  # noqa: F401
    except Exception as exc:
        raise ShardError(f"fbgemm-gpu does not load here ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}); "
                         "see README, 'GPUs'") from None
    cfg.work_dir.mkdir(parents=True, exist_ok=True)
    shards_out = cfg.shards_out or cfg.work_dir / "measured_shards.jsonl"
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    summary: dict = {"date": now, "device": cfg.device, "torch": torch.__version__, "sets": [],
                     "time_budget_s": cfg.time_budget_s}
    try:
        import fbgemm_gpu as _f

        summary["fbgemm_gpu"] = getattr(_f, "__version__", "?")
    except Exception:
        pass
    if cfg.device == "cuda":
        summary["gpu"] = torch.cuda.get_device_name(0)
        summary["gpus_visible"] = torch.cuda.device_count()

    def on_alarm(signum, frame):
        raise _Deadline()

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(1.0, cfg.time_budget_s))
    try:
        data_dir = prepare_data(cfg, remaining())
        ds = load_dataset(data_dir, with_lookups=True)
        batch = cfg.batch_size or ds.batch_size
        digest = dataset_digest(ds)
        summary.update(data_dir=str(data_dir), batch_size=batch, dataset_digest=digest)
        ref = H200_DIGESTS.get(ds.batch_size)
        same = ref == digest and ds.num_tables == 856
        _say(cfg, f"dataset {data_dir}: {ds.num_tables} tables, batch {ds.batch_size} (measuring at {batch}), "
                  f"digest {digest}" + (" = the shipped H200 measurements' dataset" if same else
                                        (f" (the shipped H200 measurements used {ref})" if ref else "")))
        sets = task_sets(cfg, data_dir)
        names = [s.name for s in sets]
        if cfg.shard_pool not in SHARD_POOLS:
            raise ShardError(f"--shard-pool must be one of {', '.join(SHARD_POOLS)}, got {cfg.shard_pool!r}")
        pool = training_pool(ds.num_tables) if cfg.shard_pool == "train" else None
        pool_text = "the whole dataset" if pool is None else f"the {len(pool)} tables of the training pool"
        summary["shard_pool"] = cfg.shard_pool
        compares = [_load_compare(c, names) for c in cfg.compare]
        all_tasks = {ts.name: load_tasks(ts.task_path, num_tables=ds.num_tables) for ts in sets}
        tasks_of = {name: tasks[: cfg.max_tasks] for name, tasks in all_tasks.items()}
        elsewhere: dict[str, dict[str, PlannedElsewhere]] = {}
        for spec in cfg.plans:   # a --plans file is checked against the whole set, --max-tasks or not
            name, got = _load_plans(spec, names, all_tasks, cfg.plans_algs)
            elsewhere.setdefault(name, {}).update(got)
            _say(cfg, f"{name}: plans made elsewhere for {', '.join(got)} ({spec})")
        algs = list(cfg.algs) + list(cfg.checkpoints)
        sharders = {}
        # every set is planned on its own topology; the context's says the precision, one host, the batch, and
        # no judged landscape (TorchRec plans with its own defaults)
        ctx = PlanningContext(Topology(1, cfg.max_memory, "fp16"), batch)
        for a in algs:
            try:
                sharders[a] = algorithms.build(a, ctx)
            except Exception as exc:  # e.g. TorchRec whose FBGEMM build lacks an operator it registers
                text = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
                _say(cfg, f"skipped {a}: {type(exc).__name__ if not isinstance(exc, ShardError) else 'error'}: {text}")
                summary.setdefault("skipped", {})[a] = text
        if not sharders:
            raise ShardError("no algorithm could be planned with")
        emu_ok = batch == ds.batch_size
        shard_lines: list[dict] = []
        for k, ts in enumerate(sets):
            if remaining() < 20:
                _say(cfg, f"{ts.name}: skipped, {remaining():.0f} s of the time budget left")
                continue
            tasks = tasks_of[ts.name]
            set_key = ts.name.split(" ")[0]   # the SHIPPED_SETS name (emulator.GPUCHECK_SETS reads it)
            set_sharders = dict(sharders)
            for alg, sh in elsewhere.get(ts.name, {}).items():
                set_sharders[alg if alg not in set_sharders else f"{alg} (planned elsewhere)"] = sh
            with _open(cfg, data_dir, ts.ndevices, batch) as ev:
                _say(cfg, f"\n== {ts.name}: {len(tasks)} tasks from {ts.task_path.name}, {ev.hardware}, batch {ev.batch_size}; "
                          f"workers up in {ev.info.startup_s:.1f} s")
                _say(cfg, f"   compute {ev.parts['compute']}; communication {ev.parts['comm']}")
                entry: dict = {"name": ts.name, "ndevices": ts.ndevices, "hardware": ev.hardware, "parts": ev.parts,
                               "tasks": len(tasks), "plans": [], "finished": False}
                summary["sets"].append(entry)   # kept, with the plans measured so far, if the budget runs out
                if k == 0:
                    noise = measure_noise(cfg, ev, noise_task(ds.num_tables, tasks).tables(ds.tables))
                    summary["noise"] = noise
                    _say(cfg, f"   micro-benchmark noise: one {noise['tables']}-table shard measured {noise['repeats']} "
                              f"times afresh: {noise['mean_ms']:.4f} ms, CV {noise['cv_pct']:.2f}% "
                              f"(range {noise['min_ms']:.4f}..{noise['max_ms']:.4f})")
                if k == 0 and cfg.random_shards:
                    shards = random_shards(ds.tables, cfg.random_shards, pool=pool)
                    t1 = time.perf_counter()
                    for i in range(0, len(shards), 10):   # in chunks, so a budget cut keeps what was measured
                        costs = ev.measure_devices(shards[i:i + 10], no_cache=True)
                        for sh, c in zip(shards[i:i + 10], costs):
                            shard_lines.append(shard_line(sh, c.fw_ms, c.bw_ms, batch_size=ev.batch_size, kind="random",
                                                          hardware=ev.hardware, date=now, pool=cfg.shard_pool))
                    _say(cfg, f"   {len(shards)} random shards (1-60 tables of {pool_text}, dims 4-128) measured in "
                              f"{time.perf_counter() - t1:.0f} s")
                if k == 0 and cfg.special_shards:
                    summary["special_shards"] = measure_special(cfg, ev, ds.tables, data_dir, batch, emu_ok,
                                                                shard_lines, now, pool)
                plans = {}

                confirmed = {"plans": 0, "measurements": 0, "changed": []}

                def keep(result, task):
                    if result.measured is not None:   # every measured shard, for the emulator's data
                        shard_tables = result.plan().device_pieces
                        if cfg.confirm and result.cost_ms is not None:
                            extra, notes = confirm_slowest(ev, result, shard_tables)
                            confirmed["plans"] += 1
                            confirmed["measurements"] += extra
                            confirmed["changed"] += [f"{result.alg} task {result.task} {n}" for n in notes]
                        for tables, (fw, _fc, _bc, bw) in zip(shard_tables, result.device_costs_ms):
                            if tables:
                                shard_lines.append(shard_line(tables, fw, bw, batch_size=ev.batch_size,
                                                              hardware=ev.hardware, date=now,
                                                              task=result.task, alg=result.alg, set=set_key))
                    if result.cost_ms is not None:
                        plans[(result.task, result.alg)] = (task.tables(ds.tables), result)
                        entry["plans"].append({"task": result.task, "alg": result.alg, "cost_ms": result.cost_ms,
                                               "device_costs_ms": result.device_costs_ms})
                    elif not result.feasible:
                        entry["plans"].append({"task": result.task, "alg": result.alg, "error": result.error})

                t1 = time.perf_counter()
                results = evaluate(tasks, ds.tables, set_sharders, Topology(ts.ndevices, ts.max_memory or cfg.max_memory, "fp16"),
                                   oracle=ev, on_result=keep)
                entry["measure_s"] = time.perf_counter() - t1
                noise_pct = ev.info.noise_pct
                if cfg.confirm:
                    entry["confirmed"] = confirmed
                    _say(cfg, f"   confirmed: each plan's slowest device measured again afresh ({confirmed['plans']} "
                              f"plans, {confirmed['measurements']} more measurements); {len(confirmed['changed'])} "
                              f"differed by more than {100 * CONFIRM_TOL:.0f}% and count at the median of three"
                              + (": " + "; ".join(confirmed["changed"]) if confirmed["changed"] else ""))
            _say(cfg, report.measured_summary(results))
            verdict = report.noise_verdict(results, noise_pct)
            if verdict:
                _say(cfg, verdict)
            entry["verdict"] = verdict
            entry["finished"] = True
            measured = {key: r.cost_ms for key, (_, r) in plans.items()}
            if emu_ok:
                entry["emulated_h200"] = emulator_agreement(cfg, EmulatedOracle, data_dir, ts.ndevices, batch, plans)
            for name, other, path in compares:
                if name == ts.name:
                    agr = rank_agreement(measured, other)
                    agr["file"] = path
                    entry.setdefault("compare", []).append(agr)
                    _say(cfg, f"   vs {path}: Spearman over {agr['plans']} plans {agr['overall']:.3f}, "
                              f"within a task {agr['within_task']:.3f} (mean of {agr['tasks']} tasks); costs differ "
                              f"by {agr['mean_abs_diff_pct']:.1f}% on average")
    except _Deadline:
        summary["stopped"] = f"time budget of {cfg.time_budget_s:.0f} s exceeded"
        _say(cfg, f"stopped: the time budget of {cfg.time_budget_s:.0f} s ran out; what was measured is kept")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if "shard_lines" in locals() and shard_lines:
            # shards with row-wise / data-parallel pieces go to a file of their own (see shard_line)
            special_out = shards_out.with_name(shards_out.stem + "_pieces" + shards_out.suffix)
            for path, lines in ((shards_out, [x for x in shard_lines if "pieces" not in x]),
                                (special_out, [x for x in shard_lines if "pieces" in x])):
                if lines:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    with open(path, "a", encoding="utf-8") as fh:
                        for line in lines:
                            fh.write(json.dumps(line) + "\n")
                    _say(cfg, f"appended {len(lines)} measured shards to {path}")
        summary["seconds"] = time.monotonic() - t_start
        summary["log"] = cfg.log
        write_json(cfg.work_dir / "gpu_check.json", summary)
    print(f"gpu_check: done in {summary['seconds']:.0f} s; summary in {cfg.work_dir / 'gpu_check.json'}")
    return summary


def emulator_agreement(cfg: CheckConfig, oracle_cls, data_dir: Path, ndevices: int, batch: int, plans: dict) -> dict:
    """The emulated-H200 oracle's costs of the same plans beside the measured ones."""
    try:
        emu = oracle_cls(data_dir, ndevices, batch_size=batch)
    except ShardError as exc:
        _say(cfg, f"   emulated:h200 not compared: {exc}")
        return {"error": str(exc)}
    shard_err, predicted, measured, by_class = [], {}, {}, {}
    for key, (tables, r) in plans.items():
        plan = r.plan()
        shards = plan.device_pieces
        e = emu.evaluate(shards)
        for s, dev_m, dev_e in zip(shards, r.device_costs_ms, e.device_costs_ms):
            m = dev_m[0] + dev_m[3]
            if s and m > 0:
                shard_err.append(abs(dev_e[0] + dev_e[3] - m) / m)
                by_class.setdefault(shard_class(s), []).append((dev_e[0] + dev_e[3] - m) / m)
        # compare compute only: the one-GPU run models its all-to-all the same way as the emulator
        predicted[key] = max(d[0] + d[3] for d in e.device_costs_ms)
        measured[key] = max(d[0] + d[3] for d in r.device_costs_ms)
    agr = rank_agreement(predicted, measured)
    mape = 100.0 * statistics.fmean(shard_err) if shard_err else float("nan")
    _say(cfg, f"   emulated:h200 vs measured (compute of the slowest device): shard MAPE {mape:.1f}% over "
              f"{len(shard_err)} shards; Spearman over plans {agr['overall']:.3f}, within a task "
              f"{agr['within_task']:.3f}")
    classes = class_errors(by_class)
    _say(cfg, "   by shard class: " + "; ".join(f"{c} {v['shards']} shards, MAPE {v['mape_pct']:.1f}%, "
                                                  f"bias {v['bias_pct']:+.1f}%" for c, v in classes.items()))
    return {"shard_mape_pct": mape, "by_class": classes, **agr}


def class_errors(by_class: dict) -> dict:
    """Per shard class: count, MAPE and mean signed error (%) of the emulator against the measurement."""
    return {c: {"shards": len(v), "mape_pct": 100.0 * statistics.fmean(abs(x) for x in v),
                "bias_pct": 100.0 * statistics.fmean(v)} for c, v in sorted(by_class.items()) if v}


def measure_special(cfg: CheckConfig, ev, tables, data_dir: Path, batch: int, emu_ok: bool,
                    shard_lines: list, now: str, pool: Sequence[int] | None = None) -> dict:
    """Measure ``cfg.special_shards`` random shards of row-wise blocks and data-parallel replicas
    (:func:`special_shards`, of the tables ``pool`` when given), append them to ``shard_lines`` and
    compare the emulated H200 on them."""
    from shardcore.oracles.emulated.oracle import EmulatedOracle

    shards = special_shards(tables, cfg.special_shards, slices=cfg.special_slices, pool=pool)
    t1 = time.perf_counter()
    measured = []
    for i in range(0, len(shards), 10):   # in chunks, so a budget cut keeps what was measured
        costs = ev.measure_devices(shards[i:i + 10], no_cache=True)
        for sh, c in zip(shards[i:i + 10], costs):
            measured.append(c.fw_ms + c.bw_ms)
            shard_lines.append(shard_line(sh, c.fw_ms, c.bw_ms, batch_size=ev.batch_size, kind="random_pieces",
                                          hardware=ev.hardware, date=now, pool=cfg.shard_pool))
    _say(cfg, f"   {len(shards)} random shards of row-wise blocks and data-parallel replicas measured in "
              f"{time.perf_counter() - t1:.0f} s")
    out: dict = {"shards": len(shards)}
    if emu_ok:
        emu = EmulatedOracle(data_dir, ev.ndevices, batch_size=batch)
        by_class: dict = {}
        for sh, m in zip(shards, measured):
            e = emu.measure_devices([sh])[0]
            if m > 0:
                by_class.setdefault(shard_class(sh), []).append((e.fw_ms + e.bw_ms - m) / m)
        out["emulated_h200"] = class_errors(by_class)
        _say(cfg, "   emulated:h200 on them (held out): " + "; ".join(
            f"{c} {v['shards']} shards, MAPE {v['mape_pct']:.1f}%, bias {v['bias_pct']:+.1f}%"
            for c, v in out["emulated_h200"].items()))
    return out
