"""This project's memory account (:mod:`shardcore.interop.memory`) beside TorchRec's own storage estimate
of the same plan, per device.

:func:`torchrec_storage` asks TorchRec's ``EmbeddingStorageEstimator`` (what its planner counts against a
device's HBM) about the plan's own shards: one ``ShardingOption`` per table with the plan's TorchRec
sharding type, kernel, shard sizes and offsets (:func:`shardcore.interop.plan_export.torchrec_plan_json`'s
form; a replica on every rank), TorchRec's per-rank batch (the global batch over the ranks, as
``--alg torchrec`` gives it), the tables' pooling factors, and the optimizer's class on the weight (how
TorchRec learns which optimizer state to count). :func:`compare_memory` puts that estimate beside the
account and says whether the plan fits TorchRec's planner on the same devices: its default reservation
keeps :data:`TORCHREC_DEFAULT_RESERVE` of each device off limits (plus an estimate of the dense model,
which a plan of embedding tables does not know: not counted here). TorchRec is imported only here and
only when installed; without it the comparison says so.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Sequence

from shardcore.errors import ShardError
from shardcore.interop.memory import EXACT_SGD, OPTIMIZER_LABELS, PARTS, DeviceMemory, device_memory, optimizer_name
from shardcore.plan import Plan
from shardcore.tables import GB
from shardcore.topology import MEMORY_TOLERANCE_GB

# TorchRec 1.8's EmbeddingShardingPlanner builds HeuristicalStorageReservation(percentage=0.15) unless told
# otherwise (its heuristical_storage_reservation_percentage default; checked in the tests)
TORCHREC_DEFAULT_RESERVE = 0.15


def _optimizer_class(optimizer: str):
    """The optimizer class TorchRec's storage estimate keys its state multiplier on."""
    import torch
    import torchrec.optim as trec_optim

    return {EXACT_SGD: torch.optim.SGD, "exact_row_wise_adagrad": trec_optim.RowWiseAdagrad,
            "exact_adagrad": torch.optim.Adagrad, "adam": trec_optim.Adam}[optimizer_name(optimizer)]


def torchrec_storage(plan: Plan, batch_size: int, optimizer: str = EXACT_SGD, names: Sequence[str] | None = None,
                     local_world_size: int | None = None, compute_device: str = "cuda") -> list[float]:
    """TorchRec's storage estimate of ``plan`` in bytes per device (HBM on a ``cuda`` device, DDR on a
    ``cpu`` one; see the module notes). ``batch_size``: the global batch."""
    from shardcore.interop.plan_export import _torchrec_shards, torchrec_problem
    from shardcore.interop.torchrec_lib import data_type as _data_type, require_torchrec as _torchrec

    _torchrec()
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.enumerators import get_partition_by_type
    from torchrec.distributed.planner.shard_estimators import EmbeddingStorageEstimator
    from torchrec.distributed.planner.types import KernelConfig, Shard, ShardingOption, TopologyFactory, TrainerConfig
    from torchrec.distributed.planner.utils import build_sharder_data_map, sharder_name

    world, tables, precision = plan.ndevices, plan.tables, plan.topology.precision
    if int(batch_size) < 1:
        raise ShardError(f"TorchRec's storage estimate needs a positive batch, got {batch_size}")
    names = [f"t{i}" for i in range(len(tables))] if names is None else [str(n) for n in names]
    lws = int(local_world_size or world)
    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=n, embedding_dim=t.dim, num_embeddings=t.row,
                                                            feature_names=[n], data_type=_data_type(precision))
                                         for n, t in zip(names, tables)], device=torch.device("meta"))
    cls = _optimizer_class(optimizer)
    topology = TopologyFactory.create_topology(TrainerConfig(world_size=world, local_world_size=lws),
                                               kernel_config=KernelConfig(compute_device=compute_device))
    local_batch = max(1, int(round(int(batch_size) / world)))
    options, ranks = [], []
    for n, t, s in zip(names, tables, plan.shardings):
        why = torchrec_problem(s, world, local_world_size)   # hosts unknown (None): a row-wise subset as written
        if why:
            raise ShardError(f"table {n!r}: TorchRec cannot apply its sharding ({why}), so it has no estimate of it")
        kind, kernel, _ranks, shards = _torchrec_shards(t, s, world)
        if kind == "data_parallel":
            shards = [{"offsets": [0, 0], "sizes": [t.row, t.dim], "rank": r} for r in range(world)]
        weight = ebc.embedding_bags[n].weight
        weight._optimizer_classes = [cls]
        options.append(ShardingOption(name=n, tensor=weight, module=("", ebc), input_lengths=[float(t.pooling_factor)],
                                      batch_size=local_batch, sharding_type=kind, partition_by=get_partition_by_type(kind),
                                      compute_kernel=kernel, is_pooled=True,
                                      shards=[Shard(size=list(x["sizes"]), offset=list(x["offsets"])) for x in shards]))
        ranks.append([int(x["rank"]) for x in shards])
    data = build_sharder_data_map({sharder_name(EmbeddingBagCollection): EmbeddingBagCollectionSharder()})
    EmbeddingStorageEstimator(topology=topology).estimate(options, sharder_data_map=data)
    tier = "hbm" if compute_device in ("cuda", "mtia") else "ddr"
    out = [0.0] * world
    for option, rs in zip(options, ranks):
        for shard, r in zip(option.shards, rs):
            out[r] += float(getattr(shard.storage, tier))
    return out


@dataclass
class MemoryComparison:
    """Per device the account (``memory``) and TorchRec's estimate (``torchrec``, bytes; ``None`` when it
    could not be made: ``why_not`` says why), against a cap of ``cap_gib`` per device."""

    memory: list[DeviceMemory]
    torchrec: list[float] | None
    cap_gib: float
    optimizer: str
    precision: str
    batch_size: int | None
    why_not: str | None = None
    labels: list = field(default_factory=list)

    def table(self) -> tuple[list[str], list[list[str]]]:
        """``(header, rows)``: per device its parts, its total and TorchRec's estimate, in GiB."""
        header = ["device"] + [f"{p} GiB" for p in PARTS] + ["total GiB", "TorchRec's estimate GiB", "TorchRec - total"]
        rows = []
        for d, m in enumerate(self.memory):
            g = m.gib()
            label = self.labels[d] if d < len(self.labels) else d
            tr = self.torchrec[d] / GB if self.torchrec is not None else None
            rows.append([str(label)] + [f"{g[p]:.3f}" if p != "buffers" or self.batch_size else "-" for p in PARTS]
                        + [f"{g['total']:.3f}", "-" if tr is None else f"{tr:.3f}",
                           "-" if tr is None else f"{tr - g['total']:+.3f}"])
        return header, rows

    def text(self, format_table) -> str:
        """The heading, the table (``format_table(header, rows)``, the caller's table style) and the verdicts."""
        notes = self.notes()
        return "\n".join([notes[0], format_table(*self.table())] + notes[1:])

    def notes(self) -> list[str]:
        """What the table means and the verdicts: the account against the cap, TorchRec's estimate against
        what its planner would leave for tables on devices of that cap."""
        out = [f"memory per device: this project's account (weights in {self.precision}, {OPTIMIZER_LABELS[self.optimizer]}, "
               + (f"I/O buffers at batch {self.batch_size}" if self.batch_size else "no I/O buffers: the batch is not known")
               + ") beside TorchRec's storage estimate of the same shards"]
        over = [(d, m.total / GB) for d, m in enumerate(self.memory) if m.total / GB > self.cap_gib + MEMORY_TOLERANCE_GB]
        out.append(f"account: every device within the {self.cap_gib:g} GiB cap" if not over else
                   "account: over the {:g} GiB cap on device(s) {} (the cap counts weights; the account adds "
                   "optimizer state and buffers)".format(self.cap_gib, ", ".join(f"{d} ({v:.3f} GiB)" for d, v in over)))
        if self.torchrec is None:
            out.append(f"TorchRec's estimate: not made ({self.why_not})")
            return out
        limit = self.cap_gib * (1.0 - TORCHREC_DEFAULT_RESERVE)
        bad = [(d, v / GB) for d, v in enumerate(self.torchrec) if v / GB > limit + MEMORY_TOLERANCE_GB]
        head = (f"TorchRec's planner on devices of {self.cap_gib:g} GiB keeps {TORCHREC_DEFAULT_RESERVE:.0%} off "
                f"limits by default (and an estimate of the dense model): {limit:.3f} GiB for tables")
        out.append(head + (": its estimate fits on every device" if not bad else
                           "; its estimate exceeds that on device(s) " + ", ".join(
                               f"{d} ({v:.3f} GiB, {v - limit:+.3f})" for d, v in bad)))
        return out


def compare_memory(plan: Plan, batch_size: int | None, optimizer: str = EXACT_SGD, names: Sequence[str] | None = None,
                   local_world_size: int | None = None, labels: Sequence | None = None) -> MemoryComparison:
    """The account and TorchRec's estimate of ``plan`` (module notes); TorchRec's only where it is installed,
    the batch is known and TorchRec can apply the plan."""
    optimizer = optimizer_name(optimizer)
    memory = device_memory(plan, optimizer, batch_size)
    torchrec, why = None, None
    if batch_size is None:
        why = "it counts the batch's buffers and the batch is not known: give --batch-size"
    elif importlib.util.find_spec("torchrec") is None:
        why = "TorchRec is not installed"
    else:
        try:
            torchrec = torchrec_storage(plan, int(batch_size), optimizer, names, local_world_size)
        except ShardError as exc:
            why = str(exc)
    return MemoryComparison(memory, torchrec, plan.topology.max_memory_gb, optimizer, plan.topology.precision,
                            int(batch_size) if batch_size else None, why, list(labels or []))
