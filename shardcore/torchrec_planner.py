"""TorchRec's planner as an ``--alg`` (it needs TorchRec installed).

**``--alg torchrec``** (:func:`load_sharder` -> :class:`TorchRecSharder`). For each task it builds a
TorchRec ``EmbeddingBagCollection`` on the ``meta`` device (no memory allocated) with one
``EmbeddingBagConfig`` per table (rows, dim, ``data_type`` = the weights precision, fp16 by default),
lets every table take any sharding type our oracle measures -- table-wise, column-wise,
table-column-wise, row-wise, data-parallel, and table-row-wise when the topology has several hosts
(``ParameterConstraints(sharding_types=[...], compute_kernels=["fused", "dense"], pooling_factors=[pf])``:
``fused`` for the model-parallel types, ``dense`` for data-parallel, TorchRec's only kernel for it) --
describes N devices whose HBM is our per-device memory cap (``compute_device="cuda"``: the device the
planner models; planning itself runs offline on a CPU), and runs ``EmbeddingShardingPlanner``. Its
plan is converted exactly (:func:`_plan_from_torchrec`): every table's sharding type, shard sizes and
ranks become our :class:`~shardcore.plan.Sharding` (TorchRec's table-column-wise is our column-wise
with its blocks' ranks, its table-row-wise our row-wise over its ranks), and the TorchRec type of
every table is kept in the sharder's ``last_info`` (``eval.py --out``: ``torchrec_types``).
**``--alg torchrec-tw``** is the same planner restricted to table-wise sharding.

How TorchRec's memory accounting differs from ours (our cap counts only the weights,
row x dim x bytes per device):

* **I/O buffers**: for every table TorchRec also counts the input indices (as int64) and the pooled
  outputs (in the weights' precision) of a batch: for a table-wise table on a world of N ranks with
  local batch b, ``b x N x pooling_factor x 8 + b x N x dim x bytes`` (the output term only when
  pooling_factor > 0): about 1.2 MB per table at 4 devices, batch 4096, dim 64, pooling factor 20,
  fp16. With ``memory_model="torchrec"`` (the default) this is counted, so TorchRec plans slightly
  more conservatively than the greedy baselines and may call a tight task infeasible that they can
  place (e.g. a table whose weights alone fill a device). ``memory_model="weights"`` makes the planner count the
  weights only (its inference storage model), which is exactly our cap's accounting.
* **Optimizer state**: none. TorchRec counts optimizer state only for a fused optimizer attached to
  the tables (e.g. 2x the weights for Adam, 1/dim for row-wise Adagrad); we attach none, because
  our cap, like the original code's, counts the weights alone.
* **Kernel / dense reserve**: TorchRec's default ``HeuristicalStorageReservation`` keeps 15% of
  every device (plus an estimate of the dense model) off limits. Our cap is the memory *for
  embedding weights*, so we pass ``FixedPercentageStorageReservation(0.0)`` (``reserve`` changes it).
* **Caching kernels**: only the ``fused`` kernel (all weights in HBM) is allowed. TorchRec could
  otherwise move tables to UVM / host memory (``fused_uvm_caching``), which our memory model has no
  notion of.

Every plan is checked against OUR cap before it is returned; an over-cap plan, or no plan at all
from TorchRec, raises :class:`~shardcore.errors.InfeasibleError`.

The batch size: kwargs ``batch_size`` is the benchmark's batch (default 4096), the batch each table's
device processes. TorchRec's ``batch_size`` is per rank, and a table-wise table processes the local
batches of all ranks, so the planner gets ``batch_size / ndevices`` per rank.

Plans in TorchRec's form, written and read back, are :mod:`shardcore.plan_export`'s.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from .baselines import Sharder
from .errors import InfeasibleError, ShardError
from .plan import Plan, Sharding, column_wise, data_parallel, row_blocks, row_wise, table_wise
from .tables import GB, TableConfig

DEFAULT_BATCH_SIZE = 4096
MEMORY_MODELS = ("torchrec", "weights")
# TorchRec's sharding types that the oracle measures; table_row_wise only where there are several hosts
ALL_TYPES = ("table_wise", "column_wise", "table_column_wise", "row_wise", "data_parallel")
MULTI_HOST_TYPES = ("table_row_wise",)

INSTALL_HINT = (
    "TorchRec is not installed: run `pip install -e .[torchrec]` (on a CPU-only machine "
    "`pip install -e .[cpu,torchrec]`), then `pip install --no-deps torchrec==1.8.0` (--no-deps because "
    "torchrec's own requirements name the CUDA fbgemm-gpu package, which breaks fbgemm-gpu-cpu; the "
    "extra installs what it really needs: tensordict==0.15.3 and pyre-extensions==0.0.32)")


# --------------------------------------------------------------------------------------------
# TorchRec imports (lazy: the rest of shardcore never needs TorchRec)
# --------------------------------------------------------------------------------------------

def torchrec_available() -> bool:
    try:
        _torchrec()
    except ShardError:
        return False
    return True


def _torchrec():
    """Import what the planner needs, or raise :class:`ShardError` with the install recipe."""
    try:
        import torchrec  # noqa: F401
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: F401
        from torchrec.distributed.planner import EmbeddingShardingPlanner  # noqa: F401
    except Exception as exc:  # ImportError, OSError, or a RuntimeError of an FBGEMM build lacking an operator
        text = str(exc).strip()
        detail = text.splitlines()[0] if text else type(exc).__name__
        raise ShardError(f"{INSTALL_HINT} [import failed: {detail}]") from None
    import torchrec as _tr

    return _tr


def _data_type(precision: str):
    from torchrec.modules.embedding_configs import DataType

    try:
        return {"fp16": DataType.FP16, "fp32": DataType.FP32}[precision]
    except KeyError:
        raise ShardError(f"unknown weights precision {precision!r}: choose fp16 or fp32") from None


def _topology(ndevices: int, cap_bytes: int, compute_device: str, local_world_size: int | None = None):
    """N devices with ``cap_bytes`` each: HBM on "cuda"; on "cpu" (tables in host memory) the DDR;
    ``local_world_size`` devices per host (default: all on one host)."""
    lws = int(local_world_size) if local_world_size else ndevices
    if lws < 1 or ndevices % lws:
        raise ShardError(f"torchrec: {ndevices} devices do not split into hosts of {lws}")
    from torchrec.distributed.planner import types as ptypes

    caps = {"hbm_cap_bytes": cap_bytes}
    if compute_device == "cpu":
        caps["ddr_cap_bytes"] = cap_bytes
    factory = getattr(ptypes, "TopologyFactory", None)
    if factory is not None:  # TorchRec >= 1.8: the supported way, and no warning
        return factory.create_topology(
            ptypes.TrainerConfig(world_size=ndevices, local_world_size=lws, **caps),
            kernel_config=ptypes.KernelConfig(compute_device=compute_device))
    return ptypes.Topology(world_size=ndevices, local_world_size=lws, compute_device=compute_device,
                           hbm_cap=cap_bytes, ddr_cap=caps.get("ddr_cap_bytes"))


# --------------------------------------------------------------------------------------------
# --alg torchrec
# --------------------------------------------------------------------------------------------

@dataclass
class TorchRecSharder(Sharder):
    """TorchRec's ``EmbeddingShardingPlanner`` (see the module docstring).

    ``sharding_types``: the TorchRec types it may choose (default: every type the oracle measures,
    ``table_row_wise`` added when ``local_world_size`` splits the devices into several hosts;
    ``("table_wise",)`` for ``--alg torchrec-tw``).

    ``batch_size``: the benchmark's batch; ``memory_model``: ``"torchrec"`` (weights + I/O buffers,
    TorchRec's training estimate) or ``"weights"`` (weights only, our cap's accounting);
    ``reserve``: fraction of each device TorchRec keeps free (0 = the cap is all for tables);
    ``compute_device``: the device the planner models ("cuda", the default; "cpu" puts the tables
    in host memory, whose per-rank capacity is then our cap).
    """

    batch_size: int = DEFAULT_BATCH_SIZE
    memory_model: str = "torchrec"
    reserve: float = 0.0
    compute_device: str = "cuda"
    local_world_size: int | None = None   # devices per host (torchrun's LOCAL_WORLD_SIZE); None: one host
    sharding_types: tuple[str, ...] | None = None   # None: ALL_TYPES (+ MULTI_HOST_TYPES on several hosts)
    last_plan: Any = field(default=None, init=False, repr=False)  # TorchRec's ShardingPlan of the last task
    last_info: dict = field(default_factory=dict, init=False, repr=False)  # {"torchrec_types": [...]}

    def __post_init__(self):
        if int(self.batch_size) < 1:
            raise ShardError(f"torchrec: batch_size must be positive, got {self.batch_size}")
        if self.memory_model not in MEMORY_MODELS:
            raise ShardError(f"torchrec: memory_model must be one of {', '.join(MEMORY_MODELS)}, "
                             f"got {self.memory_model!r}")
        if not 0.0 <= float(self.reserve) < 1.0:
            raise ShardError(f"torchrec: reserve must be in [0, 1), got {self.reserve}")
        if self.compute_device not in ("cuda", "cpu"):
            raise ShardError(f"torchrec: compute_device must be cuda or cpu, got {self.compute_device!r}")
        if self.sharding_types is not None:
            bad = [t for t in self.sharding_types if t not in ALL_TYPES + MULTI_HOST_TYPES]
            if bad or not self.sharding_types:
                raise ShardError(f"torchrec: unknown sharding type {bad[0] if bad else None!r} (choose from "
                                 f"{', '.join(ALL_TYPES + MULTI_HOST_TYPES)})")
            self.sharding_types = tuple(self.sharding_types)

    def types_for(self, ndevices: int) -> list[str]:
        """The TorchRec sharding types offered for a plan over ``ndevices`` devices."""
        lws = self.local_world_size if self.local_world_size and ndevices % self.local_world_size == 0 else None
        hosts = ndevices // lws if lws else 1
        if self.sharding_types is not None:
            types = list(self.sharding_types)
            if hosts < 2 and "table_row_wise" in types and len(types) > 1:
                types.remove("table_row_wise")   # one host: table-row-wise is row-wise
            return types
        return list(ALL_TYPES) + (list(MULTI_HOST_TYPES) if hosts > 1 else [])

    def shard(self, tables: Sequence[TableConfig], ndevices: int, max_memory_gb: float,
              precision: str = "fp16") -> Plan:
        import torch

        _torchrec()
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
        from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
        from torchrec.distributed.planner.shard_estimators import (EmbeddingPerfEstimator,
                                                                   EmbeddingStorageEstimator)
        from torchrec.distributed.planner.stats import NoopEmbeddingStats
        from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
        from torchrec.distributed.planner.types import PlannerError

        if ndevices < 1:
            raise ShardError(f"torchrec: need at least one device, got {ndevices}")
        if not tables:
            return Plan((), ndevices)
        data_type = _data_type(precision)
        names = [f"t{pos}" for pos in range(len(tables))]  # internal: positions, so any task works
        configs = [EmbeddingBagConfig(name=name, embedding_dim=t.dim, num_embeddings=t.row,
                                      feature_names=[f"f{pos}"], data_type=data_type)
                   for pos, (name, t) in enumerate(zip(names, tables))]
        ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
        types = self.types_for(ndevices)
        kernels = ["fused"] + (["dense"] if "data_parallel" in types else [])
        constraints = {name: ParameterConstraints(sharding_types=list(types), compute_kernels=list(kernels),
                                                  pooling_factors=[float(t.pooling_factor)])
                       for name, t in zip(names, tables)}
        lws = self.local_world_size if self.local_world_size and ndevices % self.local_world_size == 0 else None
        topology = _topology(ndevices, int(math.floor(max_memory_gb * GB)), self.compute_device, lws)
        local_batch = max(1, int(round(int(self.batch_size) / ndevices)))
        enumerator = None
        if self.memory_model == "weights":
            enumerator = EmbeddingEnumerator(
                topology=topology, batch_size=local_batch, constraints=constraints,
                estimator=[EmbeddingPerfEstimator(topology=topology, constraints=constraints),
                           EmbeddingStorageEstimator(topology=topology, constraints=constraints,
                                                     is_inference=True)])
        planner = EmbeddingShardingPlanner(
            topology=topology, batch_size=local_batch, enumerator=enumerator, constraints=constraints,
            storage_reservation=FixedPercentageStorageReservation(float(self.reserve)),
            stats=NoopEmbeddingStats(), debug=False)
        try:
            # TorchRec logs a warning per data-parallel table ("Sharding spec not found"): not news here
            logging.disable(logging.WARNING)
            try:
                sharding_plan = planner.plan(ebc, [EmbeddingBagCollectionSharder()])
            finally:
                logging.disable(logging.NOTSET)
        except PlannerError as exc:
            raise InfeasibleError(
                f"infeasible: TorchRec's planner found no plan for {len(tables)} tables on {ndevices} devices "
                f"with {max_memory_gb:g} GB each: {_condense_planner_error(str(exc), tables)}") from None
        self.last_plan = sharding_plan
        plan, kinds = _plan_from_torchrec(sharding_plan, names, ndevices, tables)
        self.last_info = {"torchrec_types": kinds}
        if not plan.is_feasible(tables, max_memory_gb, precision):
            worst = max(plan.device_memory_gb(tables, precision))
            raise InfeasibleError(
                f"infeasible: TorchRec's plan puts {worst:.3f} GB of {precision} weights on a device, "
                f"over the {max_memory_gb:g} GB cap")
        return plan


def _shard_list(ps) -> list[tuple[int, int, int, int, int]]:
    """``(row offset, col offset, rows, cols, rank)`` of every shard of a ``ParameterSharding``."""
    spec = ps.sharding_spec
    shards = getattr(spec, "shards", None) if spec is not None else None
    out = []
    for sm in shards or []:
        m = re.match(r"rank:(\d+)/", str(sm.placement))
        if m is None:
            raise ShardError(f"torchrec: a shard's placement {sm.placement} names no rank")
        out.append((int(sm.shard_offsets[0]), int(sm.shard_offsets[1]), int(sm.shard_sizes[0]),
                    int(sm.shard_sizes[1]), int(m.group(1))))
    return out


def sharding_from_torchrec(ps, table: TableConfig, ndevices: int, name: str = "table") -> Sharding:
    """Our :class:`~shardcore.plan.Sharding` of one TorchRec ``ParameterSharding`` (exact: the same
    ranks and shard sizes, or a one-line :class:`ShardError` saying what does not match)."""
    kind = ps.sharding_type
    ranks = [int(r) for r in (ps.ranks or [])]
    if kind == "table_wise":
        if len(set(ranks)) != 1:
            raise ShardError(f"torchrec: table {name} is table-wise on ranks {ranks}, expected one")
        return table_wise(ranks[0])
    if kind == "data_parallel":
        if sorted(ranks) != list(range(ndevices)):
            raise ShardError(f"torchrec: data-parallel table {name} on ranks {ranks}, expected all {ndevices}")
        return data_parallel(ndevices)
    shards = _shard_list(ps)
    if not shards:
        raise ShardError(f"torchrec: {kind} table {name} has no shards in its sharding spec")
    if kind in ("column_wise", "table_column_wise"):
        shards.sort(key=lambda x: x[1])
        col = 0
        for r0, c0, rows, cols, _rank in shards:
            if r0 != 0 or rows != table.row or c0 != col:
                raise ShardError(f"torchrec: {kind} table {name} has a shard at [{r0}, {c0}] of "
                                 f"[{rows}, {cols}] that is not a full-height column block")
            col += cols
        if col != table.dim:
            raise ShardError(f"torchrec: {kind} table {name}'s blocks cover {col} of {table.dim} columns")
        return column_wise([(rank, cols) for _r0, _c0, _rows, cols, rank in shards])
    if kind in ("row_wise", "table_row_wise"):
        shards.sort(key=lambda x: (x[0], x[2] > 0))
        sizes = [rows for _r0, _c0, rows, _cols, _rank in shards]
        expect = row_blocks(table.row, len(shards))
        if sizes != expect or any(c0 != 0 or cols != table.dim for _r0, c0, _rows, cols, _rank in shards):
            raise ShardError(f"torchrec: {kind} table {name} has row blocks {sizes}, not {table.row} rows "
                             f"in equal blocks over {len(shards)} ranks ({expect})")
        return row_wise([rank for *_x, rank in shards])
    raise ShardError(f"torchrec: table {name} was sharded {kind}, which the oracle does not measure")


def _plan_from_torchrec(sharding_plan, names: Sequence[str], ndevices: int,
                        tables: Sequence[TableConfig]) -> tuple[Plan, list[str]]:
    module_plan = sharding_plan.plan.get("")
    if module_plan is None:
        raise ShardError(f"torchrec: the planner's plan has no entry for the module (got {list(sharding_plan.plan)})")
    shardings, kinds = [], []
    for name, t in zip(names, tables):
        ps = module_plan.get(name)
        if ps is None:
            raise ShardError(f"torchrec: the planner left table {name} out of its plan")
        shardings.append(sharding_from_torchrec(ps, t, ndevices, name))
        kinds.append(str(ps.sharding_type))
    return Plan.from_shardings(tables, shardings, ndevices), kinds


def _condense_planner_error(text: str, tables: Sequence[TableConfig]) -> str:
    """TorchRec's PlannerError is a multi-line report: keep its first sentence and the failing table."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    head = lines[0] if lines else "no reason given"
    m = re.search(r"of table t(\d+)", text)
    if m and int(m.group(1)) < len(tables):
        pos = int(m.group(1))
        t = tables[pos]
        head += f" (no rank had room for table {t.index}, task position {pos}, {t.row} x {t.dim})"
    return head


def load_sharder(path=None, batch_size: int | None = None, memory_model: str = "torchrec",
                 reserve: float = 0.0, compute_device: str = "cuda", local_world_size: int | None = None,
                 sharding_types: Sequence[str] | None = None, **_ignored) -> TorchRecSharder:
    """``--alg torchrec`` (every sharding type). ``path`` is unused (TorchRec's planner has nothing
    to load); other keyword arguments the caller passes to every method (e.g. ``seed``) are ignored.
    Raises :class:`ShardError` with the install recipe when TorchRec is missing."""
    _torchrec()
    return TorchRecSharder("torchrec", batch_size=int(batch_size or DEFAULT_BATCH_SIZE),
                           memory_model=memory_model, reserve=reserve, compute_device=compute_device,
                           local_world_size=local_world_size,
                           sharding_types=tuple(sharding_types) if sharding_types else None)


def load_sharder_tw(path=None, **kwargs) -> TorchRecSharder:
    """``--alg torchrec-tw``: TorchRec's planner restricted to table-wise sharding."""
    kwargs.pop("sharding_types", None)
    sharder = load_sharder(path, sharding_types=("table_wise",), **kwargs)
    sharder.name = "torchrec-tw"
    return sharder
