"""The experiment runner: the paper-style results table, plots and planning-scaling figures.

``tools/run_experiments.py`` (:func:`run_experiments`):

1. generate the standard DreamShard-style task sets with :mod:`shardcore.taskgen` (one train/test
   split of the dataset's tables shared by every set, so test tasks hold only tables that no learned
   method saw in training);
2. train the learned methods (``train_dreamshard.py``, ``train_neuroshard.py``,
   ``train_autoshard.py``, each as a subprocess) on the train split of one task set per device count,
   or load a given / existing checkpoint; a method whose package or script is missing, whose
   training fails or that ``--skip-train`` leaves without a checkpoint is skipped with a note;
3. per task set, ONE :class:`~shardcore.evaluator.PlanEvaluator` session measures every algorithm
   side by side, task by task (:func:`shardcore.evaluation.evaluate`);
4. write ``measurements.csv``, ``results.md`` (the DreamShard paper's table layout, built with
   :func:`shardcore.report.paper_table`), ``costs.png``, ``breakdown.png`` and ``summary.json``,
   after every task set (so an interrupted run keeps what it measured) and at the end.

The planning-scaling benchmark (``tools/bench_planning.py``) lives in :mod:`shardcore.planning_bench`.
"""

from __future__ import annotations

import csv
import datetime as _dt
import importlib.util
import json
import os
import platform
import re
import selectors
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from . import report
from .baselines import BASELINES, Sharder
from .errors import InfeasibleError, ShardError
from .evaluation import TaskResult, evaluate
from .io import atomic_open, write_json, write_text
from .tables import TableConfig
from .taskgen import TaskSpec, generate_tasks
from .tasks import load_tasks, save_tasks

ROOT = Path(__file__).resolve().parent.parent

PAPER_BASELINES = ("random", "size_greedy", "dim_greedy", "lookup_greedy", "size_lookup_greedy")
LEARNED = ("autoshard", "dreamshard", "neuroshard")
ALL_ALGS = PAPER_BASELINES + ("torchrec",) + LEARNED
LABELS = {"random": "Random", "naive": "Naive", "size_greedy": "Size-based", "dim_greedy": "Dim-based",
          "lookup_greedy": "Lookup-based", "size_lookup_greedy": "Size-lookup-based", "torchrec": "TorchRec",
          "autoshard": "AutoShard", "dreamshard": "DreamShard", "neuroshard": "NeuroShard"}
TRAIN_SCRIPTS = {"autoshard": "train_autoshard.py", "dreamshard": "train_dreamshard.py",
                 "neuroshard": "train_neuroshard.py"}
COST_PARTS = ("fw_comp", "fw_comm", "bw_comm", "bw_comp")


def label(alg: str) -> str:
    return LABELS.get(alg, alg)


def order_algs(algs) -> list[str]:
    """Algorithms in the paper's column order (baselines, TorchRec, learned), unknown ones last."""
    known = [a for a in ("random", "naive") + PAPER_BASELINES[1:] + ("torchrec",) + LEARNED if a in algs]
    return known + sorted(a for a in set(algs) if a not in known)


# ------------------------------------------------------------------------------------------------
# Task sets and scales
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TaskSetDef:
    num_tables: int
    ndevices: int

    @property
    def name(self) -> str:
        return f"DLRM-{self.num_tables} ({self.ndevices})"

    @property
    def slug(self) -> str:
        return f"dlrm{self.num_tables}_{self.ndevices}dev"


def parse_task_sets(text: str, flag: str = "--task-sets") -> tuple[TaskSetDef, ...]:
    """``20:4,50:4,40:8`` -> task sets (tables per task : devices)."""
    out = []
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        m = re.fullmatch(r"(\d+)\s*:\s*(\d+)", part)
        if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
            raise ShardError(f"{flag}: expected TABLES:DEVICES pairs like 50:4,80:8, got {part!r}")
        ts = TaskSetDef(int(m.group(1)), int(m.group(2)))
        if ts in out:
            raise ShardError(f"{flag} names {part} twice")
        out.append(ts)
    if not out:
        raise ShardError(f"{flag} names no task set")
    return tuple(out)


@dataclass(frozen=True)
class Scale:
    name: str
    task_sets: tuple[TaskSetDef, ...]
    train_sets: tuple[TaskSetDef, ...]   # learned models: trained on the train split of these (one per device count)
    num_train: int
    num_test: int
    bench_iters: int | None               # evaluator defaults when None
    warmup_iters: int | None
    train_timeout_s: float | None         # per training run; None = unbounded
    train_flags: dict                     # method -> extra flags of its training script
    about: str


def _ts(*pairs) -> tuple[TaskSetDef, ...]:
    return tuple(TaskSetDef(t, d) for t, d in pairs)


SCALES: dict[str, Scale] = {
    # The DreamShard paper's DLRM task sets. Meant for a GPU machine or a long run: 50 train and 50
    # test tasks per set; each learned method trained with its script's defaults, once per device count.
    "full": Scale(
        "full", _ts((20, 4), (50, 4), (100, 4), (40, 8), (80, 8), (160, 8)), _ts((50, 4), (80, 8)),
        num_train=50, num_test=50, bench_iters=None, warmup_iters=None, train_timeout_s=None,
        train_flags={"dreamshard": (), "neuroshard": (), "autoshard": ()},
        about="DLRM-20/50/100 on 4 devices and DLRM-40/80/160 on 8, 50 test tasks each; learned methods "
              "trained with their scripts' defaults on DLRM-50 (4) for 4-device sets and DLRM-80 (8) for 8-device sets"),
    # Sized for a 2-core CPU in well under an hour including training (see results/README.md).
    "small": Scale(
        "small", _ts((20, 4), (50, 4), (40, 8), (80, 8)), _ts((50, 4),),
        num_train=20, num_test=5, bench_iters=None, warmup_iters=None, train_timeout_s=720.0,
        train_flags={
            "dreamshard": ("--num-iterations", "8", "--bench-steps", "8"),
            "neuroshard": ("--compute-samples", "400", "--comm-samples", "120", "--epochs", "200",
                           "--comm-epochs", "300"),
            "autoshard": ("--total-steps", "40000", "--time-limit", "10", "--bench-iters", "3"),
        },
        about="DLRM-20/50 on 4 devices and DLRM-40/80 on 8, 5 test tasks each; learned methods trained "
              "once, briefly, on the 20 training tasks of DLRM-50 (4) and evaluated on every set"),
    # A smoke run / the tests: a few tiny tasks on 2 devices, a token amount of training.
    "tiny": Scale(
        "tiny", _ts((6, 2), (10, 2)), _ts((6, 2),),
        num_train=4, num_test=2, bench_iters=2, warmup_iters=1, train_timeout_s=600.0,
        train_flags={
            "dreamshard": ("--num-iterations", "1", "--bench-steps", "2", "--bench-training-steps", "10",
                           "--rl-num-batches", "2", "--rl-batch-size", "4"),
            "neuroshard": ("--compute-samples", "16", "--comm-samples", "8", "--max-tables", "5",
                           "--T-range", "2,10", "--epochs", "5", "--comm-epochs", "5", "--pool", "all"),
            "autoshard": ("--total-steps", "60", "--num-actors", "1"),
        },
        about="DLRM-6 and DLRM-10 on 2 devices, 2 test tasks each (a smoke test, not a result)"),
}


# ------------------------------------------------------------------------------------------------
# Configuration
# ------------------------------------------------------------------------------------------------

@dataclass
class ExperimentConfig:
    data_dir: str = "data/dlrm_datasets"
    out_dir: str = "results"
    models_dir: str | None = None            # default models/experiments/<scale>
    scale: str = "full"
    task_sets: tuple[TaskSetDef, ...] | None = None    # default: the scale's
    train_sets: tuple[TaskSetDef, ...] | None = None
    num_train: int | None = None
    num_test: int | None = None
    algs: tuple[str, ...] | None = None      # default ALL_ALGS
    max_memory: float = 5.0
    precision: str = "fp16"
    seed: int = 0                            # random baseline and training seeds
    task_seed: int = 0                       # task generation (the train/test table split)
    batch_size: int | None = None
    bench_iters: int | None = None
    warmup_iters: int | None = None
    optimizer: str = "exact_sgd"
    cache_path: str | None = None
    no_cache: bool = False
    timeout: float = 120.0
    oracle: str = "measured"                 # or "emulated:h200" (shardcore.oracles)
    comm_bandwidth: float | None = None      # modelled all-to-all (None: the model's default)
    comm_latency: float | None = None
    skip_train: bool = False
    retrain: bool = False
    model_paths: dict = field(default_factory=dict)   # method -> checkpoint given by the user
    train_args: dict = field(default_factory=dict)    # method -> extra flags (a string) for its script
    train_timeout_s: float | None = -1.0     # -1: the scale's
    breakdown_set: TaskSetDef | None = None  # default: the last task set
    quiet: bool = False
    command: list = field(default_factory=lambda: list(sys.argv))

    def resolved(self) -> "ExperimentConfig":
        if self.scale not in SCALES:
            raise ShardError(f"unknown --scale {self.scale!r}: choose from {', '.join(SCALES)}")
        sc = SCALES[self.scale]
        c = replace(self)
        c.task_sets = tuple(self.task_sets or sc.task_sets)
        c.train_sets = tuple(self.train_sets or sc.train_sets)
        c.num_train = sc.num_train if self.num_train is None else int(self.num_train)
        c.num_test = sc.num_test if self.num_test is None else int(self.num_test)
        if c.num_test < 1:
            raise ShardError(f"--num-test must be at least 1, got {c.num_test}")
        if c.num_train < 0:
            raise ShardError(f"--num-train must be >= 0, got {c.num_train}")
        c.bench_iters = sc.bench_iters if self.bench_iters is None else self.bench_iters
        c.warmup_iters = sc.warmup_iters if self.warmup_iters is None else self.warmup_iters
        c.train_timeout_s = sc.train_timeout_s if self.train_timeout_s == -1.0 else self.train_timeout_s
        c.models_dir = self.models_dir or os.path.join("models", "experiments", self.scale)
        from .algorithms import plugins

        extra = tuple(plugins())   # method packages listed in method_plugins.txt
        algs = tuple(self.algs) if self.algs else ALL_ALGS + extra
        bad = [a for a in algs if a not in BASELINES and a not in ("torchrec",) + LEARNED + extra]
        if bad:
            raise ShardError(f"--algs: unknown algorithm {bad[0]!r}: choose from "
                             f"{', '.join(list(BASELINES) + ['torchrec'] + list(LEARNED) + list(extra))}")
        if len(set(algs)) != len(algs):
            raise ShardError("--algs names an algorithm twice")
        c.algs = tuple(order_algs(algs))
        for method, path in self.model_paths.items():
            if path and not os.path.isfile(path):
                raise ShardError(f"--{method}-model: checkpoint not found: {path}")
        for method, text in self.train_args.items():
            try:
                shlex.split(text or "")
            except ValueError as exc:
                raise ShardError(f"--{method}-args: cannot split {text!r}: {exc}") from None
        if c.breakdown_set is not None and c.breakdown_set not in c.task_sets:
            raise ShardError(f"--breakdown-set {c.breakdown_set.num_tables}:{c.breakdown_set.ndevices} "
                             "is not one of the task sets")
        if c.train_timeout_s is not None and c.train_timeout_s <= 0:
            raise ShardError("--train-timeout must be positive")
        from .oracles import parse_oracle

        c.oracle = parse_oracle(self.oracle)
        return c


# ------------------------------------------------------------------------------------------------
# Environment facts
# ------------------------------------------------------------------------------------------------

def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def software_versions() -> dict:
    import torch
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for dist in ("fbgemm-gpu-cpu", "fbgemm-gpu", "torchrec", "numpy", "pandas", "matplotlib"):
        v = _dist_version(dist)
        if v is not None:
            out[dist] = v
    return out


def machine_info() -> dict:
    from .cache import cpu_name
    info = {"platform": platform.platform(), "cpu": cpu_name(), "cpu_count": os.cpu_count()}
    try:
        import torch
        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # pragma: no cover - informational only
        pass
    try:
        with open("/proc/meminfo") as fh:
            kb = int(re.search(r"MemTotal:\s+(\d+)", fh.read()).group(1))
        info["memory_gb"] = round(kb / 2 ** 20, 1)
    except (OSError, AttributeError):
        pass
    return info


def _now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def method_available(method: str) -> tuple[bool, str]:
    """Whether a learned method's package is importable (found, not imported)."""
    if importlib.util.find_spec(method) is None:
        return False, f"the {method} package is not in this installation"
    return True, ""


# ------------------------------------------------------------------------------------------------
# Training / loading the learned methods
# ------------------------------------------------------------------------------------------------

def method_dir(models_dir: str | os.PathLike, method: str, ndevices: int) -> Path:
    return Path(models_dir) / f"{method}_{ndevices}dev"


def _numbered_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    if not folder.is_dir():
        return []
    out = []
    for p in folder.glob("*.pt"):
        if p.stem.isdigit():
            out.append((int(p.stem), p))
    return sorted(out)


def find_checkpoint(method: str, folder: str | os.PathLike) -> Path | None:
    """The checkpoint a method's training script leaves in ``folder`` (see :func:`train_command`)."""
    folder = Path(folder)
    if method == "dreamshard":
        ckpts = _numbered_checkpoints(folder)
        return ckpts[-1][1] if ckpts else None
    name = {"neuroshard": "neuroshard.pt", "autoshard": "model.pt"}.get(method)
    if name is None:
        return None
    p = folder / name
    return p if p.is_file() else None


def _flag_value(flags: Sequence[str], name: str, default: str | None = None) -> str | None:
    value = default
    for i, f in enumerate(flags):
        if f == name and i + 1 < len(flags):
            value = flags[i + 1]
        elif f.startswith(name + "="):
            value = f.split("=", 1)[1]
    return value


def _oracle_flags(cfg: ExperimentConfig) -> list[str]:
    out = ["--optimizer", cfg.optimizer]
    if cfg.batch_size is not None:
        out += ["--batch-size", str(cfg.batch_size)]
    if cfg.bench_iters is not None:
        out += ["--bench-iters", str(cfg.bench_iters)]
    if cfg.warmup_iters is not None:
        out += ["--warmup-iters", str(cfg.warmup_iters)]
    if cfg.cache_path:
        out += ["--cache-path", os.path.abspath(cfg.cache_path)]
    if cfg.no_cache:
        out.append("--no-cache")
    out += ["--timeout", f"{cfg.timeout:g}"]
    if cfg.oracle != "measured":
        out += ["--oracle", cfg.oracle]
    if cfg.comm_bandwidth is not None:
        out += ["--comm-bandwidth", f"{cfg.comm_bandwidth:g}"]
    if cfg.comm_latency is not None:
        out += ["--comm-latency", f"{cfg.comm_latency:g}"]
    return out


def train_flags(cfg: ExperimentConfig, method: str) -> list[str]:
    return list(SCALES[cfg.scale].train_flags.get(method, ())) + shlex.split(cfg.train_args.get(method) or "")


def train_command(cfg: ExperimentConfig, method: str, train_set: TaskSetDef, train_path: Path,
                  folder: Path) -> list[str]:
    """The training script's command line (a subprocess of this interpreter)."""
    py, script = sys.executable, str(ROOT / TRAIN_SCRIPTS[method])
    devices = ",".join(str(d) for d in range(train_set.ndevices))
    data_dir = os.path.abspath(cfg.data_dir)
    extra = train_flags(cfg, method)
    if method == "dreamshard":
        # train_dreamshard.py's --batch-size is the cost network's (DreamShard's meaning); the benchmark's
        # batch is --bench-batch-size
        oracle = ["--bench-batch-size" if f == "--batch-size" else f for f in _oracle_flags(cfg)]
        cmd = [py, script, "--task-path", str(train_path), "--data-dir", data_dir, "--gpu-devices", devices,
               "--max-memory", f"{cfg.max_memory:g}", "--weights-precision", cfg.precision,
               "--out-dir", str(folder), "--seed", str(cfg.seed)] + oracle
        if _numbered_checkpoints(folder):
            cmd.append("--resume")   # continue an interrupted run instead of starting over
    elif method == "neuroshard":
        # Cost data are collected on the training pool of the same table split (seed 0, half the
        # tables) as tools/gen_tasks.py and these task sets; --pool all only at the tiny scale.
        cmd = [py, script, "--gpu-devices", devices, "--dataset-dir", data_dir,
               "--compute-data-dir", str(folder / "compute"),
               "--comm-data-dir", str(folder / f"comm_{train_set.ndevices}"),
               "--out-dir", str(folder), "--weights-precision", cfg.precision,
               "--seed", str(cfg.seed)] + _oracle_flags(cfg)
    elif method == "autoshard":
        # train_autoshard.py's --batch-size is the learner's; the benchmark batch is --bench-batch-size
        oracle = ["--bench-batch-size" if f == "--batch-size" else f for f in _oracle_flags(cfg)]
        cmd = [py, script, "--task-path", str(train_path), "--data-dir", data_dir, "--gpu-devices", devices,
               "--max-memory", f"{cfg.max_memory:g}", "--weights-precision", cfg.precision,
               "--savedir", str(folder.parent), "--xpid", folder.name, "--seed", str(cfg.seed)] + oracle
    else:  # pragma: no cover
        raise ShardError(f"no training recipe for {method}")
    return cmd + extra


def _kill_group(proc: subprocess.Popen) -> None:
    """Stop a training subprocess we started (its own session) and everything it started."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_logged(cmd: Sequence[str], log_path: Path, timeout_s: float | None, echo: bool) -> tuple[int | None, float]:
    """Run ``cmd``, copying its output to ``log_path`` (and to stdout when ``echo``).

    Returns ``(exit status or None when stopped at timeout_s, seconds)``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log_path, "wb") as log:
        log.write(("$ " + shlex.join(cmd) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        timed_out = False
        try:
            while True:
                if timeout_s is not None and time.perf_counter() - t0 > timeout_s:
                    timed_out = True
                    break
                if not sel.select(timeout=1.0):
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                log.write(chunk)
                log.flush()
                if echo:
                    sys.stdout.write(chunk.decode(errors="replace"))
                    sys.stdout.flush()
        except BaseException:
            _kill_group(proc)
            raise
        finally:
            sel.close()
        if timed_out:
            _kill_group(proc)
            log.write(f"\n[stopped by the experiment runner after {timeout_s:g} s]\n".encode())
            proc.stdout.close()
            return None, time.perf_counter() - t0
        proc.stdout.close()
        rc = proc.wait()
    return rc, time.perf_counter() - t0


def _tail(path: Path, n: int = 3) -> str:
    try:
        lines = [l.strip() for l in path.read_text(errors="replace").replace("\r", "\n").splitlines() if l.strip()]
    except OSError:
        return ""
    return " / ".join(lines[-n:])


@dataclass
class LearnedModel:
    method: str
    ndevices: int                 # device count it was trained for (0: given by the user, any)
    checkpoint: str
    source: str                   # "given", "existing", "trained", "partial"
    train_set: str | None = None
    train_seconds: float | None = None
    log: str | None = None
    note: str = ""


def prepare_learned(cfg: ExperimentConfig, method: str, train_paths: dict, notes: list[str],
                    echo: bool) -> dict[int, LearnedModel]:
    """Models of one method keyed by device count (key 0: one model for every set)."""
    given = cfg.model_paths.get(method)
    if given:
        return {0: LearnedModel(method, 0, str(given), "given", note=f"given with --{method}-model")}
    ok, why = method_available(method)
    models: dict[int, LearnedModel] = {}
    for ts in cfg.train_sets:
        if ts.ndevices in models:
            continue
        folder = method_dir(cfg.models_dir, method, ts.ndevices)
        final = None
        if method == "dreamshard":
            final = int(_flag_value(train_flags(cfg, method), "--num-iterations", "10")) - 1
        ckpt = find_checkpoint(method, folder)
        complete = ckpt is not None and (final is None or int(ckpt.stem) >= final)
        if complete and not cfg.retrain:
            models[ts.ndevices] = LearnedModel(method, ts.ndevices, str(ckpt), "existing", ts.name,
                                               note="reused from an earlier run (--retrain trains again)")
            continue
        if cfg.skip_train:
            if ckpt is not None and not cfg.retrain:
                models[ts.ndevices] = LearnedModel(method, ts.ndevices, str(ckpt), "partial", ts.name,
                                                   note="newest checkpoint of an unfinished training (--skip-train)")
            else:
                notes.append(f"{method}: skipped for {ts.ndevices}-device sets: no checkpoint in {folder} "
                             f"and --skip-train")
            continue
        if not ok:
            notes.append(f"{method}: skipped: {why}")
            return {}
        script = ROOT / TRAIN_SCRIPTS[method]
        if not script.is_file():
            notes.append(f"{method}: skipped: its training script {script.name} is missing")
            return {}
        if cfg.retrain and folder.is_dir():
            shutil.rmtree(folder)
        folder.mkdir(parents=True, exist_ok=True)
        cmd = train_command(cfg, method, ts, train_paths[ts], folder)
        log = Path(cfg.out_dir) / "logs" / f"train_{method}_{ts.ndevices}dev.log"
        print(f"training {method} on {ts.name} (train split, {cfg.num_train} tasks); log: {log}")
        rc, seconds = run_logged(cmd, log, cfg.train_timeout_s, echo)
        ckpt = find_checkpoint(method, folder)
        if rc == 0 and ckpt is not None:
            models[ts.ndevices] = LearnedModel(method, ts.ndevices, str(ckpt), "trained", ts.name, seconds, str(log))
            print(f"{method}: trained in {seconds:.0f} s -> {ckpt}")
        elif rc is None and ckpt is not None:
            models[ts.ndevices] = LearnedModel(
                method, ts.ndevices, str(ckpt), "partial", ts.name, seconds, str(log),
                note=f"training stopped at the {cfg.train_timeout_s:g} s limit; newest checkpoint used")
            print(f"{method}: training stopped at the time limit; using {ckpt}")
        else:
            why = (f"training stopped at the {cfg.train_timeout_s:g} s limit without a checkpoint" if rc is None
                   else f"training failed (exit status {rc}): {_tail(log)}")
            notes.append(f"{method}: skipped for {ts.ndevices}-device sets: {why} (log: {log})")
            print(f"{method}: {why}", file=sys.stderr)
    return models


def model_for(models: dict[int, LearnedModel], ndevices: int) -> LearnedModel | None:
    """The model trained for this device count, else the one given, else the first trained."""
    if not models:
        return None
    return models.get(ndevices) or models.get(0) or models[sorted(models)[0]]


# ------------------------------------------------------------------------------------------------
# Sharders
# ------------------------------------------------------------------------------------------------

@dataclass
class GuardedSharder(Sharder):
    """A method's failure on one task (an exception other than "infeasible") becomes that task's
    error instead of ending a long run; the record says ``failed: ...``."""

    inner: Sharder = None

    def shard(self, tables, ndevices, max_memory_gb, precision="fp16"):
        try:
            return self.inner.shard(tables, ndevices, max_memory_gb, precision)
        except InfeasibleError:
            raise
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            msg = " ".join(str(exc).split())[:300]
            raise InfeasibleError(f"failed: {self.name}: {type(exc).__name__}: {msg}") from None


def build_sharders(algs: Sequence[str], ndevices: int, seed: int, batch_size: int | None,
                   learned: dict[str, dict[int, LearnedModel]], notes: list[str] | None = None,
                   plugin_kwargs: dict | None = None) -> tuple[dict[str, Sharder], dict[str, str]]:
    """Sharders of the available algorithms for one device count, and the checkpoint used per learned
    one. ``plugin_kwargs`` go to the methods of method_plugins.txt (the landscape, data, cache...)."""
    from . import algorithms

    sharders: dict[str, Sharder] = {}
    used: dict[str, str] = {}
    extra = algorithms.plugins()
    for alg in algs:
        if alg in extra:
            try:
                sharders[alg] = GuardedSharder(alg, inner=algorithms.resolve(alg, seed=seed, batch_size=batch_size,
                                                                             **(plugin_kwargs or {})))
            except ShardError as exc:
                if notes is not None:
                    notes.append(f"{alg}: skipped: {exc}")
        elif alg in BASELINES:
            sharders[alg] = algorithms.resolve(alg, seed=seed)
        elif alg == "torchrec":
            try:
                sharders[alg] = GuardedSharder(alg, inner=algorithms.resolve("torchrec", batch_size=batch_size))
            except ShardError as exc:
                if notes is not None:
                    notes.append(f"torchrec: skipped: {exc}")
        else:
            m = model_for(learned.get(alg, {}), ndevices)
            if m is None:
                continue
            try:
                inner = algorithms.resolve(m.checkpoint, seed=seed, batch_size=batch_size)
            except ShardError as exc:
                if notes is not None:
                    notes.append(f"{alg}: skipped on {ndevices} devices: cannot load {m.checkpoint}: {exc}")
                continue
            sharders[alg] = GuardedSharder(alg, inner=inner)
            used[alg] = m.checkpoint
    return sharders, used


# ------------------------------------------------------------------------------------------------
# Statistics over one task set
# ------------------------------------------------------------------------------------------------

def status_of(r: TaskResult) -> str:
    if r.feasible:
        return "ok"
    return "failed" if (r.error or "").startswith("failed:") else "infeasible"


def set_stats(results: Sequence[TaskResult], baseline: str = "random") -> dict[str, dict]:
    """Per algorithm over the tasks every measured algorithm planned feasibly (as the paper table):
    mean, std, % over ``baseline``, plus counts and planning time over all tasks."""
    by: dict[str, list[TaskResult]] = {}
    for r in results:
        by.setdefault(r.alg, []).append(r)
    measured = {a: rs for a, rs in by.items() if any(r.cost_ms is not None for r in rs)}
    common = (set.intersection(*({r.task for r in rs if r.cost_ms is not None} for rs in measured.values()))
              if measured else set())
    base = [r.cost_ms for r in by.get(baseline, []) if r.task in common and r.cost_ms is not None]
    base_mean = statistics.fmean(base) if base else None
    out = {}
    for alg, rs in by.items():
        costs = [r.cost_ms for r in rs if r.task in common and r.cost_ms is not None]
        mean = statistics.fmean(costs) if costs else None
        std = (statistics.pstdev(costs) if len(costs) > 1 else 0.0) if costs else None
        gain = (report.improvement_over(base_mean, mean) if base_mean is not None and mean and alg != baseline
                else None)
        out[alg] = {"mean_ms": mean, "std_ms": std, "pct_over_random": gain, "tasks_compared": len(costs),
                    "feasible": sum(r.feasible for r in rs), "infeasible": sum(status_of(r) == "infeasible" for r in rs),
                    "failed": sum(status_of(r) == "failed" for r in rs), "tasks": len(rs),
                    "mean_planning_ms": 1e3 * statistics.fmean(r.planning_seconds for r in rs),
                    "costs_ms": costs}
    return out


def _md_cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip()[1:-1].split("|")]


def paper_cells(results: Sequence[TaskResult], task_set: str) -> dict[str, str]:
    """alg -> the cell of :func:`shardcore.report.paper_table` ('mean±std (+x%)', best in bold);
    algorithms without a single measured plan get 'infeasible' / 'failed'."""
    by: dict[str, list[TaskResult]] = {}
    for r in results:
        by.setdefault(r.alg, []).append(r)
    measured = [r for r in results if any(x.cost_ms is not None for x in by[r.alg])]
    cells: dict[str, str] = {}
    if measured:
        lines = report.paper_table(measured, task_set).splitlines()
        header, row = _md_cells(lines[0]), _md_cells(lines[2])
        cells.update(dict(zip(header[1:], row[1:])))
    for alg, rs in by.items():
        if alg not in cells:
            cells[alg] = "failed" if any(status_of(r) == "failed" for r in rs) else "infeasible"
    return cells


# ------------------------------------------------------------------------------------------------
# Outputs
# ------------------------------------------------------------------------------------------------

CSV_FIELDS = ["task_set", "set_tables", "ndevices", "max_memory_gb", "task", "alg", "label", "status",
              "feasible", "cost_ms", "imbalance", "planning_ms", "from_cache", "checkpoint",
              "device_totals_ms", "device_costs_ms", "memory_gb", "allocation", "splits", "error"]


def result_row(ts: TaskSetDef, r: TaskResult, checkpoint: str | None) -> dict:
    js = lambda x: json.dumps(x) if x is not None else ""  # noqa: E731
    return {
        "task_set": ts.name, "set_tables": ts.num_tables, "ndevices": r.ndevices, "max_memory_gb": r.max_memory_gb,
        "task": r.task, "alg": r.alg, "label": label(r.alg), "status": status_of(r), "feasible": int(r.feasible),
        "cost_ms": f"{r.cost_ms:.4f}" if r.cost_ms is not None else "",
        "imbalance": f"{r.imbalance:.4f}" if r.imbalance is not None else "",
        "planning_ms": f"{1e3 * r.planning_seconds:.4f}",
        "from_cache": "" if r.cost_ms is None else int(bool(r.extra.get("from_cache"))),
        "checkpoint": checkpoint or "",
        "device_totals_ms": js([round(sum(c), 4) for c in r.device_costs_ms] if r.device_costs_ms else None),
        "device_costs_ms": js([[round(x, 4) for x in c] for c in r.device_costs_ms] if r.device_costs_ms else None),
        "memory_gb": js(r.memory_gb), "allocation": js(r.allocation), "splits": js(r.splits),
        "error": r.error or "",
    }


def write_csv(path: str | os.PathLike, rows: Sequence[dict], fields: Sequence[str]) -> None:
    with atomic_open(path, "w") as fh:
        w = csv.DictWriter(fh, fieldnames=list(fields), lineterminator="\n")
        w.writeheader()
        for row in rows:
            w.writerow(row)


@dataclass
class SetOutcome:
    ts: TaskSetDef
    results: list[TaskResult]
    checkpoints: dict[str, str]
    startup_s: float | None
    measure_s: float
    device_type: str | None = None
    batch_size: int | None = None


def results_markdown(cfg: ExperimentConfig, outcomes: Sequence[SetOutcome], learned: dict,
                     notes: Sequence[str], info: dict, finished: bool) -> str:
    algs = order_algs({r.alg for o in outcomes for r in o.results})
    lines = ["# Results", ""]
    state = "" if finished else " **(partial: the run has not finished)**"
    dev = outcomes[0].device_type if outcomes else None
    lines += [f"Generated by `{shlex.join(cfg.command)}` on {info['date']}{state}.",
              f"Machine: {info['machine'].get('cpu')}, {info['machine'].get('cpu_count')} CPU cores"
              + (f", GPUs: {', '.join(info['machine']['gpus'])}" if info['machine'].get('gpus') else "")
              + (f"; measured on {dev or '-'} (" + ("logical CPU devices, see README \"How CPU figures relate "
                                                    "to GPU figures\"" if dev == "cpu" else "one GPU per device")
                 if not str(dev).startswith("emulated") else
                 f"; **costs from the {dev} oracle** (an NVIDIA H200 emulated from real shard measurements, "
                 "all-to-all modelled; not measured on this machine")
              + f"). Scale `{cfg.scale}`: task sets {', '.join(ts.name for ts in cfg.task_sets)}, "
              f"{cfg.num_test} test tasks each; learned methods trained on the train split "
              f"({cfg.num_train} tasks) of {', '.join(ts.name for ts in cfg.train_sets)}.", ""]
    lines += ["## Plan cost (DreamShard paper layout)", ""]
    rows = []
    for o in outcomes:
        cells = paper_cells(o.results, o.ts.name)
        rows.append([o.ts.name] + [cells.get(a, "") for a in algs])
    if rows:
        lines.append(report.format_table(["Task"] + [label(a) for a in algs], rows))
    bs = outcomes[0].batch_size if outcomes else None
    lines += ["", f"Cost = the slowest device's forward compute + forward all-to-all + backward all-to-all + "
              f"backward compute, in ms per iteration (batch {bs}, {cfg.optimizer}, {cfg.precision}, cap "
              f"{cfg.max_memory:g} GB per device), "
              + ("measured on this machine" if not str(dev).startswith("emulated") else f"from the {dev} oracle")
              + "; mean±std over the test tasks "
              f"of each set that every algorithm planned feasibly ({cfg.num_test} per set); (+x%) = % over "
              "random as in the paper (random's mean / the algorithm's − 1); best of each row in **bold**. "
              "Test tasks hold only tables that no learned method saw in training; DLRM-T (D) = T tables "
              "per task on D devices.", ""]
    if learned:
        lines += ["## Learned methods", ""]
        lrows = []
        for method in order_algs(learned):
            for m in learned[method].values():
                lrows.append([label(method), m.checkpoint, m.train_set or "-",
                              f"{m.train_seconds:.0f}" if m.train_seconds is not None else "-",
                              m.source + (f": {m.note}" if m.note else "")])
        lines.append(report.format_table(["method", "checkpoint", "trained on (train split)", "training s",
                                          "source"], lrows))
        lines += ["", "A model trained for one device count is evaluated on every task set with that count; "
                  "sets with other counts use the first model (generalisation to unseen table and device counts).",
                  ""]
    if notes:
        lines += ["## Skipped and notes", ""] + [f"- {n}" for n in notes] + [""]
    lines += ["## Per task set", ""]
    for o in outcomes:
        measured = [r for r in o.results if r.cost_ms is not None]
        lines += [f"### {o.ts.name}", ""]
        lines.append(report.measured_summary(o.results) if measured else "(nothing measured)")
        lines += ["", f"Evaluator start-up {o.startup_s or 0:.1f} s, measuring {o.measure_s:.0f} s.", ""]
    lines += ["## Files", "",
              "`measurements.csv` (every task × algorithm × task set), `costs.png` (cost per algorithm per task "
              "set), `breakdown.png` (per-device cost breakdown of one task, best vs worst algorithm), "
              "`summary.json` (machine, date, command, versions, timings), `tasks/` (the task files), "
              "`logs/` (training logs).", ""]
    return "\n".join(lines)


def pick_breakdown(cfg: ExperimentConfig, outcomes: Sequence[SetOutcome]):
    """(task set, task, best alg, worst alg, results by alg) for breakdown.png, or None."""
    if not outcomes:
        return None
    wanted = cfg.breakdown_set or cfg.task_sets[-1]
    outcome = next((o for o in outcomes if o.ts == wanted), outcomes[-1])
    stats = {a: s for a, s in set_stats(outcome.results).items() if s["mean_ms"] is not None}
    if not stats:
        return None
    best = min(stats, key=lambda a: stats[a]["mean_ms"])
    worst = max(stats, key=lambda a: stats[a]["mean_ms"])
    by = {(r.alg, r.task): r for r in outcome.results}
    tasks = sorted({r.task for r in outcome.results})
    for k in tasks:
        rb, rw = by.get((best, k)), by.get((worst, k))
        if rb is not None and rw is not None and rb.device_costs_ms and rw.device_costs_ms:
            return outcome.ts, k, rb, rw
    return None


def write_outputs(cfg: ExperimentConfig, outcomes: Sequence[SetOutcome], learned: dict, notes: Sequence[str],
                  info: dict, finished: bool) -> list[str]:
    from . import plots

    out = Path(cfg.out_dir)
    t0 = time.perf_counter()
    rows = [result_row(o.ts, r, o.checkpoints.get(r.alg)) for o in outcomes for r in o.results]
    write_csv(out / "measurements.csv", rows, CSV_FIELDS)
    info = dict(info)
    written = ["measurements.csv"]
    sets = []
    for o in outcomes:
        st = set_stats(o.results)
        sets.append({"task_set": o.ts.name, "num_tables": o.ts.num_tables, "ndevices": o.ts.ndevices,
                     "num_tasks": len({r.task for r in o.results}), "evaluator_startup_s": o.startup_s,
                     "measure_s": round(o.measure_s, 2),
                     "algorithms": {a: {k: v for k, v in s.items() if k != "costs_ms"} for a, s in st.items()},
                     "checkpoints": o.checkpoints})
    plot_sets = [(o.ts.name, {label(a): s["costs_ms"] for a, s in
                              sorted(set_stats(o.results).items(), key=lambda kv: order_algs(
                                  {r.alg for r in o.results}).index(kv[0]))})
                 for o in outcomes]
    plots.plot_costs(plot_sets, out / "costs.png",
                     title=f"Plan cost per algorithm (mean ± std over test tasks; scale {cfg.scale})")
    written.append("costs.png")
    pick = pick_breakdown(cfg, outcomes)
    plots.plot_breakdown(
        [(f"{label(r.alg)} (best)" if i == 0 else f"{label(r.alg)} (worst)", r.device_costs_ms, r.cost_ms)
         for i, r in enumerate(pick[2:])] if pick else [],
        out / "breakdown.png", COST_PARTS,
        title=(f"{pick[0].name}, test task {pick[1]}: per-device cost, best vs worst algorithm of the set"
               if pick else "no measured plan"))
    written.append("breakdown.png")
    text = results_markdown(cfg, outcomes, learned, notes, info, finished)
    write_text(out / "results.md", text)
    written.append("results.md")
    info["timings_s"] = dict(info.get("timings_s", {}), outputs=round(time.perf_counter() - t0, 2))
    info["finished"] = finished
    info["task_sets"] = sets
    info["notes"] = list(notes)
    info["learned"] = {m: [asdict(x) for x in d.values()] for m, d in learned.items()}
    info["files"] = written + ["summary.json"]
    write_json(out / "summary.json", info)
    return info["files"]


# ------------------------------------------------------------------------------------------------
# The pipeline
# ------------------------------------------------------------------------------------------------

def generate_task_files(cfg: ExperimentConfig, tables: Sequence[TableConfig]) -> dict[TaskSetDef, Path]:
    """``<out-dir>/tasks/<slug>/{train,test}.txt`` for every evaluated and training set.

    Every set uses the same seed, hence the same train/test split of the dataset's tables
    (NeuroShard's ``--pool train`` uses that split too: seed 0, half the tables)."""
    folder = Path(cfg.out_dir) / "tasks"
    out = {}
    for ts in dict.fromkeys(tuple(cfg.task_sets) + tuple(cfg.train_sets)):
        spec = TaskSpec(t_min=ts.num_tables, t_max=ts.num_tables, num_train=cfg.num_train,
                        num_test=cfg.num_test, seed=cfg.task_seed, ndevices=ts.ndevices, precision=cfg.precision)
        train, test = generate_tasks(tables, spec)
        save_tasks(folder / ts.slug / "train.txt", train)
        save_tasks(folder / ts.slug / "test.txt", test)
        out[ts] = folder / ts.slug
    return out


def _evaluator_batch_size(cfg: ExperimentConfig) -> int | None:
    from .dataset import load_dataset
    from .oracles import configs_batch_size

    if cfg.batch_size is not None:
        return cfg.batch_size
    if cfg.oracle != "measured":
        return configs_batch_size(cfg.data_dir)
    try:
        return load_dataset(cfg.data_dir).batch_size
    except ShardError:
        return None


def run_experiments(cfg: ExperimentConfig, progress: bool | None = None) -> dict:
    """The whole pipeline; returns summary.json's content."""
    from tqdm import tqdm

    from .commmodel import CommModel
    from .dataset import load_dataset
    from .evaluator import PlanEvaluator
    from .oracles import EmulatedOracle

    cfg = cfg.resolved()
    comm_kw = {k: v for k, v in (("bandwidth_gbps", cfg.comm_bandwidth), ("latency_us", cfg.comm_latency))
               if v is not None}
    t_start = time.perf_counter()
    info: dict[str, Any] = {"date": _now(), "command": list(cfg.command), "machine": machine_info(),
                            "versions": software_versions(), "scale": cfg.scale,
                            "scale_about": SCALES[cfg.scale].about,
                            "config": {k: (str(v) if isinstance(v, (tuple, TaskSetDef)) else v)
                                       for k, v in asdict(cfg).items() if k not in ("command",)},
                            "timings_s": {}}
    info["config"]["task_sets"] = [ts.name for ts in cfg.task_sets]
    info["config"]["train_sets"] = [ts.name for ts in cfg.train_sets]
    dataset = load_dataset(cfg.data_dir, with_lookups=False)
    notes: list[str] = []
    print(f"experiments ({cfg.scale}): {', '.join(ts.name for ts in cfg.task_sets)}; "
          f"{cfg.num_test} test tasks per set; algorithms: {', '.join(cfg.algs)}; outputs in {cfg.out_dir}/")

    # 1. tasks
    t0 = time.perf_counter()
    task_dirs = generate_task_files(cfg, dataset.tables)
    info["timings_s"]["tasks"] = round(time.perf_counter() - t0, 2)
    print(f"tasks written to {Path(cfg.out_dir) / 'tasks'}/ ({len(task_dirs)} sets)")

    # 2. torchrec availability, learned methods
    algs = list(cfg.algs)
    if "torchrec" in algs and importlib.util.find_spec("torchrec") is None:
        notes.append("torchrec: skipped: TorchRec is not installed (pip install --no-deps torchrec; see README)")
        print("note: torchrec is not importable; skipping it")
        algs.remove("torchrec")
    learned: dict[str, dict[int, LearnedModel]] = {}
    t0 = time.perf_counter()
    train_paths = {ts: task_dirs[ts] / "train.txt" for ts in cfg.train_sets}
    for method in [a for a in algs if a in LEARNED]:
        if cfg.num_train == 0 and not cfg.model_paths.get(method) and method != "neuroshard" and not cfg.skip_train:
            notes.append(f"{method}: skipped: --num-train 0 leaves no training tasks")
            continue
        tm = time.perf_counter()
        models = prepare_learned(cfg, method, train_paths, notes, echo=not cfg.quiet)
        info["timings_s"][f"train_{method}"] = round(time.perf_counter() - tm, 2)
        if models:
            learned[method] = models
        else:
            print(f"note: {method} is skipped (see results.md)")
    info["timings_s"]["training"] = round(time.perf_counter() - t0, 2)
    if cfg.task_seed != 0 and any(m.source == "trained" for m in learned.get("neuroshard", {}).values()):
        notes.append(f"neuroshard: its cost data come from the table split of seed 0 (train_neuroshard.py "
                     f"--pool train), the task sets from seed {cfg.task_seed}: test tables may have been seen")
    algs = [a for a in algs if a not in LEARNED or a in learned]

    # 3. measure, one evaluator session per task set
    batch_size = _evaluator_batch_size(cfg)
    outcomes: list[SetOutcome] = []
    for ts in cfg.task_sets:
        tasks = load_tasks(task_dirs[ts] / "test.txt", num_tables=dataset.num_tables)
        set_notes: list[str] = []
        plugin_kwargs = {"oracle": cfg.oracle, "data_dir": cfg.data_dir, "comm_bandwidth": cfg.comm_bandwidth,
                         "comm_latency": cfg.comm_latency, "cache_path": cfg.cache_path,
                         # tables a model fitted from the cache must not have seen
                         "exclude_task_files": [str(task_dirs[t] / "test.txt") for t in cfg.task_sets]}
        sharders, used = build_sharders(algs, ts.ndevices, cfg.seed, batch_size, learned, set_notes,
                                        plugin_kwargs=plugin_kwargs)
        for n in set_notes:
            if n not in notes:
                notes.append(n)
        kwargs = {}
        if cfg.bench_iters is not None:
            kwargs["bench_iters"] = cfg.bench_iters
        if cfg.warmup_iters is not None:
            kwargs["warmup_iters"] = cfg.warmup_iters
        t0 = time.perf_counter()
        if cfg.oracle != "measured":
            oracle = EmulatedOracle(cfg.data_dir, ts.ndevices, card=cfg.oracle.split(":", 1)[1],
                                    batch_size=cfg.batch_size, optimizer=cfg.optimizer, precision=cfg.precision,
                                    comm_model=CommModel(**comm_kw))
        else:
            oracle = PlanEvaluator(cfg.data_dir, device_ids=list(range(ts.ndevices)), optimizer=cfg.optimizer,
                                   precision=cfg.precision, batch_size=cfg.batch_size,
                                   cache=cfg.cache_path if cfg.cache_path else True, no_cache=cfg.no_cache,
                                   timeout_s=cfg.timeout, comm_model=CommModel(**comm_kw), **kwargs)
        with oracle as ev:
            print(f"{ts.name}: {len(tasks)} tasks x {len(sharders)} algorithms; workers up in "
                  f"{ev.startup_s:.1f} s on {ev.device_type} (batch {ev.batch_size})")
            last = {}

            def measure(shard_tables):
                r = ev.evaluate(shard_tables)
                last["from_cache"] = r.from_cache
                return r.cost_ms, r.device_costs_ms

            def on_result(result, task):
                if result.cost_ms is not None:
                    result.extra["from_cache"] = bool(last.pop("from_cache", False))
                if not result.feasible:
                    tqdm.write(f"{ts.name} task {result.task} {result.alg}: {result.error}")

            t1 = time.perf_counter()
            with tqdm(total=len(tasks) * len(sharders), desc=ts.name, unit="plan",
                      disable=(not progress) if progress is not None else None) as bar:
                results = evaluate(tasks, dataset.tables, sharders, ts.ndevices, cfg.max_memory, cfg.precision,
                                   measure=measure, on_result=on_result, progress=bar)
            outcomes.append(SetOutcome(ts, results, used, ev.startup_s, time.perf_counter() - t1,
                                       ev.device_type, ev.batch_size))
        info["timings_s"][f"measure {ts.name}"] = round(time.perf_counter() - t0, 2)
        stats = set_stats(results)
        line = ", ".join(f"{a} {s['mean_ms']:.1f}" for a, s in stats.items() if s["mean_ms"] is not None)
        print(f"{ts.name}: mean cost ms: {line}")
        info["timings_s"]["total"] = round(time.perf_counter() - t_start, 2)
        write_outputs(cfg, outcomes, learned, notes, info, finished=False)

    info["timings_s"]["total"] = round(time.perf_counter() - t_start, 2)
    info["date_finished"] = _now()
    files = write_outputs(cfg, outcomes, learned, notes, info, finished=True)
    print()
    print(Path(cfg.out_dir, "results.md").read_text().split("## Learned methods")[0].split("## Skipped")[0].rstrip())
    print()
    for n in notes:
        print(f"note: {n}")
    print(f"wrote {', '.join(files)} to {cfg.out_dir}/ in {info['timings_s']['total']:.0f} s")
    return json.loads(Path(cfg.out_dir, "summary.json").read_text())
