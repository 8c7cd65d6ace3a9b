"""TorchRec interop: TorchRec's planner as an ``--alg``, and plans exported in a form TorchRec loads.

Two halves, only the first of which needs TorchRec installed:

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

**Export** (plain JSON, no TorchRec needed to write it): :func:`plan_json` gives the plain form
(``{"tables": [{"name", "index", "rows", "dim", "pooling_factor", "device"}, ...], "ndevices",
"max_memory_gb", "memory_gb": [...]}``), :func:`torchrec_plan_json` a form that
:func:`load_torchrec_plan` / :func:`sharding_plan_from_json` turn back into TorchRec's
``ShardingPlan`` (one ``ParameterSharding`` per table: table-wise, ``fused``, ``ranks=[r]``, one
shard ``[0, 0] + [rows, dim]`` placed on ``rank:r/cuda:r``, or ``rank:r/cpu``; a table that a plan
splits column-wise (NeuroShard, :attr:`Plan.splits`, or uneven blocks) is ``column_wise`` with one
shard of ``[rows, dim_j]`` per column block, on the ranks its blocks were given; a row-wise table is
``row_wise`` over all ranks or ``table_row_wise`` over a subset, shard ``j`` ``[j x block, 0] +
[rows_j, dim]`` on its ``j``-th rank (trailing empty blocks included, as TorchRec writes them); a
data-parallel table is ``data_parallel`` on the ``dense`` kernel with every rank and no sharding
spec). JSON rather than a
pickle, so loading a plan never executes code. :func:`export_plan` writes both files for one task;
:func:`export_plans` writes a directory for many (task, algorithm) records.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from . import io
from .baselines import Sharder
from .errors import InfeasibleError, ShardError
from .plan import (COLUMN_WISE, ROW_WISE, TABLE_WISE, Plan, Sharding, column_wise, data_parallel, row_blocks,
                   row_wise, table_wise)
from .tables import GB, TableConfig

DEFAULT_BATCH_SIZE = 4096
TORCHREC_FORMAT = "shardcore-torchrec-plan-v1"
PLAN_FORMAT = "shardcore-plan-v1"
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


# --------------------------------------------------------------------------------------------
# Export (plain JSON; no TorchRec needed)
# --------------------------------------------------------------------------------------------

def default_names(tables: Sequence[TableConfig]) -> list[str]:
    """``table_<dataset index>``; a table that a task uses more than once (NeuroShard's task files
    draw ids with replacement) is named ``table_<index>_<k>`` at its k-th repeat, so names stay unique."""
    seen: dict[int, int] = {}
    names = []
    for t in tables:
        k = seen.get(t.index, 0)
        seen[t.index] = k + 1
        names.append(f"table_{t.index}" if k == 0 else f"table_{t.index}_{k}")
    return names


def _check_names(tables: Sequence[TableConfig], names: Sequence[str] | None) -> list[str]:
    names = default_names(tables) if names is None else [str(n) for n in names]
    if len(names) != len(tables):
        raise ShardError(f"{len(names)} table names for {len(tables)} tables")
    seen: dict[str, int] = {}
    for pos, n in enumerate(names):
        if not n:
            raise ShardError(f"table at position {pos} has an empty name")
        if n in seen:
            raise ShardError(f"duplicate table name {n!r} (positions {seen[n]} and {pos})")
        seen[n] = pos
    return names


def column_shards(tables: Sequence[TableConfig], plan: Plan) -> list[list[tuple[int, int, int]]]:
    """Per task table, its column shards as ``(rank, dim offset, dim)``: one shard covering the whole
    table when the plan does not split it, ``k`` shards of ``dim / k`` (in column order, on the ranks
    the plan's allocation gives the expanded table list) when ``plan.splits`` cuts it into ``k``."""
    out = []
    for t, s in zip(tables, plan.table_shardings(tables)):
        if s.type == TABLE_WISE:
            out.append([(int(s.devices[0]), 0, t.dim)])
        elif s.type == COLUMN_WISE:
            offs = [sum(s.dims[:j]) for j in range(len(s.dims))]
            out.append([(int(d), o, int(w)) for d, o, w in zip(s.devices, offs, s.dims)])
        else:
            raise ShardError(f"table {t.index} is {s.type}: it has no column shards")
    return out


def _torchrec_shards(t: TableConfig, s: Sharding, world: int) -> tuple[str, str, list[int], list[dict]]:
    """TorchRec's ``(sharding_type, compute_kernel, ranks, shards)`` of one table's sharding."""
    if s.type == TABLE_WISE:
        return "table_wise", "fused", [int(s.devices[0])], [
            {"offsets": [0, 0], "sizes": [t.row, t.dim], "rank": int(s.devices[0])}]
    if s.type == COLUMN_WISE:
        shards, off = [], 0
        for d, w in zip(s.devices, s.dims):
            shards.append({"offsets": [0, off], "sizes": [t.row, int(w)], "rank": int(d)})
            off += int(w)
        return "column_wise", "fused", [int(d) for d in s.devices], shards
    if s.type == ROW_WISE:
        kind = "row_wise" if list(s.devices) == list(range(world)) else "table_row_wise"
        shards, off = [], 0
        for d, rows in zip(s.devices, row_blocks(t.row, len(s.devices))):
            shards.append({"offsets": [off, 0], "sizes": [rows, t.dim], "rank": int(d)})
            off += rows
        return kind, "fused", [int(d) for d in s.devices], shards
    return "data_parallel", "dense", list(range(world)), []


def plan_json(tables: Sequence[TableConfig], plan: Plan, max_memory_gb: float, precision: str = "fp16",
              names: Sequence[str] | None = None, device_ids: Sequence[int] | None = None,
              **meta: Any) -> dict:
    """The plain form: ``{"tables": [{"name", "index", "rows", "dim", "pooling_factor", "device"}],
    "ndevices", "max_memory_gb", "memory_gb": [...], ...}``. ``device`` is the rank (0..N-1);
    ``device_ids`` (optional) names the physical device of each rank; ``meta`` (e.g. ``alg``,
    ``task``) is added as top-level keys. A table the plan splits column-wise has ``"device": null``
    and ``"column_shards": [{"device", "dim_offset", "dim"}, ...]`` (its ``k`` shards in column order)."""
    names = _check_names(tables, names)
    shardings = plan.table_shardings(tables)
    if device_ids is not None and len(device_ids) != plan.ndevices:
        raise ShardError(f"{len(device_ids)} device ids for a plan over {plan.ndevices} devices")
    out: dict[str, Any] = {"format": PLAN_FORMAT}
    out.update(meta)
    rows = []
    for n, t, s in zip(names, tables, shardings):
        row = {"name": n, "index": t.index, "rows": t.row, "dim": t.dim, "pooling_factor": t.pooling_factor,
               "device": int(s.devices[0]) if s.type == TABLE_WISE else None, "sharding": s.to_json(t)}
        if s.type == COLUMN_WISE:
            offs = [sum(s.dims[:j]) for j in range(len(s.dims))]
            row["column_shards"] = [{"device": int(r), "dim_offset": o, "dim": int(d)}
                                    for r, o, d in zip(s.devices, offs, s.dims)]
        rows.append(row)
    out["tables"] = rows
    out["ndevices"] = plan.ndevices
    if device_ids is not None:
        out["device_ids"] = [int(x) for x in device_ids]
    out["max_memory_gb"] = max_memory_gb
    out["precision"] = precision
    out["memory_gb"] = [round(m, 6) for m in plan.device_memory_gb(tables, precision)]
    out["feasible"] = plan.is_feasible(tables, max_memory_gb, precision)
    return out


def torchrec_plan_json(tables: Sequence[TableConfig], plan: Plan, names: Sequence[str] | None = None,
                       precision: str = "fp16", module_path: str = "", compute_kernel: str = "fused") -> dict:
    """The TorchRec form: per table (by name) a ``ParameterSharding``: table-wise on one rank;
    column-wise with the ranks of its column blocks (shard ``j`` at ``[0, offset_j]`` of
    ``[rows, dim_j]``); row-wise (all ranks) or table-row-wise (a subset) with shard ``j`` at
    ``[j x block, 0]`` of ``[rows_j, dim]``; data-parallel on the ``dense`` kernel, every rank, no shards.
    ``module_path`` is where the ``EmbeddingBagCollection`` sits in the user's model ("" when the
    model is the collection itself, e.g. ``"sparse_arch.embedding_bag_collection"``)."""
    names = _check_names(tables, names)
    rows = []
    for n, t, s in zip(names, tables, plan.table_shardings(tables)):
        kind, kernel, ranks, shards = _torchrec_shards(t, s, plan.ndevices)
        rows.append({"name": n, "sharding_type": kind,
                     "compute_kernel": kernel if kind == "data_parallel" else compute_kernel,
                     "ranks": ranks, "rows": t.row, "dim": t.dim, "shards": shards})
    return {
        "format": TORCHREC_FORMAT,
        "world_size": plan.ndevices,
        "module_path": module_path,
        "data_type": precision,
        "tables": rows,
    }


def torchrec_path_for(path: str | os.PathLike) -> Path:
    """``plan.json`` -> ``plan.torchrec.json`` (where ``plan.py --torchrec`` writes the TorchRec form)."""
    path = Path(path)
    stem = path.name[:-5] if path.name.endswith(".json") else path.name
    return path.with_name(stem + ".torchrec.json")


def export_plan(out_dir: str | os.PathLike, stem: str, tables: Sequence[TableConfig], plan: Plan,
                max_memory_gb: float, precision: str = "fp16", names: Sequence[str] | None = None,
                module_path: str = "", **meta: Any) -> tuple[Path, Path]:
    """Write ``out_dir/<stem>.json`` (plain form) and ``out_dir/<stem>.torchrec.json`` (TorchRec
    form), each atomically; returns both paths."""
    out_dir = Path(out_dir)
    plain = out_dir / f"{stem}.json"
    trec = out_dir / f"{stem}.torchrec.json"
    io.write_json(plain, plan_json(tables, plan, max_memory_gb, precision, names, **meta))
    io.write_json(trec, torchrec_plan_json(tables, plan, names, precision, module_path))
    return plain, trec


@dataclass
class PlanRecord:
    """One planned task for :func:`export_plans`: the task's id, the algorithm, its tables (task
    order), the plan and optionally the tables' names (default ``table_<index>``)."""

    task: int
    alg: str
    tables: Sequence[TableConfig]
    plan: Plan | None
    names: Sequence[str] | None = None


def alg_slug(alg: str) -> str:
    """A directory name for an ``--alg`` value (which may be a checkpoint path)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", alg).strip("._") or "alg"
    return slug


def export_plans(out_dir: str | os.PathLike, records: Iterable[PlanRecord | tuple],
                 max_memory_gb: float, precision: str = "fp16", module_path: str = "") -> list[Path]:
    """Write every record's plan in both forms: ``out_dir/<alg>/task_<k>.json`` and
    ``out_dir/<alg>/task_<k>.torchrec.json`` (``<alg>`` made safe as a directory name, ``k`` the task
    id zero-padded to 4 digits), plus ``out_dir/index.json`` listing them. ``records`` holds
    :class:`PlanRecord` or ``(task, alg, tables, plan[, names])`` tuples; a record whose plan is
    ``None`` (the algorithm found none) writes no files and is listed with ``"plan": null``.
    Returns the paths written (the index last)."""
    out_dir = Path(out_dir)
    slugs: dict[str, str] = {}
    written: list[Path] = []
    index = []
    for rec in records:
        if not isinstance(rec, PlanRecord):
            rec = PlanRecord(*rec)
        slug = slugs.setdefault(rec.alg, alg_slug(rec.alg))
        clash = [a for a, s in slugs.items() if s == slug and a != rec.alg]
        if clash:
            raise ShardError(f"algorithms {clash[0]!r} and {rec.alg!r} would share the export directory {slug!r}")
        if rec.plan is None:
            index.append({"task": int(rec.task), "alg": rec.alg, "plan": None, "torchrec": None})
            continue
        stem = f"task_{int(rec.task):04d}"
        plain, trec = export_plan(out_dir / slug, stem, rec.tables, rec.plan, max_memory_gb, precision,
                                  rec.names, module_path, alg=rec.alg, task=int(rec.task))
        written += [plain, trec]
        index.append({"task": int(rec.task), "alg": rec.alg, "plan": str(plain.relative_to(out_dir)),
                      "torchrec": str(trec.relative_to(out_dir))})
    index_path = out_dir / "index.json"
    io.write_json(index_path, {"format": "shardcore-plan-index-v1", "max_memory_gb": max_memory_gb,
                               "precision": precision, "plans": index})
    written.append(index_path)
    return written


# --------------------------------------------------------------------------------------------
# Back into TorchRec (needs TorchRec)
# --------------------------------------------------------------------------------------------

def _read_json(path_or_obj: str | os.PathLike | Mapping) -> dict:
    if isinstance(path_or_obj, Mapping):
        return dict(path_or_obj)
    path = Path(path_or_obj)
    if not path.is_file():
        raise ShardError(f"plan not found: {path}")
    try:
        return json.loads(io.read_text(path, "plan (JSON)"))
    except json.JSONDecodeError as exc:
        raise ShardError(f"{path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None


def sharding_plan_from_json(obj: Mapping, device_type: str = "cuda", module_path: str | None = None,
                            module=None, local_world_size: int | None = None):
    """TorchRec's ``ShardingPlan`` from :func:`torchrec_plan_json`'s dict.

    ``device_type``: where the shards live (``"cuda"``: ``rank:r/cuda:<r mod local_world_size>``;
    ``"cpu"``: ``rank:r/cpu``). ``module_path`` overrides the file's. With ``module`` (the
    ``EmbeddingBagCollection`` to shard) every table is checked to exist there with the same rows
    and dim."""
    _torchrec()
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
    from torchrec.distributed.types import EmbeddingModuleShardingPlan, ParameterSharding, ShardingPlan

    if obj.get("format") != TORCHREC_FORMAT:
        raise ShardError(f"not a shardcore TorchRec plan (format {obj.get('format')!r}, expected {TORCHREC_FORMAT!r})")
    world = int(obj["world_size"])
    local = int(local_world_size or world)
    if module is not None:
        shapes = {c.name: (c.num_embeddings, c.embedding_dim) for c in module.embedding_bag_configs()}
        for t in obj["tables"]:
            if t["name"] not in shapes:
                raise ShardError(f"the plan's table {t['name']!r} is not in the module (tables: {sorted(shapes)})")
            if shapes[t["name"]] != (t["rows"], t["dim"]):
                raise ShardError(f"table {t['name']!r}: the plan has {t['rows']} x {t['dim']}, "
                                 f"the module {shapes[t['name']][0]} x {shapes[t['name']][1]}")

    def placement(rank: int) -> str:
        if not 0 <= rank < world:
            raise ShardError(f"plan places a shard on rank {rank}, but the world size is {world}")
        return f"rank:{rank}/cpu" if device_type == "cpu" else f"rank:{rank}/{device_type}:{rank % local}"

    params = {}
    for t in obj["tables"]:
        if t["sharding_type"] == "data_parallel":   # a replica everywhere: no sharding spec
            for r in t["ranks"]:
                placement(int(r))
            params[t["name"]] = ParameterSharding(sharding_type="data_parallel", compute_kernel=t["compute_kernel"],
                                                  ranks=[int(r) for r in t["ranks"]], sharding_spec=None)
            continue
        spec = EnumerableShardingSpec([
            ShardMetadata(shard_offsets=list(s["offsets"]), shard_sizes=list(s["sizes"]),
                          placement=placement(int(s["rank"])))
            for s in t["shards"]])
        params[t["name"]] = ParameterSharding(sharding_type=t["sharding_type"], compute_kernel=t["compute_kernel"],
                                              ranks=[int(r) for r in t["ranks"]], sharding_spec=spec)
    path = obj.get("module_path", "") if module_path is None else module_path
    return ShardingPlan({path: EmbeddingModuleShardingPlan(params)})


def load_torchrec_plan(path: str | os.PathLike, device_type: str = "cuda", module_path: str | None = None,
                       module=None, local_world_size: int | None = None):
    """Read a ``*.torchrec.json`` and return TorchRec's ``ShardingPlan`` (for
    ``DistributedModelParallel(model, plan=...)``); see :func:`sharding_plan_from_json`."""
    return sharding_plan_from_json(_read_json(path), device_type=device_type, module_path=module_path,
                                   module=module, local_world_size=local_world_size)
