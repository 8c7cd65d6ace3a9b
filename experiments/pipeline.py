"""The experiment runner: the paper-style results table, plots and summary (``tools/run_experiments.py``).

:func:`run_experiments`:

1. generate the standard DreamShard-style task sets with :mod:`shardcore.data.taskgen` (one train/test
   split of the dataset's tables shared by every set, so test tasks hold only tables that no learned
   method saw in training);
2. train the learned methods the registry lists (:mod:`experiments.training`) on the train split of
   one task set per device count, or load a given / existing checkpoint; a method whose package or
   script is missing, whose training fails or that ``--skip-train`` leaves without a checkpoint is
   skipped with a note;
3. per task set, ONE hardware oracle session measures every algorithm side by side, task by task
   (:func:`shardcore.evaluation.compare.evaluate`), and the set's statistics are computed once
   (:func:`shardcore.evaluation.report.summarize`);
4. write the outputs (:mod:`experiments.output`) after every task set (so an interrupted run keeps
   what it measured) and at the end.
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from shardcore import registry

from shardcore.evaluation import report
from shardcore.baselines import BASELINES, Sharder
from shardcore.errors import InfeasibleError, ShardError
from shardcore.evaluation.compare import TaskResult, evaluate
from shardcore.tables import TableConfig
from shardcore.data.taskgen import TaskSpec, generate_tasks, generate_transfer_tasks
from shardcore.oracles.emulated.measurements import judge_pool
from shardcore.tasks import load_tasks, save_tasks
from shardcore.cli.algorithms import configs_from_dicts
from shardcore.oracles.commmodel import comm_kwargs
from shardcore.planning import Landscape, PlanningContext
from shardcore.topology import Topology

from .config import PLUGINS, SCALES, ExperimentConfig, TaskSetDef, baseline_planners, learned_methods, planners
from .facts import machine_info, now, software_versions
from .output import SetOutcome, mean_line, terminal_text, write_outputs
from .training import LearnedModel, model_for, prepare_learned


# ------------------------------------------------------------------------------------------------
# Sharders
# ------------------------------------------------------------------------------------------------

@dataclass
class GuardedSharder(Sharder):
    """A method's failure on one task (an exception other than "infeasible") becomes that task's
    error instead of ending a long run. The plan is refused like an infeasible one (the only way
    :func:`~shardcore.evaluation.compare.evaluate` skips a plan), and the failure is kept, typed, for
    :meth:`outcome`, which the runner records as ``Outcome.FAILED`` in the task's result."""

    inner: Sharder = None
    failure: str | None = None

    def shard(self, tables, topology):
        self.failure = None
        try:
            return self.inner.shard(tables, topology)
        except InfeasibleError:
            raise
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            self.failure = f"{self.name}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            raise InfeasibleError(self.failure) from None

    def outcome(self) -> report.Outcome | None:
        """FAILED after a call that failed, else None (then the result says what happened)."""
        return report.Outcome.FAILED if self.failure is not None else None

    def plan_stats(self) -> dict:
        """The inner planner's statistics of its last plan (TorchRec's types and configuration...)."""
        return self.inner.plan_stats() if self.failure is None else {}

    def attach_oracle(self, oracle) -> None:
        self.inner.attach_oracle(oracle)

    @property
    def measures_candidates(self) -> bool:
        return bool(self.inner.measures_candidates)


def topology_of(cfg: ExperimentConfig, ndevices: int) -> Topology:
    """A task set's topology: its devices, the run's cap, precision and hosts."""
    return Topology(ndevices, cfg.max_memory, cfg.precision, devices_per_host=cfg.devices_per_host or 0)


def planning_context_of(cfg: ExperimentConfig, ndevices: int, batch_size: int | None,
                        evaluated_tasks: Sequence[str] = ()) -> PlanningContext:
    """The context every planner of a task set is built with: its topology, the judged batch and landscape."""
    land = Landscape(cfg.oracle, fit=cfg.emulator_fit, comm_bandwidth=cfg.comm_bandwidth, comm_latency=cfg.comm_latency,
                     inter_host_bandwidth=cfg.inter_host_bandwidth, inter_host_latency=cfg.inter_host_latency,
                     data_dir=cfg.data_dir, cache_path=cfg.cache_path)
    return PlanningContext(topology_of(cfg, ndevices), batch_size, land, cfg.seed, tuple(evaluated_tasks))


def build_sharders(algs: Sequence[str], ctx: PlanningContext, learned: dict[str, dict[int, LearnedModel]],
                   notes: list[str] | None = None, configs: dict | None = None
                   ) -> tuple[dict[str, Sharder], dict[str, str]]:
    """Sharders of the available algorithms for one task set's context (its devices, the judged landscape,
    the test tables a fitted model must not see), each with its own settings from ``configs``, and the
    checkpoint used per learned one."""
    from shardcore.cli import algorithms

    sharders: dict[str, Sharder] = {}
    used: dict[str, str] = {}
    ndevices = ctx.topology.ndevices
    for alg in algs:
        if alg in BASELINES:
            sharders[alg] = algorithms.build(alg, ctx)
        elif alg in PLUGINS or alg in baseline_planners() or alg in planners():   # TorchRec, shardkit
            try:
                sharders[alg] = GuardedSharder(alg, inner=algorithms.build(alg, ctx, configs))
            except ShardError as exc:
                if notes is not None:
                    notes.append(f"{alg}: skipped: {exc}")
        else:
            m = model_for(learned.get(alg, {}), ndevices)
            if m is None:
                continue
            try:
                inner = algorithms.build(m.checkpoint, ctx, configs)
            except ShardError as exc:
                if notes is not None:
                    notes.append(f"{alg}: skipped on {ndevices} devices: cannot load {m.checkpoint}: {exc}")
                continue
            sharders[alg] = GuardedSharder(alg, inner=inner)
            used[alg] = m.checkpoint
    return sharders, used


# ------------------------------------------------------------------------------------------------
# Tasks, training, measurement
# ------------------------------------------------------------------------------------------------

def generate_task_files(cfg: ExperimentConfig, tables: Sequence[TableConfig]) -> dict[TaskSetDef, Path]:
    """``<out-dir>/tasks/<slug>/{train,test}.txt`` for every evaluated and training set, and for a
    training set ``train_every_table.txt`` (as many tasks drawn from every table, for a method whose
    original trains so: ``MethodSpec.every_table_tasks``).

    Every set uses the same seed, hence the same train/test split of the dataset's tables (a method
    that draws its own training data from the training pool uses that split too: seed 0, half)."""
    folder = Path(cfg.out_dir) / "tasks"
    out = {}
    for ts in dict.fromkeys(tuple(cfg.task_sets) + tuple(cfg.train_sets)):
        pool = SCALES[cfg.scale].judge_pool
        spec = TaskSpec(t_min=ts.num_tables, t_max=ts.num_tables, num_train=cfg.num_train,
                        num_test=cfg.num_test, seed=cfg.task_seed, ndevices=ts.ndevices, precision=cfg.precision,
                        train_pool=tuple(judge_pool(pool)) if pool else None)
        train, test = generate_tasks(tables, spec)
        save_tasks(folder / ts.slug / "train.txt", train)
        save_tasks(folder / ts.slug / "test.txt", test)
        if ts in cfg.train_sets and cfg.num_train > 0:
            every, _ = generate_transfer_tasks(len(tables), ts.num_tables, ts.num_tables, num_train=cfg.num_train,
                                               num_test=0, seed=cfg.task_seed)
            save_tasks(folder / ts.slug / EVERY_TABLE_TASKS, every)
        out[ts] = folder / ts.slug
    return out


EVERY_TABLE_TASKS = "train_every_table.txt"


def train_paths_for(spec, cfg: ExperimentConfig, task_dirs: dict) -> dict:
    """The training task file of each training set for the method ``spec``: the train split, or tasks of
    every table where its original trains on those."""
    name = EVERY_TABLE_TASKS if spec.every_table_tasks else "train.txt"
    return {ts: task_dirs[ts] / name for ts in cfg.train_sets}


def train_all(cfg: ExperimentConfig, algs: list[str], task_dirs: dict, notes: list[str],
              timings: dict) -> dict[str, dict[int, LearnedModel]]:
    """The learned methods among ``algs``, trained or loaded; skipped ones get a note."""
    learned: dict[str, dict[int, LearnedModel]] = {}
    for method in [a for a in algs if a in learned_methods()]:
        try:
            spec = registry.get(method)
        except ShardError:
            notes.append(f"{method}: skipped: the {method} package is not in this installation")
            print(f"note: {method} is skipped (see results.md)")
            continue
        if cfg.num_train == 0 and not cfg.model_paths.get(method) and spec.needs_train_tasks and not cfg.skip_train:
            notes.append(f"{method}: skipped: --num-train 0 leaves no training tasks")
            continue
        tm = time.perf_counter()
        models = prepare_learned(cfg, spec, train_paths_for(spec, cfg, task_dirs), notes, echo=not cfg.quiet)
        timings[f"train_{method}"] = round(time.perf_counter() - tm, 2)
        if not models:
            print(f"note: {method} is skipped (see results.md)")
            continue
        learned[method] = models
        trained = any(m.source == "trained" for m in models.values())
        if cfg.task_seed != 0 and spec.task_seed_note and trained:
            notes.append(f"{method}: " + spec.task_seed_note.format(task_seed=cfg.task_seed))
        if spec.seen_note and trained:
            notes.append(f"{method}: " + spec.seen_note)
    return learned


def _evaluator_batch_size(cfg: ExperimentConfig) -> int | None:
    from shardcore.dataset import load_dataset
    from shardcore.dataset import configs_batch_size

    if cfg.batch_size is not None:
        return cfg.batch_size
    if cfg.oracle != "measured":
        return configs_batch_size(cfg.data_dir)
    try:
        return load_dataset(cfg.data_dir).batch_size
    except ShardError:
        return None


def set_oracle(cfg: ExperimentConfig, ndevices: int):
    """The hardware oracle of one task set (measured through the cache, or an emulated card)."""
    from shardcore.oracles.commmodel import CommModel
    from shardcore.oracles.factory import open_oracle

    comm = CommModel.of(**comm_kwargs(cfg))
    kwargs = {k: v for k, v in (("bench_iters", cfg.bench_iters), ("warmup_iters", cfg.warmup_iters),
                                ("comm_iters", cfg.comm_iters)) if v is not None}
    if cfg.oracle != "measured":
        kwargs["emulator_fit"] = cfg.emulator_fit
    return open_oracle(cfg.data_dir, ndevices, oracle=cfg.oracle, device_ids=list(range(ndevices)),
                       optimizer=cfg.optimizer, precision=cfg.precision, batch_size=cfg.batch_size,
                       comm_model=comm, cache=cfg.cache_path if cfg.cache_path else True,
                       no_cache=cfg.no_cache, timeout_s=cfg.timeout, **kwargs)


def measure_set(cfg: ExperimentConfig, ts: TaskSetDef, tasks, dataset_tables, sharders: dict[str, Sharder],
                used: dict[str, str], progress: bool | None) -> SetOutcome:
    """Every algorithm on every task of one set, measured in one oracle session, and summarised once."""
    from tqdm import tqdm

    with set_oracle(cfg, ts.ndevices) as ev:
        print(f"{ts.name}: {len(tasks)} tasks x {len(sharders)} algorithms; workers up in "
              f"{ev.info.startup_s:.1f} s on {ev.info.device_type} (batch {ev.batch_size})")
        for alg, sharder in sharders.items():   # a planner that measures (shardkit calibrating) uses this session
            try:
                sharder.attach_oracle(ev)
            except ShardError as exc:   # it then fails task by task, like any planner that cannot plan
                print(f"{ts.name}: {alg}: {exc}")
        def on_result(result: TaskResult, task):
            if result.measured is not None:
                result.extra["from_cache"] = bool(result.measured.from_cache)
            sharder = sharders[result.alg]
            if isinstance(sharder, GuardedSharder) and sharder.outcome() is not None:
                result.extra["outcome"] = sharder.outcome().value
            if not result.feasible:
                tqdm.write(f"{ts.name} task {result.task} {result.alg}: {report.outcome_of(result).value}: "
                           f"{result.error}")

        t1 = time.perf_counter()
        with tqdm(total=len(tasks) * len(sharders), desc=ts.name, unit="plan",
                  disable=(not progress) if progress is not None else None) as bar:
            results = evaluate(tasks, dataset_tables, sharders, topology_of(cfg, ts.ndevices),
                               oracle=ev, on_result=on_result, progress=bar, repeats=cfg.repeats)
        return SetOutcome(ts, results, report.summarize(results, ts.name, seed=cfg.seed), used, ev.info.startup_s,
                          time.perf_counter() - t1, ev.info.device_type, ev.batch_size)


def run_experiments(cfg: ExperimentConfig, progress: bool | None = None) -> dict:
    """The whole pipeline; returns summary.json's content."""
    from shardcore.dataset import load_dataset

    cfg = cfg.resolved()
    t_start = time.perf_counter()
    info: dict[str, Any] = {"date": now(), "command": list(cfg.command), "machine": machine_info(),
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

    # 2. plug-in availability, learned methods
    algs = list(cfg.algs)
    for plugin in [a for a in algs if a in PLUGINS]:
        if importlib.util.find_spec(plugin) is None:
            notes.append(f"{plugin}: skipped: TorchRec is not installed (pip install --no-deps torchrec; see README)")
            print(f"note: {plugin} is not importable; skipping it")
            algs.remove(plugin)
    t0 = time.perf_counter()
    learned = train_all(cfg, algs, task_dirs, notes, info["timings_s"])
    info["timings_s"]["training"] = round(time.perf_counter() - t0, 2)
    algs = [a for a in algs if a not in learned_methods() or a in learned]

    # 3. measure, one oracle session per task set
    batch_size = _evaluator_batch_size(cfg)
    outcomes: list[SetOutcome] = []
    for ts in cfg.task_sets:
        tasks = load_tasks(task_dirs[ts] / "test.txt", num_tables=dataset.num_tables)
        set_notes: list[str] = []
        # the judged hardware: TorchRec's planner and shardkit plan for it too; tables a model fitted from the
        # cache must not have seen
        ctx = planning_context_of(cfg, ts.ndevices, batch_size,
                                  evaluated_tasks=[str(task_dirs[t] / "test.txt") for t in cfg.task_sets])
        sharders, used = build_sharders(algs, ctx, learned, set_notes, configs_from_dicts(cfg.planner_args))
        notes += [n for n in set_notes if n not in notes]
        t0 = time.perf_counter()
        outcomes.append(measure_set(cfg, ts, tasks, dataset.tables, sharders, used, progress))
        info["timings_s"][f"measure {ts.name}"] = round(time.perf_counter() - t0, 2)
        print(f"{ts.name}: mean cost ms: {mean_line(outcomes[-1].summary)}")
        info["timings_s"]["total"] = round(time.perf_counter() - t_start, 2)
        write_outputs(cfg, outcomes, learned, notes, info, finished=False)

    # 4. the outputs, and the terminal's copy of the tables
    info["timings_s"]["total"] = round(time.perf_counter() - t_start, 2)
    info["date_finished"] = now()
    summary, sections = write_outputs(cfg, outcomes, learned, notes, info, finished=True)
    print()
    print(terminal_text(sections))
    print()
    for n in notes:
        print(f"note: {n}")
    print(f"wrote {', '.join(summary['files'])} to {cfg.out_dir}/ in {info['timings_s']['total']:.0f} s")
    return summary
