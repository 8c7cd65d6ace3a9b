"""The data model of a sharding run and one interface per stage.

A run goes: tables (:mod:`shardcore.tables`) -> a :class:`Sharder` places them on a
:class:`Topology` -> a :class:`~shardcore.plan.Plan` -> a :class:`CostOracle` answers what the plan
costs with one :class:`PlanResult` -> records and reports (:mod:`shardcore.evaluation.compare`,
:mod:`shardcore.evaluation.report`).

**Oracles.** Every source of plan costs implements :class:`CostOracle` and answers with the same
:class:`PlanResult`: per device the four cost parts of :data:`COST_PARTS` in ms, the plan cost (the
slowest device), whether it came from the measurement cache, how each part was obtained (measured or
modelled) and the hardware the figures stand for. The implementations:

- :class:`~shardcore.oracles.measured.driver.PlanEvaluator`: measured on this machine (FBGEMM on the CPU with gloo
  all-to-alls, or on CUDA GPUs with NCCL);
- :class:`~shardcore.oracles.emulated.oracle.EmulatedOracle`: an emulated GPU (compute model fitted on real
  measurements, analytic all-to-all);
- a method's simulator where it judges whole plans (a method package implements the protocol).

The consumers (:func:`shardcore.evaluation.compare.evaluate`, the trainers, the scripts) take any of them.

**Caching** is a layer, not a part of an oracle: :class:`~shardcore.oracles.cache.CachedOracle` wraps any
:class:`ShardCostOracle` (an oracle whose plan cost is made of per-shard compute and the plan's
exchange), looks plans and shards up in a :class:`~shardcore.oracles.cache.CostCache`, asks the wrapped
oracle only for what is missing and stores what it measured. :func:`shardcore.oracles.factory.open_oracle`
is the one place oracles are built (and wrapped).

This module imports nothing heavy (no torch), so every package may depend on it. (The protocols
are runtime-checkable; on Python 3.11 ``isinstance`` reads every member, so checking a CUDA
evaluator's ``context`` starts its workers: check interfaces in tests, not in hot paths.)
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, NamedTuple, Protocol, Sequence, runtime_checkable

from shardcore.costs import COST_PARTS  # noqa: F401  (re-exported: the order of every per-device cost list)
from shardcore.planning import PlanningContext  # noqa: F401  (re-exported: what every planner is built with)
from shardcore.tables import TableConfig
from shardcore.topology import Topology  # noqa: F401  (re-exported: where a plan runs)

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from shardcore.plan import Plan


#: per device the pieces it holds (:attr:`shardcore.plan.Plan.device_pieces`): what an oracle prices
DevicePieces = Sequence[Sequence[TableConfig]]


@dataclass
class Sharder(abc.ABC):
    """A placement algorithm: ``sharder.shard(tables, topology) -> Plan``, on a :class:`Topology`.

    The core's baselines (:mod:`shardcore.baselines`) and every method package subclass it."""

    name: str

    #: True for a sharder that chose its plan by measuring candidates on the oracle that judges it.
    #: The kept plan's measurement is then the smallest of several noisy ones (biased low), so
    #: :func:`shardcore.evaluation.compare.evaluate` measures its plan again, bypassing the cache.
    measures_candidates = False

    @abc.abstractmethod
    def shard(self, tables: Sequence[TableConfig], topology: Topology) -> "Plan":
        """Place ``tables`` on ``topology.ndevices`` devices of ``topology.max_memory_gb`` each (weights
        at ``topology.precision``); raise :class:`InfeasibleError` if impossible."""

    def plan_stats(self) -> dict:
        """What the last :meth:`shard` call records beside its plan (a planner's search statistics,
        TorchRec's sharding types...): the one hook :func:`shardcore.evaluation.compare.plan_task`
        reads into the result. None by default."""
        return {}

    def attach_oracle(self, oracle) -> None:
        """Given the oracle that will judge its plans, before its workers start: a planner that measures
        on it (shardkit) checks here what it needs and raises a one-line ShardError. Nothing by default."""


class DeviceCost(NamedTuple):
    """One device's cost in ms, by name (as TorchRec's ``Perf``), in the order of :data:`COST_PARTS`:
    forward compute, forward exchange, backward exchange, backward compute (with the optimizer
    update). :attr:`PlanResult.devices` gives a plan's; ``list(cost)`` is its row of
    :attr:`PlanResult.device_costs_ms`."""

    fw_comp: float
    fw_comm: float
    bw_comm: float
    bw_comp: float

    @property
    def compute_ms(self) -> float:
        return self.fw_comp + self.bw_comp

    @property
    def comm_ms(self) -> float:
        return self.fw_comm + self.bw_comm

    @property
    def total_ms(self) -> float:
        return self.compute_ms + self.comm_ms


@dataclass(frozen=True)
class ComputeCost:
    """A shard's compute cost in milliseconds (medians)."""

    fw_ms: float
    bw_ms: float

    @property
    def total_ms(self) -> float:
        return self.fw_ms + self.bw_ms


OUTPUT_ELEMENT_SIZE = 4    # pooled outputs and their gradients are fp32


@dataclass(frozen=True)
class CommSplits:
    """Split sizes (in elements) of one device's two all-to-alls (see the module notes)."""

    device: int
    fw_send: tuple[int, ...]   # to each device j: B_j * D_self
    fw_recv: tuple[int, ...]   # from each device d: B_self * D_d
    bw_send: tuple[int, ...]   # the reverse of fw_recv
    bw_recv: tuple[int, ...]   # the reverse of fw_send
    element_size: int = OUTPUT_ELEMENT_SIZE

    def bytes_sent(self, phase: str = "fw", remote_only: bool = True) -> int:
        splits = self.fw_send if phase == "fw" else self.bw_send
        return self.element_size * sum(s for j, s in enumerate(splits) if not (remote_only and j == self.device))

    def bytes_received(self, phase: str = "fw", remote_only: bool = True) -> int:
        splits = self.fw_recv if phase == "fw" else self.bw_recv
        return self.element_size * sum(s for j, s in enumerate(splits) if not (remote_only and j == self.device))


@dataclass
class CommLayout:
    """What a plan's exchange moves, per device: the one argument of ``measure_comm``. ``dim_sums``
    alone is the pooled all-to-all. A measured oracle adds the exact input ids (``ids_send[j][s]``:
    int64 ids and lengths ``j`` sends ``s``), the data-parallel gradients (``allreduce``: elements per
    device) and the row-wise partials to sum (``rw_sums``: per row-wise table its partials as (source
    device, column offset, dim)); a model prices ``id_widths`` (expected ids per sample per device)
    and ``allreduce_bytes`` (each device's ring all-reduce bytes) instead."""

    dim_sums: list[int]
    ids_send: list[list[int]] = field(default_factory=list)
    allreduce: list[int] = field(default_factory=list)
    rw_sums: list[list[tuple[int, int, int]]] = field(default_factory=list)
    id_widths: list[float] | None = None
    allreduce_bytes: list[float] | None = None

    @property
    def special(self) -> bool:
        """Whether the measured exchange has more than the pooled all-to-all."""
        return any(any(r) for r in self.ids_send) or any(self.allreduce) or bool(self.rw_sums)


@dataclass(frozen=True)
class CacheContext:
    """Everything besides the shard that a measurement depends on."""

    hardware: str
    dataset: str
    batch_size: int
    optimizer: str
    precision: str

    def as_list(self) -> list:
        """The fields in the cache key's order."""
        return [self.hardware, self.dataset, int(self.batch_size), self.optimizer, self.precision]


@dataclass(frozen=True)
class OracleInfo:
    """What an oracle says of itself besides costs: the kind of device it runs or emulates
    (``cpu``, ``cuda``, ``emulated:h200``), how long it took to start (its workers; 0 for one that
    starts nothing; None before it started) and its measurement noise so far (the median relative
    spread of a shard's timed samples, in percent; None for a modelled oracle or before any shard)."""

    device_type: str
    startup_s: float | None = None
    noise_pct: float | None = None


@dataclass
class PlanResult:
    """What an oracle answers for one plan (the one result type of every :class:`CostOracle`)."""

    device_costs_ms: list[DeviceCost]        # per device its cost, the four COST_PARTS in ms
    from_cache: bool = False                 # the whole plan came from the measurement cache
    compute_from_cache: list[bool] = field(default_factory=list)   # per device: its compute did
    comm: list[CommSplits] | None = None   # per device all-to-all split sizes; None when from the cache
    wall_s: float = 0.0                      # wall time of this evaluate() call
    parts: dict = field(default_factory=dict)  # {"compute": how obtained, "comm": how obtained}
    hardware: str = ""                       # what the figures stand for, in words

    def __post_init__(self) -> None:
        check_costs(self.device_costs_ms, self.hardware or "the cost oracle")
        self.device_costs_ms = device_costs(self.device_costs_ms)

    @property
    def devices(self) -> list[DeviceCost]:
        """Per device its named cost (:attr:`device_costs_ms`)."""
        return self.device_costs_ms

    @property
    def device_totals_ms(self) -> list[float]:
        return [float(sum(c)) for c in self.device_costs_ms]

    @property
    def cost_ms(self) -> float:
        """Max over devices of the sum of the four costs."""
        return max(self.device_totals_ms, default=0.0)

    @property
    def ndevices(self) -> int:
        return len(self.device_costs_ms)


def device_costs(rows) -> list[DeviceCost]:
    """Per device a :class:`DeviceCost` from rows of four costs (lists, tuples, a ``[devices, 4]`` array)
    in :data:`COST_PARTS` order: the boundary where a cost model's numbers become the one cost type."""
    return [r if isinstance(r, DeviceCost) else DeviceCost(*(float(x) for x in r)) for r in rows]


def check_costs(device_costs_ms, source: str) -> None:
    """Every cost an oracle answers is a finite number >= 0, four per device: anything else (a NaN
    from a broken cost model, an infinite exchange) is refused here, in one line naming ``source``,
    so the statistics never see it."""
    import math

    from shardcore.errors import ShardError

    for d, dev in enumerate(device_costs_ms):
        if len(dev) != 4:
            raise ShardError(f"{source}: answered {len(dev)} costs for device {d}, expected 4")
        for x in dev:
            try:
                ok = math.isfinite(float(x)) and float(x) >= 0
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise ShardError(f"{source}: answered the cost {x!r} ms for device {d}; costs must be finite "
                                 "numbers >= 0 (a broken cost model, or a bandwidth too small for the data?)")


@runtime_checkable
class CostOracle(Protocol):
    """Anything that says what a plan costs.

    ``evaluate(devices)`` takes the pieces of each device (:attr:`shardcore.plan.Plan.device_pieces`) and
    answers a :class:`PlanResult`.
    ``no_cache=True`` asks for fresh figures (a cache layer then measures again; an oracle without
    a cache ignores it). ``hardware`` and ``parts`` say what the figures stand for. Oracles are
    context managers (a measured one starts its workers on entry and stops them on exit)."""

    @property
    def hardware(self) -> str: ...

    @property
    def parts(self) -> dict: ...

    def evaluate(self, devices: DevicePieces, no_cache: bool | None = None) -> PlanResult: ...

    def __enter__(self): ...

    def __exit__(self, *exc) -> None: ...


@runtime_checkable
class ShardCostOracle(CostOracle, Protocol):
    """A :class:`CostOracle` whose plan cost is made of each device's compute (a property of the device's
    pieces alone) and the plan's all-to-all exchange: what a cache layer can wrap.

    - ``info``: the device kind, start-up time and measurement noise (:class:`OracleInfo`);
    - ``context``: the setting the costs depend on (hardware fingerprint, dataset, batch size,
      optimizer, precision): the cache key besides the devices' pieces;
    - ``comm_measured``: whether the exchange is measured; plans with a modelled exchange are
      not stored as plans (their devices' compute is);
    - ``check_devices(devices)``: the plan validated (one list of pieces per device, known tables) or a
      one-line :class:`~shardcore.errors.ShardError`;
    - ``evaluate(devices, compute=...)``: ``compute[d]`` is device ``d``'s compute cost known
      already (a cache hit), so only the others are measured; their ``compute_from_cache`` is set;
    - ``measure_devices(devices)``: the compute cost of each device's pieces (none: nothing);
    - ``measure_comm(layout, delays_ms)``: per device ``(fw_ms, bw_ms)`` of the exchange a
      :class:`CommLayout` describes and its split sizes (``delays_ms[d]``: device ``d`` starts late).
    """

    ndevices: int
    batch_size: int
    bench_iters: int
    warmup_iters: int

    @property
    def context(self) -> CacheContext: ...

    @property
    def info(self) -> OracleInfo: ...

    @property
    def comm_measured(self) -> bool: ...

    def check_devices(self, devices: DevicePieces) -> list[list[TableConfig]]: ...

    def evaluate(self, devices: DevicePieces, no_cache: bool | None = None, *,
                 compute: Mapping[int, ComputeCost] | None = None) -> PlanResult: ...

    def measure_devices(self, devices: DevicePieces, no_cache: bool | None = None) -> list[ComputeCost]: ...

    def measure_comm(self, layout: CommLayout, delays_ms: Sequence[float] | None = None
                     ) -> tuple[list[tuple[float, float]], list[CommSplits]]: ...
