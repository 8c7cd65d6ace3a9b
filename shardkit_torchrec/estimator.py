"""``EmulatedPerfEstimator``: a TorchRec ``ShardEstimator`` whose per-shard ``Perf`` comes from this
project's emulated H200 (compute) and exchange model (communication), so that TorchRec's own
``EmbeddingShardingPlanner`` plans with them::

    planner = EmbeddingShardingPlanner(topology=topology, batch_size=batch, constraints=constraints,
                                       enumerator=EmbeddingEnumerator(topology=topology, batch_size=batch,
                                           constraints=constraints,
                                           estimator=[EmulatedPerfEstimator(topology, constraints),
                                                      EmbeddingStorageEstimator(topology, constraints)]))

**A shard as shardkit sees it.** Every shard of a sharding option becomes a piece
(:class:`~shardcore.plan.ShardPiece`, what :meth:`shardcore.plan.Sharding.pieces` gives our own plans):
a table-wise table or column block is a table of the shard's rows and columns with the table's lookups;
a row-wise (or table-row-wise, or grid) block holds the lookups in proportion to its rows; a
data-parallel replica looks up its rank's slice of the batch (the pooling factor over the world size).
The batch is the global one: the option's per-rank ``batch_size`` times the world size.

**Compute** (``fwd_compute``, ``bwd_compute``): the emulator's prediction for the piece as a shard of its
own (:meth:`shardcore.oracles.emulated.emulator.GpuComputeModel.predict_many`, one batched call for all options).
TorchRec adds the shards of a rank; the emulator prices a rank's tables as one fused kernel, so the
sum over a rank counts the per-kernel constant once per table (a few microseconds each at batch 65536):
the one place this estimate differs from the emulated oracle's compute.

**Communication** (``fwd_comms``, ``bwd_comms``): the bytes the piece adds to its rank's side of the
exchanges the emulated oracle prices (:meth:`shardcore.oracles.commmodel.CommModel.exchange_ms`), over the
bandwidth: the pooled outputs it sends to the other ranks' samples, ``4 x width x (B - B/n)`` in both
phases (:func:`~shardcore.oracles.commmodel.pooled_width`: none for a replica); forward, a row-wise block's
id all-to-all, ``8 x (B - B/n) x (ids per sample + 1)`` (:func:`~shardcore.oracles.commmodel.id_width`);
backward, a replica's gradient all-reduce (:func:`~shardcore.oracles.commmodel.allreduce_bytes`). These add
up over a rank's shards exactly as the oracle's byte counts do (its sent side); the per-collective
latency is left out, since a sum over shards would count it once per shard (it is the same constant on
every rank that exchanges anything).

**Ties.** TorchRec enumerates each table's sharding types and compute kernels in the order of a Python
``set`` of their names (``EmbeddingEnumerator``), which changes with the process's string hash seed, and
where two options cost the same its proposers keep the first: the emulator prices the ``fused`` and ``dense``
kernels of a type alike, so without more the plan changed from one process to the next (the honest-margin
records' ``torchrec-emu``, 2026-11-28: DLRM-50 task 4 at 3.360 or 4.043 ms by ``PYTHONHASHSEED``). Each
option's forward compute therefore carries a tie-break of :data:`TIE_BREAK_MS` (a femtosecond per step)
times its rank in a fixed order of types (:data:`TYPE_ORDER`) and kernels (:data:`KERNEL_ORDER`: ``fused``
first, the kernel the emulator models, then by name): equal options are ordered the same way in every
process.

**Table statistics.** A sharding option names its table and gives its pooling factor
(``input_lengths``, from ``ParameterConstraints``); ``tables`` (``{table name: TableConfig}``, e.g.
from :func:`shardkit_torchrec.stats.table_stats`) adds the reuse histogram and the pooling factor
measured on samples, ``length_cv`` (``{name: CV}``) the bag-length dispersion; a table without them
has no reuse information (every lookup a distinct row) and the emulator's default CV.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

import numpy as np
import torch
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner.types import ParameterConstraints, Perf, ShardEstimator, ShardingOption, Topology

from shardcore.oracles.commmodel import ID_ELEMENT_SIZE, CommModel, allreduce_bytes, id_width, pooled_width
from shardcore.types import OUTPUT_ELEMENT_SIZE
from shardcore.oracles.emulated.emulator import load_gpu_model
from shardcore.errors import ShardError
from shardcore.plan import DATA_PARALLEL, ROW_WISE, ShardPiece
from shardcore.tables import TableConfig

WHOLE_ROW_TYPES = ("table_wise", "column_wise", "table_column_wise")
ROW_BLOCK_TYPES = ("row_wise", "table_row_wise", "grid_shard")
TYPE_ORDER = WHOLE_ROW_TYPES + ROW_BLOCK_TYPES + ("data_parallel",)
TIE_BREAK_MS = 1e-12    # per step of the tie-break order (module notes, "Ties"): far below any cost's precision
# compute kernels: fused first (the kernel the emulator models), then TorchRec's others by name
KERNEL_ORDER = ("fused",) + tuple(sorted(k.value for k in EmbeddingComputeKernel if k.value != "fused"))


def tie_break_ms(option: ShardingOption) -> float:
    """The option's tie-break (module notes, "Ties"): :data:`TIE_BREAK_MS` times its rank, by sharding type
    (:data:`TYPE_ORDER`, an unknown one last) and then compute kernel (:data:`KERNEL_ORDER`, an unknown one
    last)."""
    kind, kernel = str(option.sharding_type), str(option.compute_kernel)
    t = TYPE_ORDER.index(kind) if kind in TYPE_ORDER else len(TYPE_ORDER)
    k = KERNEL_ORDER.index(kernel) if kernel in KERNEL_ORDER else len(KERNEL_ORDER)
    return TIE_BREAK_MS * (t * (len(KERNEL_ORDER) + 1) + k)


def option_pieces(option: ShardingOption, table: TableConfig, world: int) -> list[TableConfig | None]:
    """The piece of every shard of ``option`` (``None`` for a shard of no rows)."""
    kind = str(option.sharding_type)
    out: list[TableConfig | None] = []
    for j, shard in enumerate(option.shards):
        rows, cols = int(shard.size[0]), int(shard.size[1])
        if rows == 0 or cols == 0:
            out.append(None)
        elif kind in WHOLE_ROW_TYPES:
            out.append(TableConfig(table.index, rows, cols, table.pooling_factor, table.bins))
        elif kind in ROW_BLOCK_TYPES:
            out.append(ShardPiece(table.index, rows, cols, table.pooling_factor * rows / table.row, table.bins,
                                  kind=ROW_WISE, row_start=int(shard.offset[0]), full_row=table.row))
        elif kind == "data_parallel":
            out.append(ShardPiece(table.index, rows, cols, table.pooling_factor / world, table.bins,
                                  kind=DATA_PARALLEL, full_row=table.row, batch_part=(j, world)))
        else:
            raise ShardError(f"EmulatedPerfEstimator: table {option.name} has sharding type {kind}, which the "
                             "emulated H200 has no model of")
    return out


def shard_comm_bytes(piece: TableConfig, batch_size: int, world: int, precision: str) -> tuple[float, float]:
    """``(forward, backward)`` bytes the piece adds to its rank's side of the exchanges (module notes)."""
    if world < 2:
        return 0.0, 0.0
    others = batch_size - batch_size / world
    pooled = OUTPUT_ELEMENT_SIZE * pooled_width(piece) * others
    ids = ID_ELEMENT_SIZE * others * id_width(piece)
    return pooled + ids, pooled + allreduce_bytes(piece, world, precision)


class EmulatedPerfEstimator(ShardEstimator):
    """Fills every shard's ``Perf`` from the emulated GPU and the exchange model (module notes).

    ``comm``: the exchange model (default :class:`~shardcore.oracles.commmodel.CommModel`'s stated constants, the
    emulated oracle's); ``card``: the emulated GPU (``h200``); ``tables`` / ``length_cv``: per table
    name, the statistics TorchRec's options do not carry."""

    def __init__(self, topology: Topology, constraints: Optional[Dict[str, ParameterConstraints]] = None,
                 comm: CommModel | None = None, card: str = "h200",
                 tables: Mapping[str, TableConfig] | None = None,
                 length_cv: Mapping[str, float] | None = None) -> None:
        self._topology = topology
        self._constraints = constraints
        self.comm = comm or CommModel()
        self.model = load_gpu_model(card)
        self.tables = dict(tables or {})
        self.length_cv = dict(length_cv or {})

    def _table(self, option: ShardingOption) -> TableConfig:
        rows, dim = (int(x) for x in option.tensor.shape)
        t = self.tables.get(option.name)
        if t is not None:
            if (t.row, t.dim) != (rows, dim):
                raise ShardError(f"EmulatedPerfEstimator: table {option.name} is {rows} x {dim} in the model but "
                                 f"{t.row} x {t.dim} in the statistics given")
            return t
        return TableConfig(-1, rows, dim, float(sum(option.input_lengths)))

    def estimate(self, sharding_options: List[ShardingOption], sharder_data_map: Any = None) -> None:
        world = self._topology.world_size
        todo: dict[int, list[tuple[Any, TableConfig, float]]] = {}   # global batch -> (shard, piece, cv)
        for option in sharding_options:
            table = self._table(option)
            batch = int(option.batch_size) * world
            precision = "fp16" if option.tensor.dtype == torch.float16 else "fp32"
            cv = self.length_cv.get(option.name)
            cv = self.model.table_cv(table) if cv is None else float(cv)
            tie = tie_break_ms(option)
            for shard, piece in zip(option.shards, option_pieces(option, table, world)):
                if piece is None:
                    shard.perf = Perf(fwd_compute=0.0, fwd_comms=0.0, bwd_compute=0.0, bwd_comms=0.0)
                    continue
                fw_b, bw_b = shard_comm_bytes(piece, batch, world, precision)
                per_ms = self.comm.bandwidth_gbps * 1e6          # bytes per ms
                shard.perf = Perf(fwd_compute=0.0, fwd_comms=fw_b / per_ms, bwd_compute=0.0, bwd_comms=bw_b / per_ms)
                todo.setdefault(batch, []).append((shard, piece, cv, tie))
        for batch, items in todo.items():
            pred = self.model.predict_many([[p] for _s, p, _c, _t in items], batch,
                                           length_cv=[[c] for _s, _p, c, _t in items])
            for (shard, _p, _c, tie), (fw, bw) in zip(items, np.asarray(pred)):
                shard.perf.fwd_compute = float(fw) + tie
                shard.perf.bwd_compute = float(bw)

