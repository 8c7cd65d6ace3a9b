"""``ShardkitPlanner``: shardkit's planner behind TorchRec's ``ShardingPlanner`` interface.

::

    planner = ShardkitPlanner(topology, batch_size=512, constraints=constraints, samples=[kjt, ...])
    plan = planner.collective_plan(model, [EmbeddingBagCollectionSharder()], pg)   # same plan on every rank
    model = DistributedModelParallel(model, device=device, plan=plan, sharders=[EmbeddingBagCollectionSharder()])

**In.** Every ``EmbeddingBagCollection`` of the module (all planned together, as one task); per table its
rows, dim and the statistics of :mod:`shardkit_torchrec.stats` (pooling factor from the samples, else
``ParameterConstraints.pooling_factors``, else TorchRec's default; reuse and bag-length CV from the
samples). From the ``Topology``: the world size (one host: ``local_world_size == world_size``, the one
NVLink domain the exchange model describes; several hosts are refused), the memory cap per rank (the
smallest rank's HBM, or DDR on a ``cpu`` topology, less ``reserve``, like TorchRec's storage
reservation), and the intra-host bandwidth as the exchange model's
(TorchRec's built-in default, a nominal 600 GiB/s, is not a statement about the hardware: then the
exchange model keeps its own stated constants, :class:`~shardcore.oracles.commmodel.CommModel`). The batch is
TorchRec's per-rank ``batch_size`` times the world size. The arguments are checked as the command-line
flags are (a batch or time budget that is not positive, a reserve outside [0, 1), a ``device_type`` other
than cpu or cuda, a module that is no torch module: one-line errors).

**Precision.** The weights' ``data_type`` of every table (fp16 or fp32, one for all: a mix is refused,
:func:`shardkit_torchrec.stats.precision_of`) goes to the cost model and the memory account. A cost model
fitted on measurements prices the precision it was measured in (another is refused); the emulated H200's
compute follows :class:`~shardkit_torchrec.estimator.EmulatedPerfEstimator`'s rule, the same for both
(``last_info["precision_note"]`` says when fp32's compute is priced from the fp16 measurements).

**Memory.** shardkit's search caps each rank's weights; the finished plan is checked with the memory
account of :mod:`shardcore.interop.memory` (weights, the state of ``optimizer``, the I/O buffers at the
global batch) against the rank's memory less the reserve, and planned again with a lower weights cap
while a rank is over (``last_memory``, ``last_info["memory_gib"]``): a plan it returns fits by the
account, which is never below TorchRec's own storage estimate of the same shards.

**Planning.** :class:`shardkit_planner.sharder.ShardkitSharder` (starts, local search) under the cost model
of ``oracle``: ``"emulated:h200"`` (the default on a ``cuda`` topology: the emulated H200's compute model,
:func:`shardkit_planner.costmodel.emulated_model`, and the exchange model), a fitted shardkit cost model
file (``tools/fit_shardkit_model.py``), or a :class:`~shardkit_planner.costmodel.CostModel`. A ``cpu``
topology has no default: name one. The search may create every type shardkit has (``types``).

**What TorchRec can express** (checked on 4 gloo ranks, forward outputs against the unsharded tables, in
``tests/test_shardkit_torchrec.py``): table-wise; column-wise with uneven blocks, several blocks on one
rank allowed (TorchRec's ``column_wise``, shard ``j`` at column offset ``j``); row-wise over all ranks in
rank order (TorchRec's ``row_wise`` gives rank ``r`` the ``r``-th block of ``ceil(rows / world)`` rows,
whatever the sharding spec's placements say); data-parallel (``dense`` kernel, every rank). It cannot
express a row-wise table over a subset of one host's ranks (its ``table_row_wise`` spans a whole host)
or over all ranks in another order. The search is kept to what TorchRec expresses (the cost model
prices a device holding such a row block at ``INEXPRESSIBLE_MS``, so no move creates one), and the plan
is checked once more: a table it still cannot express is refused in one line
(:class:`~shardcore.errors.ShardError`), never changed.

**Out.** TorchRec's ``ShardingPlan`` (``fused`` kernel; ``dense`` for data-parallel), built through the
plan-file form of :mod:`shardcore.interop.plan_export` (one entry per collection's module path), placements
``rank:r/cuda:r`` or ``rank:r/cpu`` after ``device_type`` (default: the topology's compute device).
``collective_plan`` plans on rank 0 and broadcasts that JSON form (bytes, not a pickle) to every rank of
the group; an error on rank 0 is raised on every rank.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import torch
from torch import nn
from torchrec.distributed.planner.constants import BATCH_SIZE, INTRA_NODE_BANDWIDTH
from torchrec.distributed.planner.types import ParameterConstraints, Topology
from torchrec.distributed.types import ModuleSharder, ShardingPlan, ShardingPlanner

from shardcore.oracles.commmodel import CommModel
from shardcore.errors import InfeasibleError, ShardError
from shardcore.plan import ROW_WISE, Plan, ShardPiece, Sharding
from shardcore.interop.memory import EXACT_SGD, DeviceMemory, device_memory, optimizer_name, overflow
from shardcore.interop.plan_export import DEVICE_TYPES, sharding_plan_from_json, torchrec_plan_json, torchrec_problem
from shardkit_torchrec.torchrec_memory import TORCHREC_DEFAULT_RESERVE
from shardcore.tables import GB
from shardcore.types import Topology as ShardTopology
from shardkit_planner.costmodel import EMULATED, CostModel, emulated_model
from shardcore.planning import parse_landscape
from shardkit_planner.sharder import CONFIG as SHARDKIT_CONFIG, ShardkitSharder
from shardkit_planner.search import ALL_TYPES

ONE_HOST_TYPES = tuple(t for t in ALL_TYPES if t != "grid")   # a grid needs hosts: this planner plans one

from .estimator import precision_note
from .stats import TableStats, collections, precision_of, table_stats

INEXPRESSIBLE_MS = 1e6      # the price of a device holding a row block TorchRec cannot place (module notes)
DEFAULT_RESERVE = TORCHREC_DEFAULT_RESERVE   # TorchRec's default storage reservation keeps 15% of every device off limits
MEMORY_REPLANS = 3          # plans made with a lower weights cap when the memory account overflows a rank


def expressible_problem(s: Sharding, world: int) -> str | None:
    """Why TorchRec cannot apply our sharding on one host of ``world`` ranks (``None`` when it can)."""
    return torchrec_problem(s, world, world)


def _inexpressible_piece(p, world: int) -> bool:
    """A row block that is not one of the ``world`` blocks TorchRec's row_wise makes."""
    if not isinstance(p, ShardPiece) or p.kind != ROW_WISE:
        return False
    block = -(-int(p.full_row) // world)
    return p.row_start % block != 0 or p.row != min(block, p.full_row - p.row_start)


@dataclass
class TorchRecCostModel(CostModel):
    """A cost model whose search space is what TorchRec can express on ``world`` ranks: a device that
    holds a row block TorchRec's row_wise would not make costs ``INEXPRESSIBLE_MS`` more."""

    world: int = 1

    @classmethod
    def wrap(cls, model: CostModel, world: int) -> "TorchRecCostModel":
        kw = {f.name: getattr(model, f.name) for f in fields(CostModel) if f.init and not f.name.startswith("_")}
        return cls(**kw, world=int(world))

    def shard_compute(self, shards):
        shards = [list(s) for s in shards]
        out = super().shard_compute(shards)
        bad = np.array([any(_inexpressible_piece(p, self.world) for p in s) for s in shards], dtype=float)
        return out + INEXPRESSIBLE_MS * bad


def _cost_model(oracle, batch: int, comm: CommModel, world: int, stats: Sequence[TableStats]) -> CostModel:
    if isinstance(oracle, CostModel):
        base = oracle
    elif isinstance(oracle, str) and oracle.lower().startswith("emulated:"):
        base = emulated_model(os.devnull, batch, comm, card=parse_landscape(oracle).split(":", 1)[1])
    elif isinstance(oracle, (str, os.PathLike)) and Path(oracle).is_file():
        base = CostModel.load(oracle)
    else:
        raise ShardError(f"ShardkitPlanner: oracle {oracle!r} is neither {EMULATED!r}, emulated:CARD.json, a shardkit "
                         "cost model file, nor a CostModel")
    model = TorchRecCostModel.wrap(base, world)
    model.batch_size = int(batch)
    # the tables' positions are their indices: their CVs are given, never looked up among the dataset's
    model.length_cv = [s.length_cv if s.length_cv is not None else float(base.compute.default_cv) for s in stats]
    return model


def _positive(name: str, value, kind):
    """A positive ``int`` or ``float`` argument, as the command-line flags take them (one line otherwise)."""
    ok = not isinstance(value, bool) and isinstance(value, (int,) if kind is int else (int, float))
    if not ok or not math.isfinite(value) or value <= 0:
        raise ShardError(f"ShardkitPlanner: {name} must be a positive {'whole number' if kind is int else 'number'}, "
                         f"got {value!r}")
    return kind(value)


def _precision_check(model: CostModel, precision: str) -> str | None:
    """The collection's weights precision against the cost model's: a model fitted on measurements (a file or
    a ``CostModel``) prices the precision it was measured in, and another is refused; the emulated card's
    compute goes through the estimator's rule (:func:`shardkit_torchrec.estimator.precision_note`, the note
    returned where it prices another precision's compute from its own measurements)."""
    if str(getattr(model, "landscape", "")).startswith("emulated:"):
        return precision_note(model.compute, precision)
    if model.precision != precision:
        raise ShardError(f"ShardkitPlanner: the cost model was fitted on {model.precision} weights and the collection's "
                         f"tables are {precision}: fit one on {precision} measurements (tools/fit_shardkit_model.py)")
    return None


def _comm_from_topology(topology: Topology, comm: CommModel | None) -> CommModel:
    if comm is not None:
        return comm
    bw = float(topology.intra_host_bw)               # bytes per ms
    if math.isclose(bw, INTRA_NODE_BANDWIDTH):
        return CommModel()
    return CommModel(bandwidth_gbps=bw / 1e6, link=f"the topology's intra-host bandwidth ({bw / 1e6:.1f} GB/s)")


class ShardkitPlanner(ShardingPlanner):
    """shardkit as TorchRec's ``ShardingPlanner`` (see the module notes).

    ``topology``: TorchRec's (world size, caps, bandwidths, compute device); ``batch_size``: per rank, as
    TorchRec's planners take it (default TorchRec's ``BATCH_SIZE``); ``constraints``: TorchRec's
    ``{table: ParameterConstraints}`` (their pooling factors are read; ``sharding_types`` limit a table's
    types); ``samples``: input ``KeyedJaggedTensor`` s; ``oracle``: the cost model planned for;
    ``comm``: an exchange model replacing the topology's bandwidth; ``time_budget_s``, ``starts``,
    ``types``: shardkit's search; ``reserve``: the share of each rank's memory kept free;
    ``device_type``: where the plan places shards (default the topology's compute device); ``optimizer``:
    the fused optimizer whose state the memory account counts (exact SGD, row-wise Adagrad, Adam...).

    After ``plan``: ``last_plan`` (ours), ``last_stats`` (the tables as planned), ``last_memory`` (the
    account per rank), ``last_info`` (shardkit's record: start, moves, the model's cost in ms...)."""

    def __init__(self, topology: Topology, batch_size: int | None = None,
                 constraints: Optional[Dict[str, ParameterConstraints]] = None, samples: Sequence[Any] | None = None,
                 oracle: str | os.PathLike | CostModel | None = None, comm: CommModel | None = None,
                 time_budget_s: float = SHARDKIT_CONFIG.time, starts: Sequence[str] = SHARDKIT_CONFIG.starts,
                 types: Sequence[str] = ONE_HOST_TYPES, reserve: float = DEFAULT_RESERVE,
                 device_type: str | None = None, optimizer: str = EXACT_SGD) -> None:
        if topology.local_world_size != topology.world_size:
            raise ShardError(f"ShardkitPlanner plans one host: the topology has {topology.world_size} ranks in hosts "
                             f"of {topology.local_world_size} (the exchange model is one NVLink domain's)")
        batch_size = _positive("batch_size", BATCH_SIZE if batch_size is None else batch_size, int)
        time_budget_s = _positive("time_budget_s", time_budget_s, float)
        if device_type is not None and device_type not in DEVICE_TYPES:
            raise ShardError(f"ShardkitPlanner: device_type must be one of {', '.join(DEVICE_TYPES)}, got {device_type!r}")
        if oracle is None:
            if topology.compute_device != "cuda":
                raise ShardError(f"ShardkitPlanner: a {topology.compute_device} topology has no default cost model: "
                                 f"give oracle={EMULATED!r} or a shardkit cost model file fitted on this machine "
                                 "(tools/fit_shardkit_model.py)")
            oracle = EMULATED
        if isinstance(reserve, bool) or not isinstance(reserve, (int, float)) or not 0.0 <= float(reserve) < 1.0:
            raise ShardError(f"ShardkitPlanner: reserve must be in [0, 1), got {reserve!r}")
        bad = [t for t in types if t not in ONE_HOST_TYPES]
        if bad or not types:
            raise ShardError(f"ShardkitPlanner: unknown sharding type {bad[0] if bad else None!r} "
                             f"(choose from {', '.join(ONE_HOST_TYPES)})")
        self.topology = topology
        self.batch_size = batch_size
        self.constraints = dict(constraints or {})
        self.samples = list(samples or [])
        self.oracle = oracle
        self.comm = _comm_from_topology(topology, comm)
        self.time_budget_s = float(time_budget_s)
        self.starts = tuple(starts)
        self.types = tuple(types)
        self.reserve = float(reserve)
        self.device_type = device_type or topology.compute_device
        self.optimizer = optimizer_name(optimizer)
        self.last_plan: Plan | None = None
        self.last_stats: list[TableStats] = []
        self.last_info: dict = {}
        self.last_memory: list[DeviceMemory] = []

    # -- the pieces ------------------------------------------------------------------------------
    @property
    def world(self) -> int:
        return int(self.topology.world_size)

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world

    def cap_gb(self) -> float:
        """The memory per rank a plan may fill, in GiB: the smallest rank's HBM (DDR on a cpu topology), less
        the reserve. Its weights, optimizer state and buffers together (the memory account) must fit."""
        kind = "hbm" if self.topology.compute_device in ("cuda", "mtia") else "ddr"
        cap = min(getattr(d.storage, kind) for d in self.topology.devices)
        return cap * (1.0 - self.reserve) / GB

    def _check_sharders(self, module: nn.Module, sharders: Sequence[ModuleSharder]) -> None:
        from torchrec.modules.embedding_modules import EmbeddingBagCollection

        ebc_sharders = [s for s in sharders if issubclass(EmbeddingBagCollection, s.module_type)]
        if not ebc_sharders:
            raise ShardError("ShardkitPlanner plans EmbeddingBagCollections: no sharder for them was given")
        others = {s.module_type for s in sharders} - {s.module_type for s in ebc_sharders}
        for path, m in module.named_modules():
            if type(m) in others:
                raise ShardError(f"ShardkitPlanner plans EmbeddingBagCollections only; {path or 'the module'} is a "
                                 f"{type(m).__name__} with a sharder given")
        offered = set(ebc_sharders[0].sharding_types(self.topology.compute_device))
        missing = [t for t in self.types if t not in offered]
        if missing:
            raise ShardError(f"the EmbeddingBagCollection sharder does not offer {missing[0]} on {self.topology.compute_device} "
                             f"(offers {', '.join(sorted(offered))}); pass types= without it")

    def _types_allowed(self, stats: Sequence[TableStats]) -> tuple[str, ...]:
        """The types every table's constraints allow (shardkit's search takes one set for the task)."""
        allowed = set(self.types)
        for s in stats:
            con = self.constraints.get(s.name)
            if con is not None and con.sharding_types:
                allowed &= {"column_wise" if t == "table_column_wise" else t for t in con.sharding_types}
        if "table_wise" not in allowed:
            raise ShardError("ShardkitPlanner: the constraints leave no table-wise sharding, which shardkit's starts need")
        return tuple(t for t in ALL_TYPES if t in allowed)

    def _planners(self, precision: str):
        """How a start that is another planner (``starts``: a name of the registry) is built: in a context of
        this planner's ranks, cap and global batch, with that planner's default settings."""
        def build(name: str):
            from shardcore.cli import algorithms
            from shardcore.planning import PlanningContext

            return algorithms.build(name, PlanningContext(ShardTopology(self.world, self.cap_gb(), precision),
                                                          self.global_batch))
        return build

    def plan_json(self, module: nn.Module, sharders: Sequence[ModuleSharder]) -> list[dict]:
        """The plan in :func:`shardcore.interop.plan_export.torchrec_plan_json` form, one dict per collection."""
        if not isinstance(module, nn.Module):
            raise ShardError(f"ShardkitPlanner plans a torch module holding EmbeddingBagCollections, got "
                             f"{type(module).__name__}")
        if not isinstance(sharders, (list, tuple)) or not sharders:
            raise ShardError("ShardkitPlanner: give the sharders as a non-empty list (e.g. [EmbeddingBagCollectionSharder()])")
        self._check_sharders(module, sharders)
        stats = table_stats(module, self.constraints, self.samples, self.global_batch)
        precision = precision_of(cfg for _p, ebc in collections(module) for cfg in ebc.embedding_bag_configs())
        tables = [s.table for s in stats]
        model = _cost_model(self.oracle, self.global_batch, self.comm, self.world, stats)
        note = _precision_check(model, precision)
        model.precision = precision
        sharder = ShardkitSharder(name="shardkit", model=model, time_budget_s=self.time_budget_s,
                                  starts=self.starts, types=self._types_allowed(stats),
                                  planners=self._planners(precision))
        plan, memory, weights_cap = self._plan_within_memory(sharder, tables, precision)
        shardings = plan.shardings
        for s, sh in zip(stats, shardings):
            problem = expressible_problem(sh, self.world)
            if problem:
                raise ShardError(f"TorchRec cannot express table {s.name}'s sharding: {problem}")
        self.last_plan, self.last_stats, self.last_memory = plan, list(stats), memory
        self.last_info = dict(sharder.last_info, precision=precision, cap_gb=self.cap_gb(), weights_cap_gb=weights_cap,
                              optimizer=self.optimizer, memory_gib=[m.gib() for m in memory],
                              global_batch=self.global_batch, comm=model.comm.describe())   # the model's (a card's own)
        if note:
            self.last_info["precision_note"] = note
        out = []
        for path in dict.fromkeys(s.path for s in stats):
            idx = [i for i, s in enumerate(stats) if s.path == path]
            sub = [tables[i] for i in idx]
            sub_plan = Plan(sub, [shardings[i] for i in idx], plan.topology)
            out.append(torchrec_plan_json(sub_plan, [stats[i].name for i in idx], module_path=path))
        return out

    def _plan_within_memory(self, sharder, tables, precision: str) -> tuple[Plan, list[DeviceMemory], float]:
        """shardkit's plan under a weights cap, checked with the memory account (weights, the optimizer's
        state, the I/O buffers at the global batch) against :meth:`cap_gb`; while a rank is over it the task is
        planned again (at most :data:`MEMORY_REPLANS` times) with the weights cap lowered to that rank's weights
        times its memory over its account, else a one-line ``ShardError`` naming the rank and its parts.
        Returns the plan, its account, the weights cap."""
        available = self.cap_gb() * GB
        cap = self.cap_gb()
        over: list = []
        for attempt in range(MEMORY_REPLANS + 1):
            try:
                plan = sharder.shard(tables, ShardTopology(self.world, cap, precision))
            except InfeasibleError:
                if not attempt:
                    raise
                break        # a lower weights cap left no plan: say why below
            memory = device_memory(plan, self.optimizer, self.global_batch)
            over = overflow(memory, available)
            if not over:
                return plan, memory, cap
            # the weights cap that would have kept each rank over it within its memory, were its other parts
            # in proportion to its weights (the optimizer's state is; the buffers nearly)
            cap = min(memory[d].weights * available / memory[d].total for d, _b in over) / GB
        d, _b = max(over, key=lambda x: x[1])
        g = memory[d].gib()
        raise ShardError(f"ShardkitPlanner: rank {d} needs {g['total']:.3f} GiB (weights {g['weights']:.3f}, "
                         f"{self.optimizer} state {g['optimizer']:.3f}, buffers at batch {self.global_batch} "
                         f"{g['buffers']:.3f}), over the {self.cap_gb():.3f} GiB a rank has after the "
                         f"{self.reserve:.0%} reserve, and no plan with less weights per rank was found")

    def from_json(self, objs: Sequence[Mapping], module: nn.Module | None = None) -> ShardingPlan:
        """TorchRec's ``ShardingPlan`` of :meth:`plan_json`'s dicts (placements after ``device_type``)."""
        mods = dict(collections(module)) if module is not None else {}
        merged: dict = {}
        for obj in objs:
            path = obj["module_path"]
            sp = sharding_plan_from_json(obj, device_type=self.device_type, module=mods.get(path),
                                         local_world_size=self.topology.local_world_size)
            merged.update(sp.plan)
        return ShardingPlan(merged)

    # -- TorchRec's interface ----------------------------------------------------------------------
    def plan(self, module: nn.Module, sharders: List[ModuleSharder[nn.Module]]) -> ShardingPlan:
        return self.from_json(self.plan_json(module, sharders), module)

    def collective_plan(self, module: nn.Module, sharders: Optional[List[ModuleSharder[nn.Module]]] = None,
                        pg: Optional[Any] = None) -> ShardingPlan:
        """Plan on the group's rank 0 and broadcast the plan (its JSON form) to every rank."""
        import torch.distributed as dist

        if not dist.is_initialized():
            raise ShardError("collective_plan needs torch.distributed initialised (or call plan() on one rank)")
        if sharders is None:
            from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

            sharders = [EmbeddingBagCollectionSharder()]
        group = pg if pg is not None else dist.GroupMember.WORLD
        src = dist.get_global_rank(group, 0)
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" \
            else torch.device("cpu")
        if dist.get_rank(group) == 0:
            try:
                payload = {"plans": self.plan_json(module, sharders)}
            except ShardError as exc:
                payload = {"error": str(exc)}
            data = torch.tensor(list(json.dumps(payload).encode("utf-8")), dtype=torch.uint8, device=device)
            size = torch.tensor([data.numel()], dtype=torch.int64, device=device)
            dist.broadcast(size, src=src, group=group)
            dist.broadcast(data, src=src, group=group)
        else:
            size = torch.zeros(1, dtype=torch.int64, device=device)
            dist.broadcast(size, src=src, group=group)
            data = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
            dist.broadcast(data, src=src, group=group)
            payload = json.loads(bytes(data.cpu().tolist()).decode("utf-8"))
        if "error" in payload:
            raise ShardError(f"ShardkitPlanner on rank 0: {payload['error']}")
        return self.from_json(payload["plans"], module)
