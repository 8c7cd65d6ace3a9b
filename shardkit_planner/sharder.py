"""``--alg shardkit``: start from the best of several plans, improve it by local search under the cost
model, optionally let the oracle pick among the best candidates.

1. **Starts**: every name in ``starts`` that plans the task: ``model_greedy`` (largest model cost
   first, each table to the device whose modelled cost stays lowest among those with room),
   ``hybrid_greedy`` (the heaviest tables row-wise, small ones replicated, the rest by
   model_greedy: the shape of TorchRec's plans, chosen by the model), ``replicate_greedy``, the
   greedy baselines, ``torchrec`` (TorchRec's full planner, every sharding type) and any other
   ``--alg`` name or checkpoint (resolved through :func:`shardcore.cli.algorithms.resolve`, so a DreamShard
   or AutoShard checkpoint can seed the search without this package importing theirs). Starts that
   cannot place the task are skipped; none at all: :class:`~shardcore.errors.InfeasibleError`.
2. **Search** (:func:`~shardkit_planner.search.local_search`) from the best starts in turn, by the
   model, then, while the time budget lasts, an iterated local search from the best local optimum
   (:func:`~shardkit_planner.search.kick` it, search again, keep the better; the kicks' generator is
   seeded by ``seed`` and the task's tables); the budget is ``time_budget_s``, planning of the starts
   included once the first start is in.
3. **Choice**: the best plan by the model; with ``refine_k > 0`` and an oracle attached
   (:meth:`ShardkitSharder.attach_oracle`, done by ``eval.py --shardkit-refine K``), up to ``k``
   measurements that each correct the model and search again (:mod:`shardkit_planner.refine`), and
   the fastest measured plan is kept (``measures_candidates``: the comparison measures it again).
   ``last_info`` records the start, the moves taken, the model's cost and the measurements used.
"""

from __future__ import annotations

import dataclasses
import heapq
import os
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from shardcore.baselines import GREEDY_KEYS, Sharder, greedy_plan
from shardcore.argtypes import name_list, nonnegative_float, nonnegative_int, positive_float
from shardcore.config import Config, param
from shardcore.oracles.cache import measurement_store
from shardcore.oracles.commmodel import CommModel
from shardcore import io
from shardcore.errors import InfeasibleError, ShardError
from shardcore.plan import COLUMN_WISE, DATA_PARALLEL, ROW_WISE, TABLE_WISE, Plan, data_parallel, row_wise, table_wise
from shardcore.tables import TableConfig
from shardcore.types import Topology

from .costmodel import EMULATED, MEASURED, CostModel, emulated_model
from .refine import refine
from .search import ALL_TYPES, SearchStats, State, kick, local_search, recreate

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CPU_MODEL = ROOT / "models" / "shardkit" / "cpu_cost_model.json"
MEASURED_REFINE = 4         # plan measurements per task where the oracle measures hardware (refine.py)
HELDOUT_SUBSET = "drop:0/5"    # shardkit's held-out emulator: one fifth of the judge's shards left out


def _fit_lazy_parts(compute) -> None:
    """Fit now what an emulated compute model fits on first use (its replica law: a least-squares fit
    over the measured devices with replicas, ~2 s on 2 cores), so that it is part of the task's model
    fit and not of the planning budget, which it would otherwise eat on the first replica priced."""
    getattr(compute, "replica_weights", None)


def model_greedy(model: CostModel, tables: Sequence[TableConfig], ndevices: int, max_memory_gb: float,
                 precision: str, alone: Sequence[float] | None = None) -> Plan:
    """Tables by standalone modelled cost (``alone``, computed when not given), largest first, each on
    the device with the lowest load (summed standalone costs) among those with room; table-wise."""
    if alone is None:
        alone = model.shard_compute([[t] for t in tables])
    order = sorted(range(len(tables)), key=lambda i: (-alone[i], -tables[i].size, i))
    load = [0.0] * ndevices
    mem = [0.0] * ndevices
    alloc = [0] * len(tables)
    heap = [(0.0, d) for d in range(ndevices)]   # (load, device): the first with room is chosen
    for i in order:
        need = tables[i].memory_gb(precision)
        full = []
        while heap and mem[heap[0][1]] + need > max_memory_gb + 1e-12:
            full.append(heapq.heappop(heap))
        if not heap:
            raise InfeasibleError(f"infeasible: table {tables[i].index} (task position {i}) fits on no device")
        d = heapq.heappop(heap)[1]
        alloc[i] = d
        load[d] += float(alone[i])
        mem[d] += need
        heapq.heappush(heap, (load[d], d))
        for entry in full:
            heapq.heappush(heap, entry)
    return Plan.from_shardings(tables, [table_wise(d) for d in alloc], ndevices)


REPLICATE_MAX_GB = 0.05   # the search's own bound on a replicated table (search.local_search's dp_max_gb)
SPREAD_COUNTS = (0, 1, 2, 3, 4, 6, 8)   # hybrid_greedy: how many of the heaviest tables it tries row-wise
# the measured oracle's default types: row-wise since 2026-11-29 (a lone dominant table's backward is
# per-id work on a CPU, which a column split doubles and a row split divides; docs/shardkit.md)
MEASURED_TYPES = (TABLE_WISE, COLUMN_WISE, ROW_WISE)
KICK_PATIENCE = 40         # the iterated search stops after this many kicks in a row gain nothing
# half the kicks ruin and recreate 30% of the whole tables (search.recreate), half move 2-4 at random:
# against random kicks alone (2026-11-28, emulated H200, 5 s per task, two runs each) the stressed margin
# over TorchRec went 4.5 -> 4.6% on DLRM-50, 5.2 -> 5.4% on DLRM-100 and 19.2 -> 20.4% on the NS set;
# recreate alone did worse on DLRM-50 (4.3%), as did recreating half the tables (4.5%)
RECREATE_KICKS = 0.5
RECREATE_SHARE = 0.3
START_SHARE = 0.5          # of the budget, the most the starts may take (the search gets the rest)
OWN_STARTS = ("model_greedy", "hybrid_greedy", "replicate_greedy")   # starts this module makes itself


def hybrid_greedy(model: CostModel, tables: Sequence[TableConfig], ndevices: int, max_memory_gb: float,
                  precision: str, deadline: float | None = None, spread: Sequence[int] = SPREAD_COUNTS,
                  replicate: bool = True) -> Plan:
    """The shape of TorchRec's plans on an H200, chosen by the model: a share of the small tables (of
    at most :data:`REPLICATE_MAX_GB`, fewest rows per lookup first: none, one eighth, ... all)
    data-parallel when ``replicate``; of the others the ``k`` heaviest by standalone modelled cost
    (``k`` in ``spread``) row-wise over every device; the rest by :func:`model_greedy`; the variant
    the model prices lowest (none replicated and none spread is model_greedy, a start of its own, not
    tried). A row-wise table spreads its lookups over every device; a replica spreads them too and
    leaves the all-to-all for an all-reduce of its small weights. With a ``deadline``
    (``time.perf_counter``) a variant is begun only if it fits by the time per device piece of the one
    before (a replica is a piece on every device: at 100k tables one variant can take tens of
    seconds); none fits: :class:`InfeasibleError`, and the start is skipped."""
    t0 = time.perf_counter()
    alone = [float(v) for v in model.shard_compute([[t] for t in tables])]
    # seconds per device piece of a variant: a first guess from the standalone costs, then measured
    rate = 4.0 * (time.perf_counter() - t0) / max(1, len(tables))
    # replicas first where they cost least for what they spread: rows (the all-reduce) per lookup
    small = sorted((i for i, t in enumerate(tables) if t.memory_gb(precision) <= REPLICATE_MAX_GB),
                   key=lambda i: (tables[i].row / max(tables[i].pooling_factor, 0.01), i))
    shares = sorted({j * len(small) // 8 for j in range(9)}) if replicate else [0]
    best: tuple[float, Plan] | None = None
    for k in sorted({min(int(k), len(tables)) for k in spread} if ndevices > 1 else {0}):
        for share in shares:   # the cheaper variants (fewer replicas, so fewer pieces) first
            if k == 0 and share == 0:   # model_greedy itself, a start of its own
                continue
            rep = set(small[:share])
            heavy = set(sorted((i for i in range(len(tables)) if i not in rep), key=lambda i: (-alone[i], i))[:k])
            pieces = len(tables) + (len(rep) + len(heavy)) * (ndevices - 1)
            if deadline is not None and time.perf_counter() + rate * pieces > deadline:
                if best is not None:
                    break   # a larger share with this spread would not fit either
                raise InfeasibleError(f"no time: a variant of {pieces} device pieces would overrun the budget")
            tv = time.perf_counter()
            rest = [i for i in range(len(tables)) if i not in rep and i not in heavy]
            fixed_gb = (sum(tables[i].memory_gb(precision) for i in rep)
                        + sum(tables[i].memory_gb(precision) for i in heavy) / ndevices)
            if not rest or fixed_gb > max_memory_gb:
                continue
            try:
                part = model_greedy(model, [tables[i] for i in rest], ndevices, max_memory_gb - fixed_gb,
                                    precision, [alone[i] for i in rest])
            except InfeasibleError:
                continue
            shardings = [data_parallel(ndevices) if i in rep else row_wise(range(ndevices))
                         for i in range(len(tables))]
            for i, sh in zip(rest, part.table_shardings([tables[i] for i in rest])):
                shardings[i] = sh
            plan = Plan.from_shardings(tables, shardings, ndevices)
            if not plan.is_feasible(tables, max_memory_gb, precision):   # row blocks round up
                continue
            cost = float(model.device_costs(tables, plan).max())
            rate = (time.perf_counter() - tv) / pieces
            if best is None or cost < best[0]:
                best = (cost, plan)
    if best is None:
        raise InfeasibleError("infeasible: no spread or replicated share leaves room for the rest")
    return best[1]


def replicate_greedy(model: CostModel, tables: Sequence[TableConfig], ndevices: int, max_memory_gb: float,
                     precision: str, deadline: float | None = None) -> Plan:
    """:func:`hybrid_greedy` without row-wise tables: a share of the small tables (at least one eighth,
    fewest rows per lookup first) data-parallel, the rest by :func:`model_greedy`."""
    small = [t for t in tables if t.memory_gb(precision) <= REPLICATE_MAX_GB]
    if not small:
        raise InfeasibleError("infeasible: no small table to replicate")
    return hybrid_greedy(model, tables, ndevices, max_memory_gb, precision, deadline, spread=(0,))


@dataclass
class ShardkitConfig(Config):
    """shardkit's own settings, stated once: ``eval.py``, ``eval_simulator.py`` and ``plan.py`` get
    ``--shardkit-<field>`` flags from these fields (through :func:`shardcore.cli.algorithms.add_plugin_args`;
    ``refine`` only where plans are measured)."""

    time: float = param(5.0, "shardkit's planning time budget per task in seconds (default "
                        "{default}): its starts, their evaluation, the search and the choice, once the task's model "
                        "is fitted (a held-out refit, a fraction of a second); "
                        "the first start that places the task is always made (at 100k tables about 4 s); "
                        "measured refinement's rounds each search this long again", type=positive_float,
                        metavar="S", cli_default=None)
    model: str | None = param(None, "shardkit's cost model file (default: models/shardkit/cpu_cost_model.json for the "
                              "measured oracle, the emulator's own for emulated:h200)", type=str, metavar="JSON")
    starts: tuple = param(("model_greedy", "hybrid_greedy", "replicate_greedy", "size_lookup_greedy", "lookup_greedy",
                           "size_greedy", "dim_greedy"),
                          "comma-separated plans shardkit starts from: model_greedy, hybrid_greedy (the heaviest "
                          "tables row-wise over every device, small tables data-parallel, the rest by the model, "
                          "where those types are allowed), replicate_greedy (small tables data-parallel), the "
                          "greedy baselines, torchrec, neuroshard or other --alg names / checkpoints (default "
                          "model_greedy, hybrid_greedy, replicate_greedy and the four greedy baselines)",
                          type=name_list, metavar="ALGS",
                          cli_default=None)
    types: tuple | None = param(None, "sharding types shardkit's search may create: tw, cw, rw, dp, grid (default "
                                "all five for emulated:h200, grid only where there are hosts; tw,cw,rw for the measured "
                                "oracle, whose data-parallel all-reduce its exchange model is not fitted on)", type=name_list,
                                metavar="TYPES")
    kicks: int | None = param(None, "at most N kicks of the iterated local search that follows the starts' searches "
                              "(default: as many as the budget allows, ending after 40 in a row without a gain); 0: "
                              "the starts' local optima only, a plan that does not depend on the CPU's speed where "
                              "those searches end before the budget", type=nonnegative_int, metavar="N")
    robust: bool = param(True, "minimise the cost model's slowest device (a point estimate) instead of the default, "
                         "which plans for the machine rather than the model: the expected slowest device with each "
                         "device's compute off by a draw of the model's own cross-validated error (where the model "
                         "knows it: the emulated landscapes)", flags=("--point-estimate",), action="store_false")
    refine: int | None = param(None, "up to K plan measurements per task on the oracle (through its cache): the best "
                               "candidate by the cost model, corrected by every measurement so far, is measured and "
                               "the search runs again under the corrected model; the fastest measured plan is kept "
                               "and measured once more, afresh, for the reported cost. Default "
                               f"{MEASURED_REFINE} on the measured oracle (a fitted CPU model is off by 10-20%% per "
                               "device, as much as good plans differ), 0 on an emulated one (whose judge shardkit "
                               "must not query); 0 keeps the cost model's choice. Recorded per task: "
                               "shardkit_measurements, shardkit_measured_ms, shardkit_model_choice_ms",
                               type=nonnegative_int, metavar="K", group="measuring")
    # ^ measuring for a cost model of this machine happens once (then the cache answers)
    calibrate: float = param(300.0, "on the measured oracle without a fitted cost model "
                             "(models/shardkit/cpu_cost_model.json, --shardkit-model) and too few measurements in the "
                             "cache to fit one: seconds shardkit may spend measuring plans and shards of the tables "
                             "outside the evaluated tasks to fit it (through the cache, so once per machine and "
                             "dataset; default {default}; 0: never measure, stop with the command that does)",
                             type=nonnegative_float, metavar="S", cli_default=None, group="measuring")

    def refine_k(self, landscape: str) -> int:
        """Plan measurements per task on ``landscape``: ``refine``, or where it is None
        :data:`MEASURED_REFINE` on the measured oracle and 0 on an emulated one."""
        if self.refine is None:
            return MEASURED_REFINE if landscape == MEASURED else 0
        return int(self.refine)


CONFIG = ShardkitConfig()      # the defaults; the --alg plugin's flags (shardcore.cli.algorithms.add_plugin_args)
KWARG_PREFIX = "shardkit_"     # load_sharder's keyword argument for a field: shardkit_<field> (plugin_kwargs' form)


def config_from_kwargs(kwargs: dict) -> tuple[ShardkitConfig, dict]:
    """:data:`CONFIG` with the ``shardkit_<field>`` keyword arguments of ``kwargs`` that are given (not
    None), and the other keyword arguments."""
    names = {KWARG_PREFIX + f.name: f.name for f in dataclasses.fields(ShardkitConfig)}
    given = {names[k]: v for k, v in kwargs.items() if k in names and v is not None}
    return dataclasses.replace(CONFIG, **given), {k: v for k, v in kwargs.items() if k not in names}


@dataclass
class ShardkitSharder(Sharder):
    model: CostModel | None = None
    model_factory: Any = None                 # () -> CostModel, called on first use
    time_budget_s: float = CONFIG.time
    starts: tuple = CONFIG.starts
    refine_k: int = 0                         # no oracle of its own: load_sharder gives CONFIG.refine_k(landscape)
    types: tuple = ALL_TYPES                  # sharding types the search may create
    start_kwargs: dict = field(default_factory=dict)
    oracle: Any = None
    emulator_fit: str = "heldout"             # on an emulated landscape: plan each task with a held-out fit
    robust: bool = CONFIG.robust              # minimise the expected slowest device under the model's error
    seed: int = 0                             # the kicks' generator (with the task's tables)
    max_kicks: int | None = CONFIG.kicks      # None: until the budget or KICK_PATIENCE kicks without a gain
    last_info: dict = field(default_factory=dict)
    _start_sharders: dict = field(default_factory=dict, repr=False)

    def plan_stats(self) -> dict:
        return dict(self.last_info)

    def attach_oracle(self, oracle) -> None:
        """The oracle whose measurements refine the choice (when ``refine_k > 0``) and calibrate a model
        of a machine that has none. Attached before the oracle's workers start
        (:func:`shardcore.cli.algorithms.attach_oracle`): the cost model is built here where it needs no
        measuring, else what calibration needs is checked, so missing cost data stops the command
        before anything is measured."""
        self.oracle = oracle
        check = getattr(self.model_factory, "check", None)
        if self.model is None and check is not None:
            self.model = check(oracle)

    def resolve_starts(self) -> None:
        """Every start that is another planner or a checkpoint, resolved now (by :func:`load_sharder`):
        a missing checkpoint stops the command before any worker starts. A start whose package is not
        installed (TorchRec) is skipped per task, as before."""
        for name in self.starts:
            if name not in OWN_STARTS and name not in GREEDY_KEYS:
                try:
                    self._start_sharder(name)
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
            self.model = self.model_factory(self.oracle)
        return self.model

    def load(self) -> None:
        """What is loaded once, before any budget runs (as a planner's import would be): the cost model
        and, for an emulated card, its measurements (the held-out refits' data)."""
        model = self.cost_model()
        if model.landscape.startswith("emulated:"):
            from shardcore.oracles.emulated.emulator import measured_landscapes

            measured_landscapes(model.landscape.split(":", 1)[1])

    def task_model(self, tables: Sequence[TableConfig], ndevices: int | None = None) -> CostModel:
        """The model a task is planned with. Planning for the held-out emulated card
        (``emulator_fit="heldout"``): its compute is the emulator refitted without every measured shard
        that holds one of the task's tables and without one fixed fifth of the rest
        (:func:`shardcore.oracles.emulated.emulator.heldout_model` with :data:`HELDOUT_SUBSET`), so shardkit never plans
        with a model that saw the task's tables, nor with the judge itself. Where that leaves too few
        shards to refit (hundreds of measured tables), the shipped fit, said in the model's ``source``.
        Its bias and error on devices holding row-wise blocks or replicas are those measured on other
        tasks' devices of plans with ``ndevices`` devices where enough were measured (the replica law
        prices replica devices of 4-device plans ~2% high and of 8-device plans ~2% low), else of all."""
        model = self.cost_model()
        if not model.landscape.startswith("emulated:"):
            return model
        from shardcore.oracles.emulated.emulator import heldout_model, model_error, piece_bias, piece_spread, seen_tables

        card = model.landscape.split(":", 1)[1]
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

    def _start_sharder(self, name: str):
        if name not in self._start_sharders:
            from shardcore.cli import algorithms

            self._start_sharders[name] = algorithms.resolve(name, **self.start_kwargs)
        return self._start_sharders[name]

    def start_plans(self, tables, ndevices, max_memory_gb, precision, model: CostModel | None = None,
                    deadline: float | None = None) -> list[tuple[str, Plan]]:
        """The starts that place the task, in ``starts`` order; after ``deadline`` (``time.perf_counter``)
        only until the first one is found."""
        model = model or self.cost_model()
        out, why = [], {}
        # a last resort where no start of the list places the task: TorchRec's planner splits a table
        # too large for one device by rows, which the greedy starts cannot
        fallback = () if "torchrec" in self.starts else ("torchrec",)
        last = 0.0   # the previous start took this long; after the first, another is made only if it fits
        for name in tuple(self.starts) + fallback:
            if (name in fallback or (deadline is not None and time.perf_counter() + last > deadline)) and out:
                break
            t0 = time.perf_counter()
            try:
                if name == "model_greedy":
                    plan = model_greedy(model, tables, ndevices, max_memory_gb, precision)
                elif name == "replicate_greedy":
                    if DATA_PARALLEL not in self.types or ndevices < 2:
                        continue
                    plan = replicate_greedy(model, tables, ndevices, max_memory_gb, precision, deadline)
                elif name == "hybrid_greedy":
                    if ROW_WISE not in self.types or ndevices < 2:
                        continue
                    plan = hybrid_greedy(model, tables, ndevices, max_memory_gb, precision, deadline,
                                         replicate=DATA_PARALLEL in self.types)
                elif name in GREEDY_KEYS:
                    plan = greedy_plan(tables, ndevices, max_memory_gb, GREEDY_KEYS[name], precision)
                else:
                    plan = self._start_sharder(name).shard(tables, Topology(ndevices, max_memory_gb, precision))
            except (InfeasibleError, ImportError) as exc:
                why[name] = io.first_line(exc, 120)
                continue
            if plan.is_feasible(tables, max_memory_gb, precision):
                out.append((name, plan))
            else:
                why[name] = "its plan exceeds the memory cap"
            last = time.perf_counter() - t0
        if not out:
            reasons = "; ".join(f"{n}: {w}" for n, w in why.items())
            raise InfeasibleError(f"infeasible: none of shardkit's starts ({', '.join(self.starts)}"
                                  f"{', and torchrec as a last resort' if fallback else ''}) could place the task "
                                  f"({reasons})")
        return out

    def shard(self, tables, topology):
        ndevices, max_memory_gb, precision = topology.ndevices, topology.max_memory_gb, topology.precision
        tables = list(tables)
        self.load()
        model = self.task_model(tables, ndevices)
        # the budget covers everything after the task's model is fitted: the starts, their evaluation,
        # the search and the choice; only the first start that places the task is always made (no
        # answer without one), so at 100k tables a tiny budget costs that one start's O(tables) time
        deadline = time.perf_counter() + self.time_budget_s
        # the starts get at most half of it (at hundreds of tables on a hundred devices the search from
        # a cheap start gains more than another costly start), the search the rest
        starts = self.start_plans(tables, ndevices, max_memory_gb, precision, model,
                                  deadline=deadline - (1.0 - START_SHARE) * self.time_budget_s)
        states = []
        one = 0.0   # the first start's evaluation took this long; another is begun only if it fits
        for name, plan in starts:
            if states and time.perf_counter() + one > deadline:
                break
            t1 = time.perf_counter()
            st = State(model, tables, plan.table_shardings(tables), ndevices, max_memory_gb, precision)
            states.append((st.score, name, st, plan))
            if len(states) == 1:   # kept free: the choice after the search (about one evaluation) and the
                one = time.perf_counter() - t1   # steps that end after the deadline (2% of the budget at least)
                deadline -= max(2 * one, 0.02 * self.time_budget_s)
        states.sort(key=lambda x: x[0])
        pool: list[tuple[tuple, str, Plan]] = [(score, name, plan) for score, name, _, plan in states]
        stats = SearchStats(accepted={})
        searched = []
        for score, name, st, _ in states:
            if searched and time.perf_counter() > deadline:
                break
            local_search(st, deadline, types=self.types, stats=stats)
            searched.append(name)
            pool.append((st.score, f"{name}+search", st.plan()))
        # the budget left: iterated local search from the best local optimum (kick, search again, keep
        # the better), with a generator seeded by the task's tables, so a run repeats where it has time
        searched_states = sorted((st for _, _, st, _ in states[:len(searched)]), key=lambda x: x.score)
        kicks = gains = 0
        if searched_states and ndevices > 1 and time.perf_counter() < deadline and self.max_kicks != 0:
            best_st = searched_states[0]
            best_name = min((x for x in pool if x[1].endswith("+search")), key=lambda x: x[0])[1]
            rng = np.random.default_rng([int(self.seed), zlib.crc32(",".join(str(t.index) for t in tables).encode())])
            since = 0   # kicks since the last gain: after KICK_PATIENCE of them the search ends early
            while (time.perf_counter() < deadline and since < KICK_PATIENCE
                   and (self.max_kicks is None or kicks < self.max_kicks)):
                st = best_st.copy()
                if rng.random() < RECREATE_KICKS:
                    recreate(st, rng, RECREATE_SHARE)
                else:
                    kick(st, rng, int(rng.integers(2, 5)), types=self.types)
                local_search(st, deadline, types=self.types, stats=stats)
                kicks, since = kicks + 1, since + 1
                if st.score < best_st.score:
                    best_st, gains, since = st, gains + 1, 0
            if since >= KICK_PATIENCE:
                stats.stopped = f"no gain in {KICK_PATIENCE} kicks"
            if gains:
                pool.append((best_st.score, f"{best_name}+kicks", best_st.plan()))
        pool.sort(key=lambda x: x[0])
        distinct, seen = [], set()
        for score, name, plan in (pool if self.refine_k > 0 else pool[:1]):   # refinement measures distinct ones
            key = tuple((s.type, s.devices, s.dims) for s in plan.table_shardings(tables))
            if key not in seen:
                seen.add(key)
                distinct.append((score, name, plan))
        best_score, best_name, best = distinct[0]
        point = float(model.device_costs(tables, best).max())
        info = {"shardkit_start": best_name, "shardkit_model_ms": round(point, 4),
                "shardkit_start_ms": round(states[0][0][0], 4), "shardkit_searched": searched,
                "shardkit_moves": dict(stats.accepted), "shardkit_rounds": stats.rounds,
                "shardkit_kicks": kicks, "shardkit_kick_gains": gains,
                "shardkit_stopped": stats.stopped, "shardkit_measurements": 0,
                "shardkit_refine_k": self.refine_k if self.measures_candidates else 0,
                "shardkit_model": model.source}
        if model.error is not None and len(model.error):   # the objective it minimised: the expected slowest
            info["shardkit_expected_ms"] = round(best_score[0], 4)
        if self.refine_k > 0:
            if self.oracle is None:
                raise ShardError("shardkit: refinement (--shardkit-refine) needs an oracle; plan-only runs have none")
            res = refine(model, self.oracle, tables, [(name, plan) for _, name, plan in distinct], ndevices,
                         max_memory_gb, precision, self.refine_k, search_s=self.time_budget_s, types=self.types,
                         stats=stats)
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


def _model_factory(landscape: str, data_dir, batch_size, model_path, comm: dict,
                   cache_path=None, exclude_task_files=None, calibrate_s: float = CONFIG.calibrate):
    def calibrates(oracle) -> bool:
        """Whether ``make(oracle)`` measures (calibration) rather than loads or fits a model."""
        return (not model_path and not landscape.startswith("emulated") and not DEFAULT_CPU_MODEL.is_file()
                and oracle is not None and calibrate_s > 0 and data_dir is not None)

    def make(oracle=None) -> CostModel:
        """``oracle``: the measured oracle attached (eval.py attaches it), which calibration measures on."""
        if model_path:
            return CostModel.load(model_path)
        if landscape.startswith("emulated"):
            return emulated_model(data_dir or os.devnull, batch_size or 4096, CommModel.of(**comm),
                                  card=landscape.split(":", 1)[1])
        if DEFAULT_CPU_MODEL.is_file():
            return CostModel.load(DEFAULT_CPU_MODEL)
        if calibrates(oracle) and getattr(oracle, "context", None):
            from .calibrate import calibrated_model

            return calibrated_model(oracle, data_dir, exclude_task_files, calibrate_s)
        return fit_from_cache(data_dir, batch_size, cache_path, exclude_task_files)

    def check(oracle=None) -> CostModel | None:
        """Before ``oracle``'s workers start: the model itself where it needs no measuring (or the
        one-line error saying what is missing); None where it calibrates through the oracle's cache."""
        if calibrates(oracle) and measurement_store(oracle) is not None:
            from .calibrate import check_calibration

            check_calibration(oracle, data_dir, exclude_task_files)   # enough tables outside the tasks
            return None
        return make(oracle)

    make.check = check
    return make


def load_sharder(path=None, *, oracle: str | None = None, data_dir=None, batch_size=None, comm_bandwidth=None,
                 comm_latency=None, devices_per_host=None, inter_host_bandwidth=None, inter_host_latency=None,
                 cache_path=None, exclude_task_files=None, emulator_fit: str | None = None,
                 seed: int = 0, **kwargs) -> ShardkitSharder:
    """``--alg shardkit``. ``shardkit_<field>``: a :class:`ShardkitConfig` field (the ``--shardkit-<field>``
    flags, :func:`shardcore.cli.algorithms.plugin_kwargs`); one not given or None keeps :data:`CONFIG`'s.
    ``oracle``: the landscape planned for (``measured``: the fitted model of this machine,
    ``models/shardkit/cpu_cost_model.json`` unless ``shardkit_model`` names one, else fitted on the spot
    from ``cache_path``'s measurements without the tables of ``exclude_task_files``; ``emulated:h200``:
    the emulator). ``shardkit_types``: the sharding types the search may create (default: all four on the
    emulated landscape; table- and column-wise on the measured one, whose fitted exchange model has not
    been calibrated on row-wise / data-parallel collectives). Other keyword arguments go to the start
    algorithms."""
    if path is not None:
        raise ShardError("--alg shardkit takes no checkpoint (its cost model: --shardkit-model FILE.json)")
    landscape = (oracle or MEASURED).lower()
    if landscape not in (MEASURED, EMULATED):
        raise ShardError(f"shardkit: unknown landscape {oracle!r} (measured or {EMULATED})")
    cfg, kwargs = config_from_kwargs(kwargs)
    budget = float(cfg.time)
    if not budget > 0:
        raise ShardError(f"--shardkit-time must be positive seconds, got {cfg.time}")
    refine_k = cfg.refine_k(landscape)
    if refine_k < 0:
        raise ShardError(f"--shardkit-refine must be 0 or more, got {cfg.refine}")
    starts = tuple(cfg.starts) or CONFIG.starts   # none named: the default starts
    if "shardkit" in starts:
        raise ShardError("--shardkit-starts cannot name shardkit itself")
    if cfg.types:
        abbrev = {"tw": "table_wise", "cw": "column_wise", "rw": "row_wise", "dp": "data_parallel", "grid": "grid"}
        types = tuple(abbrev.get(str(t).lower(), str(t).lower()) for t in cfg.types)
        bad = [t for t in types if t not in ALL_TYPES]
        if bad:
            raise ShardError(f"--shardkit-types: unknown type {bad[0]!r} (tw, cw, rw, dp, grid or their full names)")
    else:
        types = ALL_TYPES if landscape.startswith("emulated") else MEASURED_TYPES
    start_kwargs = {k: v for k, v in kwargs.items() if v is not None}
    # a start that is another planner plans for the same landscape as eval.py would have it (TorchRec:
    # configured for the judged hardware, not for its defaults)
    comm = {k: v for k, v in (("comm_bandwidth", comm_bandwidth), ("comm_latency", comm_latency),
                              ("devices_per_host", devices_per_host), ("inter_host_bandwidth", inter_host_bandwidth),
                              ("inter_host_latency", inter_host_latency)) if v is not None}
    start_kwargs.update(seed=seed, batch_size=batch_size, oracle=oracle, data_dir=data_dir, emulator_fit=emulator_fit,
                        **comm)
    factory = _model_factory(landscape, data_dir, batch_size, cfg.model, comm,
                             cache_path, exclude_task_files, float(cfg.calibrate))
    fit = emulator_fit or "heldout"
    if fit not in ("heldout", "devices", "full"):
        raise ShardError(f"shardkit: emulator fit must be heldout, devices or full, got {emulator_fit!r}")
    # judged by devices (the judge has seen the task's tables among others), shardkit still plans with a model
    # that never saw them: the harder comparison for it, where the learned methods' training oracle saw them
    fit = "heldout" if fit == "devices" else fit
    sharder = ShardkitSharder(name="shardkit", model_factory=factory, time_budget_s=budget, starts=starts,
                              refine_k=refine_k, types=types, start_kwargs=start_kwargs, emulator_fit=fit,
                              robust=bool(cfg.robust), seed=int(seed),
                              max_kicks=None if cfg.kicks is None else int(cfg.kicks))
    sharder.resolve_starts()
    return sharder


def load_sharder_tw(path=None, **kwargs) -> ShardkitSharder:
    """``--alg shardkit-tw``: shardkit's search restricted to table-wise placement, the reference a
    table-wise method (DreamShard, AutoShard, NeuroShard's placement) is measured against (its
    "table-wise optimum found by search"). Takes every ``--shardkit-*`` flag except the types."""
    kwargs[KWARG_PREFIX + "types"] = ("tw",)
    sharder = load_sharder(path, **kwargs)
    sharder.name = "shardkit-tw"
    return sharder
