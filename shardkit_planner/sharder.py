"""``--alg shardkit``: a planner built of stages, each an object with one verb, passed to the sharder.

1. **Starts** (:mod:`shardkit_planner.starts`, ``propose``): every start of ``starts`` that places the
   task -- the model's greedy, the TorchRec-shaped hybrid, replication, splits chosen by cost for the
   tables that fit on no device, the greedy baselines, other planners (``torchrec``, a checkpoint).
   Starts that cannot place the task, or whose plan uses a sharding type outside ``types``, are
   skipped; none left: :class:`~shardcore.errors.InfeasibleError` naming the table that needs what.
2. **Estimate** (:class:`~shardkit_planner.costmodel.CostModel`): per device the four cost parts of a
   plan (``estimate``), the emulated card's own model or one fitted on this machine.
3. **Improve** (:class:`~shardkit_planner.search.LocalSearch`, ``improve``): a local search from each
   start by the moves of :mod:`shardkit_planner.moves`, then an iterated local search from the best
   local optimum (kick, search again, keep the better; the kicks' generator seeded by ``seed`` and the
   task's tables), all within one :class:`~shardkit_planner.search.WorkBudget` counted in candidates
   priced (``work``), so the same task gives the same plan on an idle or a busy machine; ``time`` is
   only an outer wall-clock cap, and the record says when it cut the search short.
4. **Refine** (:mod:`shardkit_planner.refine`, with ``refine_k > 0`` and an oracle attached by
   ``eval.py --shardkit-refine K``): up to ``k`` measurements that each correct the model and search
   again; the fastest measured plan is kept (``measures_candidates``: the comparison measures it again).

``last_info`` records the start, the moves taken, the model's cost, the work spent and the measurements
used.
"""

from __future__ import annotations

import dataclasses
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from shardcore.baselines import Sharder
from shardcore.oracles.cache import measurement_store
from shardcore.oracles.commmodel import CommModel
from shardcore import io
from shardcore.errors import InfeasibleError, ShardError
from shardcore.plan import COLUMN_WISE, DATA_PARALLEL, GRID, ROW_WISE, TABLE_WISE, Plan
from shardcore.planning import DEFAULT_BATCH_SIZE, DEVICES, HELDOUT, PlanningContext, is_card_file, parse_landscape
from shardcore.tables import TableConfig
from shardcore.topology import Topology

from .config import CONFIG, MEASURED_REFINE, ShardkitConfig  # noqa: F401  (MEASURED_REFINE: re-exported)
from .costmodel import EMULATED, CostModel, emulated_model
from .refine import refine
from .search import ALL_TYPES, LocalSearch, SearchStats, State, WorkBudget, kick, recreate
from .starts import PlannerStart, PlanningTask, make_start

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CPU_MODEL = ROOT / "models" / "shardkit" / "cpu_cost_model.json"
HELDOUT_SUBSET = "drop:0/5"    # shardkit's held-out emulator: one fifth of the judge's shards left out


def _fit_lazy_parts(compute) -> None:
    """Fit now what an emulated compute model fits on first use (its replica law: a least-squares fit
    over the measured devices with replicas, ~2 s on 2 cores), so that it is part of the task's model
    fit and not of the planning."""
    getattr(compute, "replica_weights", None)


# the measured oracle's default types: row-wise among them (a lone dominant table's backward is per-id work
# on a CPU, which a column split doubles and a row split divides; docs/shardkit.md)
MEASURED_TYPES = (TABLE_WISE, COLUMN_WISE, ROW_WISE)
KICK_PATIENCE = 40         # the iterated search stops after this many kicks in a row gain nothing
# half the kicks ruin and recreate 30% of the whole tables (search.recreate), half move 2-4 at random: on
# the emulated H200's honest-margin sets this did better than random kicks alone, recreate alone, or
# recreating half the tables (docs/shardkit.md)
RECREATE_KICKS = 0.5
RECREATE_SHARE = 0.3
TYPE_NAMES = {"tw": TABLE_WISE, "cw": COLUMN_WISE, "rw": ROW_WISE, "dp": DATA_PARALLEL, "grid": GRID}


@dataclass
class ShardkitSharder(Sharder):
    """shardkit's planner: the stages of the module notes, each passed in (or made from the names of
    ``starts``), so a test or a user can swap any of them."""

    model: CostModel | None = None
    model_factory: Any = None                 # a ModelSource: make(oracle) -> CostModel, called on first use
    time_budget_s: float = CONFIG.time        # the outer wall-clock cap per task
    work: float = CONFIG.work                 # the search's work budget per task (search.WorkBudget)
    starts: tuple = CONFIG.starts
    proposers: tuple | None = None            # the starts as Proposer objects (default: made from ``starts``)
    improver: LocalSearch = field(default_factory=LocalSearch)
    refine_k: int = 0                         # no oracle of its own: make_sharder gives CONFIG.refine_k(landscape)
    types: tuple = ALL_TYPES                  # sharding types its plans may use (table-wise always)
    planners: Any = None                      # name -> Sharder: builds a start that is another planner
    oracle: Any = None
    emulator_fit: str = "heldout"             # on an emulated landscape: plan each task with a held-out fit
    robust: bool = CONFIG.robust              # minimise the expected slowest device under the model's error
    seed: int = 0                             # the kicks' generator (with the task's tables)
    max_kicks: int | None = CONFIG.kicks      # None: until the budget or KICK_PATIENCE kicks without a gain
    last_info: dict = field(default_factory=dict)

    def __post_init__(self):
        self.types = tuple(dict.fromkeys((TABLE_WISE,) + tuple(self.types)))
        if self.proposers is None:
            self.proposers = tuple(make_start(n, self.planners) for n in self.starts)

    def plan_stats(self) -> dict:
        return dict(self.last_info)

    def attach_oracle(self, oracle) -> None:
        """The oracle whose measurements refine the choice (when ``refine_k > 0``) and calibrate a model
        of a machine that has none. Attached before the oracle's workers start
        (:func:`shardcore.cli.algorithms.attach_oracle`): the cost model is built here where it needs no
        measuring, else what calibration needs is checked, so missing cost data stops the command
        before anything is measured."""
        self.oracle = oracle
        if self.model is None and self.model_factory is not None:
            self.model = self.model_factory.check(oracle)

    def resolve_starts(self) -> None:
        """Every start that is another planner or a checkpoint, resolved now (by :func:`make_sharder`):
        a missing checkpoint stops the command before any worker starts. A start whose package is not
        installed (TorchRec) is skipped per task."""
        for p in self.proposers:
            if isinstance(p, PlannerStart):
                try:
                    p.sharder()
                except ImportError:
                    pass

    @property
    def measures_candidates(self) -> bool:
        """True when the plan was chosen by measuring on the attached oracle (its kept measurement is
        the smallest of several: the comparison measures it again, see :class:`Sharder`)."""
        return self.refine_k > 0 and self.oracle is not None

    def cost_model(self) -> CostModel:
        if self.model is None:
            if self.model_factory is None:
                raise ShardError("shardkit: no cost model")
            self.model = self.model_factory.make(self.oracle)
        return self.model

    def load(self) -> None:
        """What is loaded once, before any planning (as a planner's import would be): the cost model
        and, for an emulated card, its measurements (the held-out refits' data)."""
        model = self.cost_model()
        if model.landscape.startswith("emulated:") and not is_card_file(model.landscape.split(":", 1)[1]):
            from shardcore.oracles.emulated.measurements import measured_landscapes

            measured_landscapes(model.landscape.split(":", 1)[1])

    def task_model(self, tables: Sequence[TableConfig], topology: Topology | None = None) -> CostModel:
        """The model a task is planned with. Planning for the held-out emulated card
        (``emulator_fit="heldout"``): its compute is the emulator refitted without every measured shard
        that holds one of the task's tables and without one fixed fifth of the rest
        (:func:`shardcore.oracles.emulated.emulator.heldout_model` with :data:`HELDOUT_SUBSET`), so shardkit never plans
        with a model that saw the task's tables, nor with the judge itself. Where that leaves too few
        shards to refit (hundreds of measured tables), the shipped fit, said in the model's ``source``.
        Its bias and error on devices holding row-wise blocks or replicas are those measured on other
        tasks' devices of plans with the topology's devices where enough were measured, else of all. A card
        file's landscape plans with the card's fit (calibrated without the tasks' tables where it was told
        them, ``--exclude-tasks``), its error the card's own held-out one; held-out refits are the shipped
        card's."""
        model = self.cost_model()
        if not model.landscape.startswith("emulated:"):
            return model
        if is_card_file(model.landscape.split(":", 1)[1]):
            from shardcore.oracles.emulated.card import read_card

            _fit_lazy_parts(model.compute)
            error = read_card(model.landscape.split(":", 1)[1]).error_ratios() if self.robust else None
            return dataclasses.replace(model, error=error)
        from shardcore.oracles.emulated.measurements import (heldout_model, model_error, piece_bias, piece_spread,
                                                             seen_tables)

        card = model.landscape.split(":", 1)[1]
        ndevices = topology.ndevices if topology is not None else None
        seen = seen_tables(tables, card) if self.emulator_fit == "heldout" else frozenset()
        bias = piece_bias(seen, card, model.batch_size, ndevices) or None   # measured on other tasks' devices
        spread = (piece_spread(seen, card, model.batch_size, ndevices) or None) if self.robust else None   # and its spread
        why = ""
        if seen:
            try:
                compute = heldout_model(seen, card, HELDOUT_SUBSET)
            except ShardError as exc:   # hundreds of measured tables leave a refit too few shards
                seen, why = frozenset(), io.first_line(exc, 200)
        if not seen:
            _fit_lazy_parts(model.compute)
            error = model_error(frozenset(), card) if self.robust else None
            out = dataclasses.replace(model, error=error, kind_bias=bias, kind_error=spread)
            if why:
                out = dataclasses.replace(out, source=f"{model.source}; the shipped fit, no held-out refit ({why})")
            return out
        _fit_lazy_parts(compute)
        return dataclasses.replace(model, compute=compute, kind_bias=bias, kind_error=spread,
                                   error=model_error(seen, card, HELDOUT_SUBSET) if self.robust else None,
                                   source=f"emulator ({card}) refitted without the task's {len(seen)} measured "
                                          f"tables and fold {HELDOUT_SUBSET.split(':')[1]} of the rest")

    @staticmethod
    def for_precision(model: CostModel, precision: str) -> CostModel:
        """``model`` pricing weights of ``precision``: an emulated card prices any precision (fp32 by the
        bytes it moves, from its fp16 measurements); a model fitted on this machine's measurements only
        its own."""
        if model.precision == precision:
            return model
        card = model.landscape.split(":", 1)[1] if model.landscape.startswith("emulated:") else None
        if is_card_file(card):
            from shardcore.oracles.emulated.card import read_card

            note = read_card(card).precision_note(precision, f"shardkit's cost model (card {card})")
            return dataclasses.replace(model, precision=precision, source=f"{model.source}; {note}")
        if card is not None:
            from shardcore.oracles.emulated.model import FP32_NOTE

            note = f"; {FP32_NOTE}" if precision == "fp32" else ""
            return dataclasses.replace(model, precision=precision, source=model.source + note)
        raise ShardError(f"shardkit's cost model ({model.source or model.landscape}) was fitted on {model.precision} "
                         f"measurements; planning {precision} weights needs one fitted on {precision} "
                         f"(tools/fit_shardkit_model.py --weights-precision {precision})")

    @staticmethod
    def _ties_to_the_point_estimate(pool: list, model: CostModel, task: PlanningTask) -> list:
        """``pool`` (best first by the objective) with the best plan replaced by the one of lowest point
        estimate among those the objective cannot tell from it: where the objective is the expected slowest
        device over fixed draws of the model's error, two plans whose expectations differ by less than the
        standard error of the best one's are a tie, and the model's own figure decides. A point objective
        leaves the pool as it is."""
        if model.error is None or len(model.error) == 0 or len(pool) < 2:
            return pool
        best = State.of(model, pool[0][2])
        per_draw = best.slowest_per_draw()
        tie = float(per_draw.std(ddof=1) / np.sqrt(len(per_draw))) if len(per_draw) > 1 else 0.0
        level = pool[0][0][0] + tie
        tied = [x for x in pool if x[0][0] <= level]
        points = [float(model.device_costs(plan).max()) for _, _, plan in tied]
        k = int(np.argmin(points))
        return [tied[k]] + [x for x in pool if x is not tied[k]]

    def start_plans(self, task: PlanningTask) -> list[tuple[str, Plan]]:
        """The starts that place the task with the allowed types, in ``proposers`` order; where none
        does, :class:`InfeasibleError` saying what each start hit (and, for a table no device holds
        whole, which sharding types would place it)."""
        out, why = [], {}
        allowed = set(self.types)
        for p in self.proposers:
            try:
                plan = p.propose(task)
            except (InfeasibleError, ImportError) as exc:
                why[p.name] = io.first_line(exc, 120)
                continue
            used = set(plan.sharding_types)
            if not used <= allowed:
                why[p.name] = f"its plan uses {', '.join(sorted(used - allowed))}, not in --shardkit-types"
            elif not plan.feasible:
                why[p.name] = "its plan exceeds the memory cap"
            else:
                out.append((p.name, plan))
        if not out:
            raise InfeasibleError(f"infeasible: {self._needs(task) or 'no start of shardkit places the task'} "
                                  f"({'; '.join(f'{n}: {w}' for n, w in why.items())})")
        return out

    def _needs(self, task: PlanningTask) -> str:
        """What a task whose largest table fits on no device needs, in words (empty where it fits)."""
        big = max(range(len(task.tables)), key=lambda i: task.memory(task.tables[i]))
        t = task.tables[big]
        if task.topology.holds(task.memory(t)):
            return ""
        names = {v: k for k, v in TYPE_NAMES.items()}
        splits = [names[x] for x in (COLUMN_WISE, ROW_WISE, GRID) if x in self.types]
        return (f"table {t.index} (task position {big}, {task.memory(t):.3f} GiB in {task.precision}) fits on no "
                f"device of {task.cap:g} GiB and must be split; " +
                (f"the allowed types ({', '.join(names[x] for x in self.types)}) do not place it" if splits else
                 f"allow cw or rw in --shardkit-types (now {', '.join(names[x] for x in self.types)})"))

    def shard(self, tables, topology):
        ndevices = topology.ndevices
        tables = list(tables)
        self.load()
        model = self.for_precision(self.task_model(tables, topology), topology.precision)
        task = PlanningTask(tables, topology, model, self.types)
        budget = WorkBudget(self.work, self.time_budget_s)
        starts = self.start_plans(task)
        states = [(None, name, State.of(model, plan), plan) for name, plan in starts]
        states = sorted(((st.score, name, st, plan) for _, name, st, plan in states), key=lambda x: x[0])
        pool: list[tuple[tuple, str, Plan]] = [(score, name, plan) for score, name, _, plan in states]
        stats = SearchStats(accepted={})
        searched = []
        for score, name, st, _ in states:   # from every start (best first) while the budget lasts
            if searched and budget.exhausted:
                break
            self.improver.improve(st, budget, types=self.types, stats=stats)
            searched.append(name)
            pool.append((st.score, f"{name}+search", st.plan()))
        # the budget left: iterated local search from the best local optimum (kick, search again, keep
        # the better), with a generator seeded by the task's tables
        searched_states = sorted((st for _, _, st, _ in states[:len(searched)]), key=lambda x: x.score)
        kicks = gains = 0
        if searched_states and ndevices > 1 and not budget.exhausted and self.max_kicks != 0:
            best_st = searched_states[0]
            best_name = min((x for x in pool if x[1].endswith("+search")), key=lambda x: x[0])[1]
            rng = np.random.default_rng([int(self.seed), zlib.crc32(",".join(str(t.index) for t in tables).encode())])
            since = 0   # kicks since the last gain: after KICK_PATIENCE of them the search ends early
            while (not budget.exhausted and since < KICK_PATIENCE
                   and (self.max_kicks is None or kicks < self.max_kicks)):
                st = best_st.copy()
                built = st.built_total
                if rng.random() < RECREATE_KICKS:
                    recreate(st, rng, RECREATE_SHARE)
                else:
                    kick(st, rng, int(rng.integers(2, 5)), types=self.types)
                budget.spend(1, st.built_total - built)   # the kick's own work: the pieces it re-placed
                self.improver.improve(st, budget, types=self.types, stats=stats)
                kicks, since = kicks + 1, since + 1
                if st.score < best_st.score:
                    best_st, gains, since = st, gains + 1, 0
            if since >= KICK_PATIENCE:
                stats.stopped = f"no gain in {KICK_PATIENCE} kicks"
            if gains:
                pool.append((best_st.score, f"{best_name}+kicks", best_st.plan()))
        if budget.cut_by_time:
            stats.stopped = "time cap"
        pool.sort(key=lambda x: x[0])
        pool = self._ties_to_the_point_estimate(pool, model, task)
        distinct, seen = [], set()
        for score, name, plan in (pool if self.refine_k > 0 else pool[:1]):   # refinement measures distinct ones
            key = tuple((s.type, s.devices, s.dims) for s in plan.shardings)
            if key not in seen:
                seen.add(key)
                distinct.append((score, name, plan))
        best_score, best_name, best = distinct[0]
        point = float(model.device_costs(best).max())
        info = {"shardkit_start": best_name, "shardkit_model_ms": round(point, 4),
                "shardkit_start_ms": round(states[0][0][0], 4), "shardkit_searched": searched,
                "shardkit_moves": dict(stats.accepted), "shardkit_rounds": stats.rounds,
                "shardkit_kicks": kicks, "shardkit_kick_gains": gains,
                "shardkit_work": round(budget.used, 1), "shardkit_work_budget": budget.work,
                "shardkit_candidates": stats.candidates,
                "shardkit_stopped": stats.stopped, "shardkit_measurements": 0,
                "shardkit_refine_k": self.refine_k if self.measures_candidates else 0,
                "shardkit_model": model.source}
        if model.error is not None and len(model.error):   # the objective it minimised: the expected slowest
            info["shardkit_expected_ms"] = round(best_score[0], 4)
        if self.refine_k > 0:
            if self.oracle is None:
                raise ShardError("shardkit: refinement (--shardkit-refine) needs an oracle; plan-only runs have none")
            res = refine(model, self.oracle, [(name, plan) for _, name, plan in distinct], self.refine_k,
                         budget=lambda: WorkBudget(self.work, self.time_budget_s), types=self.types,
                         stats=stats, search=self.improver.improve)
            info.update({"shardkit_measurements": len(res.measured_ms),
                         "shardkit_measurements_from_cache": res.from_cache,
                         "shardkit_measured_ms": [round(c, 4) for c in res.measured_ms],
                         "shardkit_measured_plans": res.names,
                         "shardkit_model_choice_ms": round(res.model_first_ms, 4),
                         "shardkit_start": res.name, "shardkit_moves": dict(stats.accepted)})
            best = res.plan
        self.last_info = info
        return best


def fit_from_cache(data_dir, batch_size, cache_path, exclude_task_files) -> CostModel:
    """The measured landscape's model fitted now on the cache's measurements of this machine (when no
    fitted file exists, e.g. inside ``make experiments`` after the learned methods' training filled
    the cache); tables of ``exclude_task_files`` are left out of the fit."""
    from shardcore.oracles.cache import CostCache
    from shardcore.oracles.setting import hardware_fingerprint
    from shardcore.dataset import load_dataset

    from .calibrate import excluded_tables
    from .costmodel import fit_cost_model

    path = cache_path or ROOT / "data" / "cost_cache.sqlite"
    if data_dir is None or not Path(path).is_file():
        raise ShardError(f"--alg shardkit on the measured oracle needs a cost model fitted on this machine: "
                         f"{DEFAULT_CPU_MODEL} is missing and there is no measurement cache to fit one from; "
                         "`python eval.py --alg shardkit --data-dir D --task-path TASKS` (without --plan-only) "
                         "measures what it needs (--shardkit-calibrate S), or give --shardkit-model, or plan for "
                         "--oracle emulated:h200")
    ds = load_dataset(data_dir)
    exclude = excluded_tables(exclude_task_files, ds.num_tables)
    with CostCache(path) as cache:
        try:
            return fit_cost_model(cache, ds, int(batch_size or ds.batch_size), hardware=hardware_fingerprint(),
                                  data_dir=data_dir, exclude_tables=exclude, comm_fallback=CommModel())
        except ShardError as exc:
            raise ShardError(f"--alg shardkit on the measured oracle: {exc}; `python eval.py --alg shardkit "
                             f"--data-dir {data_dir} --task-path TASKS` (without --plan-only) measures what it "
                             "needs itself (--shardkit-calibrate S)") from None


@dataclass
class ModelSource:
    """Where the cost model of a landscape comes from: ``make(oracle)`` builds it (the shardkit model file
    given, the emulated card's own model, the fitted model of this machine, a calibration through the
    measured oracle's cache, or a fit of that cache); ``check(oracle)``, before the oracle's workers
    start, returns it where it needs no measuring (or raises the one-line error saying what is missing),
    None where it will calibrate."""

    landscape: str
    data_dir: Any = None
    batch_size: int | None = None
    model_path: str | None = None
    comm: dict = field(default_factory=dict)
    cache_path: Any = None
    exclude_task_files: Any = None
    calibrate_s: float = CONFIG.calibrate
    wrap: Any = None            # CostModel -> CostModel applied to what make() builds (e.g. TorchRec's limits)

    def calibrates(self, oracle) -> bool:
        """Whether :meth:`make` measures (calibration) rather than loads or fits a model."""
        return (not self.model_path and not self.landscape.startswith("emulated") and not DEFAULT_CPU_MODEL.is_file()
                and oracle is not None and self.calibrate_s > 0 and self.data_dir is not None)

    def make(self, oracle=None) -> CostModel:
        """``oracle``: the measured oracle attached (eval.py attaches it), which calibration measures on."""
        model = self._make(oracle)
        return self.wrap(model) if self.wrap is not None else model

    def _make(self, oracle) -> CostModel:
        if self.model_path:
            return CostModel.load(self.model_path)
        if self.landscape.startswith("emulated"):
            return emulated_model(self.data_dir or os.devnull, self.batch_size or DEFAULT_BATCH_SIZE, CommModel.of(**self.comm),
                                  card=self.landscape.split(":", 1)[1])
        if DEFAULT_CPU_MODEL.is_file():
            return CostModel.load(DEFAULT_CPU_MODEL)
        if self.calibrates(oracle) and getattr(oracle, "context", None):
            from .calibrate import calibrated_model

            return calibrated_model(oracle, self.data_dir, self.exclude_task_files, self.calibrate_s)
        return fit_from_cache(self.data_dir, self.batch_size, self.cache_path, self.exclude_task_files)

    def check(self, oracle=None) -> CostModel | None:
        if self.calibrates(oracle) and measurement_store(oracle) is not None:
            from .calibrate import check_calibration

            check_calibration(oracle, self.data_dir, self.exclude_task_files)   # enough tables outside the tasks
            return None
        return self.make(oracle)


def parse_types(names: Sequence[str]) -> tuple[str, ...]:
    """``--shardkit-types`` names (tw, cw, rw, dp, grid or the full names) as sharding types."""
    types = tuple(TYPE_NAMES.get(str(t).lower(), str(t).lower()) for t in names)
    bad = [t for t in types if t not in ALL_TYPES]
    if bad:
        raise ShardError(f"--shardkit-types: unknown type {bad[0]!r} (tw, cw, rw, dp, grid or their full names)")
    return types


def make_sharder(ctx: PlanningContext, config: ShardkitConfig | None = None, checkpoint=None,
                 planners: Callable[[str], Sharder] | None = None) -> ShardkitSharder:
    """``--alg shardkit`` for ``ctx``, with ``config`` (the ``--shardkit-*`` flags; None: :data:`CONFIG`).
    It plans for ``config.oracle``, else the landscape that judges (``ctx.landscape``), else emulated:h200:
    on ``measured`` the fitted model of this machine (``models/shardkit/cpu_cost_model.json`` unless
    ``config.model`` names one, else fitted on the spot from the landscape's cache without the tables of
    the evaluated task files), on ``emulated:h200`` the emulator. ``config.types``: the sharding types its
    plans may use (default: all five on the emulated landscape; table-, column- and row-wise on the measured
    one, whose fitted exchange model has not been calibrated on data-parallel collectives). A start that is
    another planner is built by ``planners`` in the same context."""
    if checkpoint is not None:
        raise ShardError("--alg shardkit takes no checkpoint (its cost model: --shardkit-model FILE.json)")
    cfg = config or CONFIG
    landscape = parse_landscape(cfg.oracle or ctx.oracle or EMULATED)
    if not float(cfg.time) > 0:
        raise ShardError(f"--shardkit-time must be positive seconds, got {cfg.time}")
    if not int(cfg.work) > 0:
        raise ShardError(f"--shardkit-work must be a positive number of work units, got {cfg.work}")
    refine_k = cfg.refine_k(landscape)
    if refine_k < 0:
        raise ShardError(f"--shardkit-refine must be 0 or more, got {cfg.refine}")
    starts = tuple(cfg.starts) or CONFIG.starts   # none named: the default starts
    if "shardkit" in starts:
        raise ShardError("--shardkit-starts cannot name shardkit itself")
    if cfg.types:
        types = parse_types(cfg.types)
    else:
        types = ALL_TYPES if landscape.startswith("emulated") else MEASURED_TYPES
    land = ctx.landscape
    factory = ModelSource(landscape, land.data_dir, ctx.batch_size, cfg.model, land.comm_kwargs(ctx.topology),
                          land.cache_path, list(ctx.evaluated_tasks) or None, float(cfg.calibrate))
    # judged by devices (the judge has seen the task's tables among others), shardkit still plans with a model
    # that never saw them: the harder comparison for it, where the learned methods' training oracle saw them
    fit = HELDOUT if land.fit == DEVICES else land.fit
    sharder = ShardkitSharder(name="shardkit", model_factory=factory, time_budget_s=float(cfg.time),
                              work=int(cfg.work), starts=starts, refine_k=refine_k, types=types, planners=planners,
                              emulator_fit=fit, robust=bool(cfg.robust), seed=int(ctx.seed),
                              max_kicks=None if cfg.kicks is None else int(cfg.kicks))
    sharder.resolve_starts()
    return sharder


def make_sharder_tw(ctx: PlanningContext, config: ShardkitConfig | None = None, checkpoint=None,
                    planners: Callable[[str], Sharder] | None = None) -> ShardkitSharder:
    """``--alg shardkit-tw``: shardkit's search restricted to table-wise placement, the reference a
    table-wise method (DreamShard, AutoShard, NeuroShard's placement) is measured against (its
    "table-wise optimum found by search"). Takes every ``--shardkit-*`` flag except the types."""
    sharder = make_sharder(ctx, dataclasses.replace(config or CONFIG, types=("tw",)), checkpoint, planners)
    sharder.name = "shardkit-tw"
    return sharder
