"""TorchRec interop: TorchRec's planner as an ``--alg``, and plans exported in a form TorchRec loads.

Two halves, only the first of which needs TorchRec installed:

**``--alg torchrec``** (:func:`load_sharder` -> :class:`TorchRecSharder`). For each task it builds a
TorchRec ``EmbeddingBagCollection`` on the ``meta`` device (no memory allocated) with one
``EmbeddingBagConfig`` per table (rows, dim, ``data_type`` = the weights precision, fp16 by default),
constrains every table to table-wise sharding on the ``fused`` kernel with its pooling factor
(``ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["fused"],
pooling_factors=[pf])``), describes N devices whose HBM is our per-device memory cap
(``compute_device="cuda"``: the device the planner models; planning itself runs offline on a CPU), and
runs ``EmbeddingShardingPlanner``. Its plan (one rank per table) becomes our :class:`~shardcore.plan.Plan`.

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
splits column-wise (NeuroShard, :attr:`Plan.splits`) is ``column_wise`` with one shard of
``[rows, dim/k]`` per column block, on the ranks its column shards were given). JSON rather than a
pickle, so loading a plan never executes code. :func:`export_plan` writes both files for one task;
:func:`export_plans` writes a directory for many (task, algorithm) records.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from . import io
from .baselines import Sharder
from .errors import InfeasibleError, ShardError
from .plan import Plan
from .tables import GB, TableConfig

DEFAULT_BATCH_SIZE = 4096
TORCHREC_FORMAT = "shardcore-torchrec-plan-v1"
PLAN_FORMAT = "shardcore-plan-v1"
MEMORY_MODELS = ("torchrec", "weights")

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
    """TorchRec's ``EmbeddingShardingPlanner``, table-wise only (see the module docstring).

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
    last_plan: Any = field(default=None, init=False, repr=False)  # TorchRec's ShardingPlan of the last task

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
        constraints = {name: ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["fused"],
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
            sharding_plan = planner.plan(ebc, [EmbeddingBagCollectionSharder()])
        except PlannerError as exc:
            raise InfeasibleError(
                f"infeasible: TorchRec's planner found no plan for {len(tables)} tables on {ndevices} devices "
                f"with {max_memory_gb:g} GB each: {_condense_planner_error(str(exc), tables)}") from None
        self.last_plan = sharding_plan
        plan = _plan_from_torchrec(sharding_plan, names, ndevices)
        if not plan.is_feasible(tables, max_memory_gb, precision):
            worst = max(plan.device_memory_gb(tables, precision))
            raise InfeasibleError(
                f"infeasible: TorchRec's plan puts {worst:.3f} GB of {precision} weights on a device, "
                f"over the {max_memory_gb:g} GB cap")
        return plan


def _plan_from_torchrec(sharding_plan, names: Sequence[str], ndevices: int) -> Plan:
    module_plan = sharding_plan.plan.get("")
    if module_plan is None:
        raise ShardError(f"torchrec: the planner's plan has no entry for the module (got {list(sharding_plan.plan)})")
    alloc = []
    for name in names:
        ps = module_plan.get(name)
        if ps is None:
            raise ShardError(f"torchrec: the planner left table {name} out of its plan")
        if ps.sharding_type != "table_wise" or not ps.ranks or len(set(ps.ranks)) != 1:
            raise ShardError(f"torchrec: table {name} was sharded {ps.sharding_type} on ranks {ps.ranks}, "
                             "expected table-wise on one rank")
        alloc.append(int(ps.ranks[0]))
    return Plan(tuple(alloc), ndevices)


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
                 **_ignored) -> TorchRecSharder:
    """``--alg torchrec``. ``path`` is unused (TorchRec's planner has nothing to load); other
    keyword arguments the caller passes to every method (e.g. ``seed``) are ignored.
    Raises :class:`ShardError` with the install recipe when TorchRec is missing."""
    _torchrec()
    return TorchRecSharder("torchrec", batch_size=int(batch_size or DEFAULT_BATCH_SIZE),
                           memory_model=memory_model, reserve=reserve, compute_device=compute_device,
                           local_world_size=local_world_size)


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
    plan.expand(tables)   # checks that the plan and its splits match the tables
    splits = plan.splits if plan.splits is not None else (1,) * len(tables)
    out, pos = [], 0
    for t, k in zip(tables, splits):
        width = t.dim // k
        out.append([(int(plan.allocation[pos + j]), j * width, width) for j in range(k)])
        pos += k
    return out


def plan_json(tables: Sequence[TableConfig], plan: Plan, max_memory_gb: float, precision: str = "fp16",
              names: Sequence[str] | None = None, device_ids: Sequence[int] | None = None,
              **meta: Any) -> dict:
    """The plain form: ``{"tables": [{"name", "index", "rows", "dim", "pooling_factor", "device"}],
    "ndevices", "max_memory_gb", "memory_gb": [...], ...}``. ``device`` is the rank (0..N-1);
    ``device_ids`` (optional) names the physical device of each rank; ``meta`` (e.g. ``alg``,
    ``task``) is added as top-level keys. A table the plan splits column-wise has ``"device": null``
    and ``"column_shards": [{"device", "dim_offset", "dim"}, ...]`` (its ``k`` shards in column order)."""
    names = _check_names(tables, names)
    shards = column_shards(tables, plan)
    if device_ids is not None and len(device_ids) != plan.ndevices:
        raise ShardError(f"{len(device_ids)} device ids for a plan over {plan.ndevices} devices")
    out: dict[str, Any] = {"format": PLAN_FORMAT}
    out.update(meta)
    rows = []
    for n, t, cols in zip(names, tables, shards):
        row = {"name": n, "index": t.index, "rows": t.row, "dim": t.dim, "pooling_factor": t.pooling_factor,
               "device": cols[0][0] if len(cols) == 1 else None}
        if len(cols) > 1:
            row["column_shards"] = [{"device": r, "dim_offset": o, "dim": d} for r, o, d in cols]
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
    """The TorchRec form: per table (by name) a ``ParameterSharding``: table-wise on one rank, or,
    for a table the plan splits into ``k`` column shards, column-wise with the ranks of its shards
    (``ranks=[r_0, .., r_k-1]``, shard ``j`` at offsets ``[0, j x dim/k]`` of size ``[rows, dim/k]``).
    ``module_path`` is where the ``EmbeddingBagCollection`` sits in the user's model ("" when the
    model is the collection itself, e.g. ``"sparse_arch.embedding_bag_collection"``)."""
    names = _check_names(tables, names)
    shards = column_shards(tables, plan)
    return {
        "format": TORCHREC_FORMAT,
        "world_size": plan.ndevices,
        "module_path": module_path,
        "data_type": precision,
        "tables": [{"name": n, "sharding_type": "table_wise" if len(cols) == 1 else "column_wise",
                    "compute_kernel": compute_kernel, "ranks": [r for r, _, _ in cols], "rows": t.row,
                    "dim": t.dim,
                    "shards": [{"offsets": [0, o], "sizes": [t.row, d], "rank": r} for r, o, d in cols]}
                   for n, t, cols in zip(names, tables, shards)],
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
