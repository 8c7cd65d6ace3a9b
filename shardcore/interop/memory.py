"""What a plan needs in each device's memory when it trains under TorchRec and FBGEMM, stated once.

Per device, the sum over the pieces it holds (:meth:`shardcore.plan.Sharding.pieces`: a table-wise
table, a column block, a row block, a data-parallel replica), in three parts:

* **weights**: rows x dim x the weights' bytes (fp16 2, fp32 4), what every planner's cap here counts
  (:meth:`shardcore.plan.Plan.device_memory_gb`);
* **optimizer state**, as FBGEMM's fused optimizers keep it (``SplitTableBatchedEmbeddingBagsCodegen``:
  ``momentum1`` / ``momentum2`` are fp32 whatever the weights' precision): exact SGD none; exact
  row-wise Adagrad one fp32 per row; exact Adagrad one fp32 per weight; Adam two fp32 per weight;
* **I/O buffers at the batch**: the pooled outputs the piece writes (its samples x its dim, fp32, the
  :data:`~shardcore.types.OUTPUT_ELEMENT_SIZE` the exchange sends) and their gradients (as many again),
  and its input: int64 ids, one per lookup, plus one int64 length per sample. A table-wise table, a
  column block and a row block serve every sample of the global batch (a row block's partial sums
  too), a row block the lookups that fall in its rows (the table's pooling factor x its row share); a
  replica serves its slice of the batch (:func:`shardcore.plan.batch_slices`).

TorchRec's ``EmbeddingStorageEstimator`` counts the same weights, the optimizer state as a multiple of
the weights' bytes (Adam 2x, Adagrad 1x: equal to this account for fp32 weights, half of it for fp16;
row-wise Adagrad 1/dim of the table's dim, which splits a row's state over its column blocks where
FBGEMM keeps one in every block) and, while training, the input ids and the pooled outputs in the
weights' precision (not their gradients): this account is never below TorchRec's per device for the
fused and dense kernels.
TorchRec's planner also keeps part of every device off limits (its default ``HeuristicalStorageReservation``:
15% plus an estimate of the dense model), which this account leaves to the cap it is compared with.
TorchRec's planner package sets the two side by side (its storage estimate). No TorchRec needed here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from shardcore.errors import ShardError
from shardcore.plan import DATA_PARALLEL, Plan, batch_slices
from shardcore.tables import GB, TableConfig, bytes_per_element
from shardcore.types import OUTPUT_ELEMENT_SIZE

ID_BYTES = 8            # FBGEMM takes int64 ids (TorchRec's planner counts 8 bytes too)
STATE_BYTES = 4         # FBGEMM's optimizer states are fp32
EXACT_SGD = "exact_sgd"
# optimizer -> (fp32 states per weight, fp32 states per row)
OPTIMIZER_STATE = {EXACT_SGD: (0, 0), "exact_row_wise_adagrad": (0, 1), "exact_adagrad": (1, 0), "adam": (2, 0)}
_ALIASES = {"sgd": EXACT_SGD, "row_wise_adagrad": "exact_row_wise_adagrad", "rowwise_adagrad": "exact_row_wise_adagrad",
            "exact_rowwise_adagrad": "exact_row_wise_adagrad", "adagrad": "exact_adagrad"}
OPTIMIZER_LABELS = {EXACT_SGD: "exact SGD (no optimizer state)",
                    "exact_row_wise_adagrad": "row-wise Adagrad (one fp32 state per row)",
                    "exact_adagrad": "Adagrad (one fp32 state per weight)", "adam": "Adam (two fp32 states per weight)"}
PARTS = ("weights", "optimizer", "buffers")


def optimizer_name(name: str) -> str:
    """The canonical name of an optimizer this account knows (one-line :class:`ShardError` otherwise)."""
    key = str(name).strip().lower().replace("-", "_")
    key = _ALIASES.get(key, key)
    if key not in OPTIMIZER_STATE:
        raise ShardError(f"unknown optimizer {name!r} for the memory account: choose one of {', '.join(OPTIMIZER_STATE)}")
    return key


@dataclass(frozen=True)
class DeviceMemory:
    """One device's memory in bytes by part (:data:`PARTS`)."""

    weights: float = 0.0
    optimizer: float = 0.0
    buffers: float = 0.0

    @property
    def total(self) -> float:
        return self.weights + self.optimizer + self.buffers

    def gib(self) -> dict:
        """The parts and the total in GiB (2^30 bytes)."""
        return {**{p: getattr(self, p) / GB for p in PARTS}, "total": self.total / GB}

    def __add__(self, other: "DeviceMemory") -> "DeviceMemory":
        return DeviceMemory(self.weights + other.weights, self.optimizer + other.optimizer,
                            self.buffers + other.buffers)


def piece_memory(piece: TableConfig, precision: str, optimizer: str = EXACT_SGD,
                 batch_size: int | None = None) -> DeviceMemory:
    """One piece's memory (module notes). ``batch_size``: the global batch; ``None`` leaves the buffers
    out (0). A row block's ``pooling_factor`` is already its share of the table's lookups, as
    :meth:`~shardcore.plan.Sharding.pieces` gives it."""
    per_weight, per_row = OPTIMIZER_STATE[optimizer_name(optimizer)]
    weights = float(piece.row) * piece.dim * bytes_per_element(precision)
    state = STATE_BYTES * (float(per_weight) * piece.row * piece.dim + float(per_row) * piece.row)
    buffers = 0.0
    if batch_size is not None:
        kind = getattr(piece, "kind", None)
        part = getattr(piece, "batch_part", None)
        samples = batch_slices(int(batch_size), part[1])[part[0]] if kind == DATA_PARALLEL and part else int(batch_size)
        lookups = samples * float(piece.pooling_factor)
        buffers = 2.0 * OUTPUT_ELEMENT_SIZE * samples * piece.dim + ID_BYTES * (lookups + samples)
    return DeviceMemory(weights, state, buffers)


def device_memory(plan: Plan, optimizer: str = EXACT_SGD, batch_size: int | None = None) -> list[DeviceMemory]:
    """Every device's memory by part for ``plan`` (module notes), its weights at the plan's precision."""
    optimizer = optimizer_name(optimizer)
    if batch_size is not None and int(batch_size) < 1:
        raise ShardError(f"the memory account needs a positive batch, got {batch_size}")
    out = [DeviceMemory() for _ in range(plan.ndevices)]
    precision = plan.topology.precision
    for t, s in zip(plan.tables, plan.shardings):
        for d, piece in s.pieces(t, plan.ndevices):
            out[d] = out[d] + piece_memory(piece, precision, optimizer, batch_size)
    return out


def overflow(memory: Sequence[DeviceMemory], available_bytes: float) -> list[tuple[int, float]]:
    """``(device, bytes over)`` of every device whose total exceeds ``available_bytes``."""
    return [(d, m.total - available_bytes) for d, m in enumerate(memory) if m.total > available_bytes]

