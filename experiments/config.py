"""What an experiment run is asked to do: algorithms and their labels, task sets, scales, the config."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from dataclasses import dataclass, field, replace

from shardcore import registry
from shardcore.baselines import BASELINES
from shardcore.argtypes import name_list, nonnegative_int, positive_float, positive_int, seed_int
from shardcore.config import Config, add_config_args, param
from shardcore.dataset import DEFAULT_DATA_DIR
from shardcore.errors import ShardError
from shardcore.oracles.setting import DEFAULT_TIMEOUT_S, EXACT_SGD
from shardcore.planning import HELDOUT
from shardcore.topology import DEFAULT_MAX_MEMORY_GB

PAPER_BASELINES = ("random", "size_greedy", "dim_greedy", "lookup_greedy", "size_lookup_greedy")
PLUGINS = ("torchrec",)    # the declared baseline planner in the results table: TorchRec's, every sharding type
LABELS = {"random": "Random", "naive": "Naive", "size_greedy": "Size-based", "dim_greedy": "Dim-based",
          "lookup_greedy": "Lookup-based", "size_lookup_greedy": "Size-lookup-based", "torchrec": "TorchRec",
          "torchrec-tw": "TorchRec (TW)", "shardkit-tw": "shardkit (TW)"}


# declared planners that are comparisons for eval.py, not columns of the results table: TorchRec's
# planner priced by the emulated H200 (the table has TorchRec's own planner as its TorchRec column)
NOT_IN_TABLE = ("torchrec-emu",)
# a measured oracle repeats itself only within a few percent: every plan measured in this many
# interleaved rounds, the medians kept (shardcore.evaluation.compare.evaluate's repeats)
MEASURED_REPEATS = 3


def baseline_planners() -> tuple[str, ...]:
    """The declared planners the reports count among the baselines (TorchRec's)."""
    return registry.baseline_planners()


def planners() -> tuple[str, ...]:
    """The other planners declared beside the learned methods (``shardkit_methods.PLANNERS``), less
    ``NOT_IN_TABLE``."""
    base = set(baseline_planners())
    return tuple(n for n in registry.declared_planners() if n not in NOT_IN_TABLE and n not in base)


def learned_methods() -> tuple[str, ...]:
    """The learned methods the registry lists, in the papers' column order."""
    return registry.method_names()


def all_algs() -> tuple[str, ...]:
    """Every algorithm of the results table: the paper's baselines, the plug-ins, the learned methods."""
    return PAPER_BASELINES + PLUGINS + learned_methods() + planners()


def known_algs() -> list[str]:
    return list(BASELINES) + list(baseline_planners()) + list(learned_methods()) + list(planners())


def label(alg: str) -> str:
    return LABELS.get(alg) or (alg if alg in planners() else registry.label(alg))


def order_algs(algs) -> list[str]:
    """Algorithms in the paper's column order (baselines, TorchRec, learned), unknown ones last."""
    known = [a for a in ("random", "naive") + PAPER_BASELINES[1:] + baseline_planners() + learned_methods() + planners()
             if a in algs]
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


def task_sets_arg(text: str) -> tuple[TaskSetDef, ...]:
    """argparse type of the task-set flags."""
    try:
        return parse_task_sets(text)
    except ShardError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@dataclass(frozen=True)
class Scale:
    """A preset size of the experiments; each method's training flags per scale are in its registry entry."""

    name: str
    task_sets: tuple[TaskSetDef, ...]
    train_sets: tuple[TaskSetDef, ...]   # learned models: trained on the train split of these (one per device count)
    num_train: int
    num_test: int
    bench_iters: int | None               # evaluator defaults when None
    warmup_iters: int | None
    train_timeout_s: float | None         # per training run; None = unbounded
    about: str
    judge_pool: int | None = None         # training pool: the measured tables that keep a held-out judge (taskgen)
    emulated_only: bool = False           # its tasks are for an emulated card (tens of devices)
    comm_iters: int | None = None         # repetitions of each measured exchange (None: the evaluator's)


def _ts(*pairs) -> tuple[TaskSetDef, ...]:
    return tuple(TaskSetDef(t, d) for t, d in pairs)


SCALES: dict[str, Scale] = {
    # The DreamShard paper's DLRM task sets. Meant for a GPU machine or a long run: 50 train and 50
    # test tasks per set; each learned method trained with its script's defaults, once per device count.
    "full": Scale(
        "full", _ts((20, 4), (50, 4), (100, 4), (40, 8), (80, 8), (160, 8)), _ts((50, 4), (80, 8)),
        num_train=50, num_test=50, bench_iters=None, warmup_iters=None, train_timeout_s=None,
        about="DLRM-20/50/100 on 4 devices and DLRM-40/80/160 on 8, 50 test tasks each; learned methods "
              "trained with their scripts' defaults on DLRM-50 (4) for 4-device sets and DLRM-80 (8) for 8-device sets"),
    # Sized for a 2-core CPU in well under an hour including training (see results/README.md).
    "small": Scale(
        "small", _ts((20, 4), (50, 4), (40, 8), (80, 8)), _ts((50, 4),),
        num_train=20, num_test=5, bench_iters=None, warmup_iters=None, train_timeout_s=720.0,
        about="DLRM-20/50 on 4 devices and DLRM-40/80 on 8, 5 test tasks each; learned methods trained "
              "once, briefly, on the 20 training tasks of DLRM-50 (4) and evaluated on every set"),
    # Past one host, on the emulated H200 (make experiments' cluster block): 400 tables on 4 hosts of 8
    # devices. A random split leaves a held-out judge of a 400-table task too few measured shards, so the
    # training pool is the 260 tables that hold the most measured shards, the test tables the others.
    "cluster": Scale(
        "cluster", _ts((400, 32),), _ts((400, 32),), num_train=0, num_test=3, bench_iters=None, warmup_iters=None,
        train_timeout_s=None, judge_pool=260, emulated_only=True,
        about="DLRM-400 on 32 devices (with --devices-per-host 8: 4 hosts of 8), 3 test tasks of tables outside "
              "the 260 that keep the held-out judge its measured shards; no training (greedy baselines, TorchRec, "
              "shardkit); for --oracle emulated:h200 at --batch-size 65536 (make experiments' cluster block)"),
    # A smoke run / the tests: a few tiny tasks on 2 devices, a token amount of training.
    "tiny": Scale(
        "tiny", _ts((6, 2), (10, 2)), _ts((6, 2),),
        num_train=4, num_test=2, bench_iters=2, warmup_iters=1, train_timeout_s=600.0, comm_iters=3,
        about="DLRM-6 and DLRM-10 on 2 devices, 2 test tasks each (a smoke test, not a result)"),
}


# ------------------------------------------------------------------------------------------------
# Configuration
# ------------------------------------------------------------------------------------------------

LEARNED = "learned methods"   # the argument group of the training flags


@dataclass
class ExperimentConfig(Config):
    """What tools/run_experiments.py is asked to do, stated once: the ``param`` fields are its flags
    (:func:`add_experiment_args`); the memory cap, precision and oracle fields come from the core's
    memory and oracle flags, ``model_paths`` and ``train_args`` from the per-method flags."""

    scale: str = param("full", "preset task sets, task counts and training lengths (default {default}; small for a "
                       "CPU run under an hour; tiny for a smoke test)", choices=tuple(sorted(SCALES)))
    data_dir: str = param(DEFAULT_DATA_DIR, "processed dataset directory (default {default})",
                          flags=("--data-dir", "--data_dir"))
    out_dir: str = param("results", "where the outputs go (default {default})")
    models_dir: str | None = param(None, "where learned models are trained to / looked for: <dir>/<method>_<N>dev/ "
                                   "(default models/experiments/<scale>)", type=str)
    algs: tuple[str, ...] | None = param(None, "comma-separated algorithms (default all: {all_algs}); also naive",
                                         type=name_list)   # None: all_algs()
    task_sets: tuple[TaskSetDef, ...] | None = param(
        None, "task sets to evaluate as tables-per-task:devices, e.g. 20:4,50:4,40:8 (default: the scale's)",
        type=task_sets_arg, metavar="T:D,...")
    train_sets: tuple[TaskSetDef, ...] | None = param(
        None, "sets whose train split trains the learned methods, at most one per device count (default: the "
              "scale's, e.g. 50:4)", type=task_sets_arg, metavar="T:D,...")
    num_train: int | None = param(None, "training tasks per set (default: the scale's; 50 full, 20 small)",
                                  type=nonnegative_int, metavar="N")
    num_test: int | None = param(None, "test tasks per set, all measured (default: the scale's; 50 full, 5 small)",
                                 type=positive_int, metavar="N")
    max_memory: float = DEFAULT_MAX_MEMORY_GB   # --max-memory (shardcore.cli.common.add_memory_args)
    precision: str = "fp16"                  # --weights-precision (likewise)
    seed: int = param(0, "seed of the random baseline and of training (default {default})", type=seed_int)
    task_seed: int = param(0, "seed of task generation and of the train/test table split (default {default}; "
                              "NeuroShard's cost data use the split of seed 0)", type=seed_int)
    batch_size: int | None = None
    bench_iters: int | None = None
    warmup_iters: int | None = None
    comm_iters: int | None = None
    optimizer: str = EXACT_SGD
    cache_path: str | None = None
    no_cache: bool = False
    timeout: float = DEFAULT_TIMEOUT_S
    oracle: str = "measured"                 # or "emulated:h200" (shardcore.oracles.factory)
    emulator_fit: str = HELDOUT              # which fit of an emulated card judges (shardcore.planning.EMULATOR_FITS)
    repeats: int | None = param(None, "measure every plan in N interleaved rounds and keep the medians (default "
                                f"{MEASURED_REPEATS} on the measured oracle, whose rounds differ by a few percent; 1 "
                                "on an emulated one)", type=positive_int, metavar="N")
    comm_bandwidth: float | None = None      # modelled all-to-all (None: the model's default)
    comm_latency: float | None = None
    devices_per_host: int | None = None      # hosts of G devices, two-level exchange (None: one host)
    inter_host_bandwidth: float | None = None
    inter_host_latency: float | None = None
    skip_train: bool = param(False, "never train: use given or existing checkpoints, skip methods without one",
                             action="store_true", group=LEARNED)
    retrain: bool = param(False, "train again even where --models-dir holds a finished checkpoint",
                          action="store_true", group=LEARNED)
    # each planner's settings from its own flags (--shardkit-time, --torchrec-time ...), as plain values by the
    # planner that owns them (shardcore.cli.algorithms.planner_configs)
    planner_args: dict = field(default_factory=dict)
    model_paths: dict = field(default_factory=dict)   # method -> checkpoint given by the user
    train_args: dict = field(default_factory=dict)    # method -> extra flags (a string) for its script
    train_timeout_s: float | None = param(-1.0, "stop a training run after S seconds (DreamShard then uses its "
                                          "newest checkpoint; default: the scale's, 720 s at small, none at full)",
                                          flags=("--train-timeout",), dest="train_timeout", type=positive_float,
                                          metavar="S", group=LEARNED)   # -1: the scale's
    # the breakdown figure's task set (None: the last task set); the flag gives a one-set tuple
    breakdown_set: TaskSetDef | None = param(None, "task set of breakdown.png (default: the last task set)",
                                             type=task_sets_arg, metavar="T:D")
    quiet: bool = param(False, "do not echo the training scripts' output (it is logged)", action="store_true")
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
        c.comm_iters = sc.comm_iters if self.comm_iters is None else self.comm_iters
        c.train_timeout_s = sc.train_timeout_s if self.train_timeout_s == -1.0 else self.train_timeout_s
        c.models_dir = self.models_dir or os.path.join("models", "experiments", self.scale)
        algs = tuple(self.algs) if self.algs else all_algs()
        known = known_algs()
        bad = [a for a in algs if a not in known]
        if bad:
            raise ShardError(f"--algs: unknown algorithm {bad[0]!r}: choose from {', '.join(known)}")
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
        from shardcore.planning import MEASURED, check_emulator_fit, parse_landscape

        c.oracle = parse_landscape(self.oracle)
        check_emulator_fit(c.emulator_fit, "--emulator-fit")
        if SCALES[c.scale].emulated_only and c.oracle == MEASURED:
            raise ShardError(f"--scale {c.scale} plans for tens of devices: judge it on --oracle emulated:h200")
        c.repeats = (MEASURED_REPEATS if c.oracle == MEASURED else 1) if self.repeats is None else int(self.repeats)
        if c.repeats < 1:
            raise ShardError(f"--repeats must be at least 1, got {c.repeats}")
        return c


def add_experiment_args(p: argparse.ArgumentParser, learned: argparse._ArgumentGroup) -> None:
    """tools/run_experiments.py's flags, generated from :class:`ExperimentConfig` (the training flags
    into ``learned``); ``--algs``' help names every algorithm of the results table."""
    add_config_args(p, ExperimentConfig(), groups={LEARNED: learned})
    for action in p._actions:
        if action.help and "{all_algs}" in action.help:
            action.help = action.help.replace("{all_algs}", ",".join(all_algs()))
