"""Plan every task with every algorithm, optionally have a cost oracle judge the plans, and
collect the records (the driver of ``eval.py``, ``eval_simulator.py`` and the experiment runner).

One :class:`TaskResult` per (task, algorithm); its JSON form is one line of ``eval.py --out``.
The costs come from any :class:`~shardcore.types.CostOracle` (measured, emulated, simulated); the
oracle itself (measuring workers, cache layer) lives in :mod:`shardcore.oracles.measured.driver`,
:mod:`shardcore.oracles.factory` and :mod:`shardcore.oracles.cache`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Sequence

from shardcore.errors import InfeasibleError, ShardError
from shardcore.plan import Plan
from shardcore.tables import TableConfig
from shardcore.tasks import Task
from shardcore.types import CostOracle, DeviceCost, PlanResult, Sharder, Topology


@dataclass
class TaskResult:
    task: int
    alg: str
    num_tables: int
    ndevices: int
    max_memory_gb: float
    feasible: bool
    allocation: list[int] | None
    memory_gb: list[float] | None
    planning_seconds: float
    error: str | None = None
    splits: list[int] | None = None   # column shards per task table when the plan splits tables
    cost_ms: float | None = None
    device_costs_ms: list[DeviceCost] | None = None   # per device its cost (read back: lists of four)
    extra: dict = field(default_factory=dict)
    # per task table {"type", "devices", "dims"/"rows"} (shardcore.plan.Plan.shardings_json); for a plan
    # with row-wise, data-parallel or uneven column-wise tables, ``allocation`` lists the device of
    # every piece (see shardcore.plan) and ``splits`` is absent: the shardings are the plan
    shardings: list[dict] | None = None
    general: bool = field(default=False, repr=False)
    _plan: Plan | None = field(default=None, repr=False, compare=False)
    # the oracle's whole answer (from the cache or not, parts, hardware); not part of the JSON record
    measured: PlanResult | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict:
        out = asdict(replace(self, measured=None, _plan=None))
        for private in ("measured", "_plan", "general"):
            out.pop(private)
        extra = out.pop("extra")
        out.update(extra)
        if self.splits is None:
            out.pop("splits")
        if self.shardings is None:
            out.pop("shardings")
        if self.cost_ms is None:
            out.pop("cost_ms")
            out.pop("device_costs_ms")
        return out

    def plan(self, tables: Sequence[TableConfig] | None = None, precision: str | None = None) -> Plan | None:
        """The plan (``tables``, the task's, are needed only to rebuild it when this result was read back
        from JSON; ``precision``: its weights', default the record's pricing's, else fp16)."""
        if not self.feasible:
            return None
        if self._plan is not None:
            return self._plan
        if tables is None:
            raise ShardError("a plan read back from its record needs the task's tables")
        return record_plan(self.to_json(), tables, precision)

    @property
    def imbalance(self) -> float | None:
        """max / mean of the devices' total measured costs."""
        if not self.device_costs_ms:
            return None
        totals = [sum(c) for c in self.device_costs_ms]
        mean = sum(totals) / len(totals)
        return max(totals) / mean if mean > 0 else 1.0


def record_plan(rec: dict, tables: Sequence[TableConfig], precision: str | None = None) -> Plan:
    """The plan of an ``eval.py --out`` record (``tables``: its task's; ``precision``: its weights', default
    the record's pricing's, else fp16): its shardings where it has row-wise, grid, data-parallel or uneven
    column-wise tables (no ``splits``), else allocation and splits (the compact form of older records)."""
    topology = Topology(int(rec["ndevices"]), float(rec.get("max_memory_gb") or float("inf")),
                        precision or (rec.get("pricing") or {}).get("precision") or "fp16")
    if rec.get("shardings") and rec.get("splits") is None and any(
            s["type"] in ("row_wise", "data_parallel", "column_wise", "grid") for s in rec["shardings"]):
        return Plan.from_json(tables, rec["shardings"], topology)
    return Plan.from_allocation(tables, rec["allocation"], topology, rec.get("splits") or None)


def lookup_load(plan: Plan) -> list[float]:
    """Per-device sum of dim x pooling_factor: a hardware-free proxy for the lookup work."""
    load = [0.0] * plan.ndevices
    for d, t in plan.pieces:
        load[d] += t.dim * t.pooling_factor
    return load


def plan_task(task_id: int, alg: str, sharder: Sharder, tables: Sequence[TableConfig], topology: Topology
              ) -> tuple[TaskResult, Plan | None]:
    """Plan one task with one sharder (timed); the plan is None when infeasible."""
    start = time.perf_counter()
    try:
        topology.check_fits(tables)   # no planner searches its whole budget for what no plan can hold
        plan = sharder.shard(tables, topology)
        error = None
    except InfeasibleError as exc:
        plan, error = None, str(exc)
    seconds = time.perf_counter() - start
    if plan is not None and plan.topology != topology:
        raise ShardError(f"{alg} planned for {plan.topology}, not for the {topology} it was asked for")
    if plan is not None and not plan.feasible:
        # A sharder must never overfill a device; report it rather than measure it.
        error = f"infeasible: {alg} put more than {topology.max_memory_gb:g} GiB on a device"
        feasible = False
    else:
        feasible = plan is not None
    result = TaskResult(
        task=task_id, alg=alg, num_tables=len(tables), ndevices=topology.ndevices,
        max_memory_gb=topology.max_memory_gb, feasible=feasible,
        allocation=list(plan.allocation) if plan is not None else None,
        memory_gb=[round(m, 6) for m in plan.device_memory_gb()] if plan is not None else None,
        planning_seconds=seconds, error=error,
        splits=list(plan.splits) if plan is not None and plan.splits is not None else None)
    if plan is not None and isinstance(sharder, Sharder):
        result.extra.update(sharder.plan_stats())   # e.g. TorchRec's own sharding type per table
    if plan is not None:
        result.shardings = plan.shardings_json()
        result.general = plan.general
        result._plan = plan
        result.extra["lookup_load"] = [round(x, 3) for x in lookup_load(plan)]
    result.extra["table_ids"] = [int(t.index) for t in tables]   # the task, so a record is judged on its own
    return result, (plan if feasible else None)


def median_result(answers: Sequence[PlanResult]) -> PlanResult:
    """Several measurements of one plan as one: per device and cost part the median (a plan's cost
    is then the slowest device's sum of medians)."""
    if len(answers) == 1:
        return answers[0]
    import numpy as np

    parts = np.median(np.array([a.device_costs_ms for a in answers], dtype=float), axis=0)
    first, n = answers[0], len(answers[0].device_costs_ms)
    cached = [all(d < len(a.compute_from_cache) and a.compute_from_cache[d] for a in answers) for d in range(n)]
    return PlanResult([[float(x) for x in dev] for dev in parts], from_cache=all(a.from_cache for a in answers),
                      compute_from_cache=cached, wall_s=float(sum(a.wall_s for a in answers)),
                      parts=dict(first.parts), hardware=first.hardware)


def evaluate(tasks: Sequence[Task], dataset_tables: Sequence[TableConfig], sharders: dict[str, Sharder],
             topology: Topology, oracle: CostOracle | None = None,
             on_result: Callable[[TaskResult, Task], None] | None = None,
             progress: Any = None, repeats: int = 1) -> list[TaskResult]:
    """Every algorithm on every task, task by task (so algorithms are measured side by side).

    Each feasible plan is judged by ``oracle`` (none: plans only); its answer fills ``cost_ms`` and
    ``device_costs_ms`` and is kept whole in ``measured``. A sharder that ``measures_candidates`` has
    its plan measured afresh (the cache neither asked nor trusted for it). ``repeats > 1`` (noisy
    hardware): a task's plans are all made first, then measured in ``repeats`` rounds, every plan once
    per round in algorithm order, every measurement afresh; each record keeps the per device and part
    medians (:func:`median_result`) and every round's plan cost (``repeat_costs_ms``).
    ``on_result(result, task)`` sees every record once it is complete; ``progress`` is an optional
    tqdm-like bar, advanced once per (task, algorithm)."""
    if int(repeats) < 1:
        raise ShardError(f"repeats must be at least 1, got {repeats}")
    repeats = int(repeats)
    results = []
    bar = progress

    def measure(sharder, plan, fresh):
        pieces = plan.device_pieces
        fresh = fresh or bool(sharder.measures_candidates)
        return oracle.evaluate(pieces, no_cache=True) if fresh else oracle.evaluate(pieces)

    def record(result, answer, task):
        result.measured = answer
        result.cost_ms, result.device_costs_ms = answer.cost_ms, answer.device_costs_ms

    def done(result, task):
        results.append(result)
        if on_result is not None:
            on_result(result, task)
        if bar is not None:
            bar.update(1)

    for k, task in enumerate(tasks):
        tables = task.tables(dataset_tables)
        if oracle is None or repeats == 1:
            for alg, sharder in sharders.items():
                result, plan = plan_task(k, alg, sharder, tables, topology)
                if oracle is not None and plan is not None:
                    record(result, measure(sharder, plan, False), task)
                done(result, task)
            continue
        planned = [(sharder, *plan_task(k, alg, sharder, tables, topology)) for alg, sharder in sharders.items()]
        answers: list[list[PlanResult]] = [[] for _ in planned]
        for _ in range(repeats):
            for i, (sharder, result, plan) in enumerate(planned):
                if plan is not None:
                    answers[i].append(measure(sharder, plan, True))
        for (sharder, result, plan), got in zip(planned, answers):
            if got:
                record(result, median_result(got), task)
                result.extra["repeat_costs_ms"] = [round(a.cost_ms, 4) for a in got]
            done(result, task)
    return results


def check_record(obj, where: str) -> dict:
    """One ``eval.py --out`` record, validated where it enters a tool: an object with a string ``alg``,
    a whole ``task`` >= 0, a ``cost_ms`` that is null or a finite number >= 0 and, where given,
    ``device_costs_ms`` as lists of four finite costs >= 0. Anything else is one line naming ``where``
    (``file:line``)."""
    import math

    from shardcore.errors import ShardError
    from shardcore.oracles.setting import refuse_predictions

    def finite(v) -> bool:   # at most 1e12 ms: beyond, the statistics' sums overflow (and no plan takes years)
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= 1e12

    if not isinstance(obj, dict):
        raise ShardError(f"{where}: expected a JSON object (an eval.py --out record), got {type(obj).__name__}")
    for key in ("alg", "task"):
        if key not in obj:
            raise ShardError(f"{where}: not an eval.py --out record (no {key!r})")
    refuse_predictions(obj, where, "an oracle's costs (eval.py --out)")   # e.g. eval_simulator.py's records
    if not isinstance(obj["alg"], str) or not obj["alg"]:
        raise ShardError(f"{where}: 'alg' must be a name, got {obj['alg']!r}")
    task = obj["task"]
    if isinstance(task, bool) or not isinstance(task, int) or task < 0:
        raise ShardError(f"{where}: 'task' must be a whole number >= 0, got {task!r}")
    if obj.get("cost_ms") is not None and not finite(obj["cost_ms"]):
        raise ShardError(f"{where}: 'cost_ms' must be a finite number in [0, 1e12] or null, got {obj['cost_ms']!r}")
    dev = obj.get("device_costs_ms")
    if dev is not None and not (isinstance(dev, list) and all(isinstance(d, list) and len(d) == 4
                                                              and all(finite(x) for x in d) for d in dev)):
        raise ShardError(f"{where}: 'device_costs_ms' must list four finite costs in [0, 1e12] per device")
    if obj.get("cost_ms") is not None and dev is None:
        raise ShardError(f"{where}: a cost without 'device_costs_ms'")
    return obj


def record_pricing(rec: dict) -> dict:
    """How an ``eval.py --out`` record was priced (:func:`shardcore.oracles.factory.pricing`): its ``pricing``
    where it carries one, else what its ``hardware``, ``batch_size`` and ``parts`` say (older records),
    the exchange in :func:`~shardcore.oracles.factory.exchange_setting`'s words."""
    import re

    out = dict(rec.get("pricing") or {})
    out.update({k: rec[f] for k, f in (("oracle", "hardware"), ("batch_size", "batch_size")) if rec.get(f) is not None})
    hardware, comm = str(rec.get("hardware") or ""), str((rec.get("parts") or {}).get("comm") or "")
    if "emulator_fit" not in out and hardware.startswith("emulated"):
        out["emulator_fit"] = ("devices" if "held out by devices" in hardware else
                               "heldout" if "held out" in hardware else "full")
    if "exchange" not in out and comm:
        head = comm.split(";")[0]
        found = re.search(r"analytic: ([\d.]+) us \+ bytes / ([\d.]+) GB/s", head)
        hosts = re.search(r"between hosts of (\d+) devices ([\d.]+) us \+ bytes / ([\d.]+) GB/s", comm)
        out["exchange"] = (
            "none (one device)" if comm.startswith("none") else "measured" if comm.startswith("measured") else
            "fitted to measured all-to-alls" if "fitted" in head or not found else
            f"analytic: {float(found[1]):g} us + bytes / {float(found[2]):g} GB/s" + (
                f", hosts of {hosts[1]}: {float(hosts[2]):g} us + bytes / {float(hosts[3]):g} GB/s between them"
                if hosts else ""))
    return out


def expected_slowest(compute, comm, ratios, draws: int = 1000, seed: int = 0, pools=(), pool_of=None):
    """The expected slowest device when each device's compute is off by an independent factor drawn
    from ``ratios`` (e.g. a cost model's held-out measured / predicted ratios): the mean over
    ``draws`` draws of ``max_d(compute[..., d] x r_d + comm[..., d])``. ``compute`` and ``comm`` are
    arrays with devices on the last axis (leading axes: several plans, each given the same draws, so
    plans of one task are compared under common random numbers). ``pools``: further ratio lists, for
    other kinds of device; ``pool_of`` (the shape of ``compute``): ``k`` > 0 draws that device's factor
    from ``pools[k - 1]`` (each pool its own common draws), 0 from ``ratios``."""
    import numpy as np

    comp, com = np.asarray(compute, dtype=float), np.asarray(comm, dtype=float)
    which = np.zeros(comp.shape, int) if pool_of is None else np.asarray(pool_of)
    R = None
    for k, pool in enumerate([ratios, *pools]):
        r = np.asarray(pool, dtype=float)
        if k and not (which == k).any():
            continue
        if r.ndim != 1 or len(r) == 0 or not np.all(np.isfinite(r)) or np.any(r <= 0):
            raise ValueError(f"{'ratios' if not k else f'pool {k}'} must be a non-empty list of positive finite numbers")
        Rk = r[np.random.default_rng(seed if not k else [seed, k]).integers(0, len(r), size=(int(draws), comp.shape[-1]))]
        R = Rk if R is None else np.where(which[..., None, :] == k, Rk, R)   # [..., draws, devices]
    total = comp[..., None, :] * R + com[..., None, :]
    return total.max(axis=-1).mean(axis=-1)
