"""A model of the embedding all-to-alls, for when they cannot be measured as they would run.

A plan for ``n`` devices exchanges, per device ``d``, its pooled outputs for every other device's
slice of the batch (forward) and the gradients back (backward); the split sizes are
:func:`comm_splits`. When the plan has more devices than the machine has GPUs
(``--ndevices 8 --gpu-devices 0``), or the oracle is emulated, that exchange cannot be timed, and
its cost comes from this model instead:

    t_d = latency + max(bytes d sends to others, bytes d receives from others) / bandwidth

for each of the two phases (the all-to-all ends when a device's slowest direction has moved its
bytes; each direction of a full-duplex link runs at ``bandwidth``). Bytes are those of fp32 pooled
outputs (4 per element), as the real exchange.

**A training step's other two collectives**, for every sharding type (:mod:`shardcore.plan`'s
pieces), as the measured evaluator runs them (:mod:`shardcore.oracles.measured.shardings`); where they are modelled
from the tables alone (the emulated oracle, shardkit's planner), :meth:`CommModel.exchange_ms`
prices them with the same constants, one latency each (the one convention every oracle and model
uses):

* forward, the **input-id all-to-all**: every device reads its batch slice's samples, and sends
  every device that holds a model-parallel piece of a table that slice's ids of the table, plus one
  length per sample (int64, 8 bytes each): a table-wise table's holder all the table's ids, every
  column block's holder all of them too (each block needs every id), a row-wise block's holder the
  ids in its rows; a data-parallel replica's ids stay home. A piece's *id width*
  (:func:`id_width`) is the int64 elements per sample it adds to its holder: its expected ids per
  sample (its ``pooling_factor``: the table's, for a row-wise block times its row share) plus the
  one length, 0 for a replica. With ``P_d`` the sum of device ``d``'s id widths, ``d`` receives
  ``8 (B - B_d) P_d`` bytes and sends ``8 B_d (sum_j P_j - P_d)`` (:func:`id_bytes`): the
  all-to-all of :func:`remote_bytes` with the directions swapped, the ids expected rather than
  counted from ``data.pt``;
* backward, the **data-parallel gradient all-reduce**: a ring, ``2 (n - 1) / n x rows x dim`` elements
  of the weights' precision (:func:`allreduce_bytes`), on every device (each holds a replica); a
  replica sends no pooled outputs (:func:`pooled_width` is 0: its device computes its own slice, in
  a kernel of its own over that slice, :func:`shardcore.plan.device_kernels`).

**Defaults** (flags ``--comm-bandwidth`` and ``--comm-latency`` change them): 200 GB/s per device
and direction, 25 us per collective. They stand for NVLink 4 between the GPUs of one 8-GPU
H100/H200 (HGX) node: 450 GB/s per GPU per direction nominal, of which an NCCL all-to-all achieves
roughly half once the NVSwitch hops, protocol and kernel overheads are counted; 25 us is the order of
a small NCCL collective's start-up. These are stated assumptions, not measurements of this project;
a run with two or more real GPUs replaces them by a fit of the measured exchange
(:func:`fit_comm_model`), and every record says which (``parts``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from shardcore.errors import ShardError
from shardcore.plan import DATA_PARALLEL, batch_slices  # noqa: F401  (batch_slices: re-exported)
from shardcore.tables import TableConfig, bytes_per_element
from shardcore.types import CommSplits

DEFAULT_COMM_BANDWIDTH_GBPS = 200.0
DEFAULT_COMM_LATENCY_US = 25.0
DEFAULT_LINK = "NVLink 4 within one 8-GPU H100/H200 node (assumed)"
OUTPUT_ELEMENT_SIZE = 4
ID_ELEMENT_SIZE = 8        # the input distribution's int64 ids and per-sample lengths
PIECES_NOTE = ("input-id all-to-all of every model-parallel table (ids expected from the tables' pooling "
               "factors) and data-parallel gradient all-reduce (ring) modelled with the same constants")


def remote_bytes(dim_sums: Sequence[int], batch_size: int) -> list[tuple[int, int]]:
    """Per device ``(bytes sent to others, bytes received from others)`` of the forward exchange
    (the backward exchange moves the same amounts the other way)."""
    n = len(dim_sums)
    bs = batch_slices(batch_size, n)
    total_dim = sum(int(x) for x in dim_sums)
    out = []
    for d in range(n):
        own = int(dim_sums[d])
        sent = own * (batch_size - bs[d])            # my outputs for everyone else's samples
        recv = bs[d] * (total_dim - own)             # everyone else's outputs for my samples
        out.append((OUTPUT_ELEMENT_SIZE * sent, OUTPUT_ELEMENT_SIZE * recv))
    return out


def pooled_width(t: TableConfig) -> int:
    """Width a piece adds to its device's pooled outputs: its dim, none for a data-parallel replica."""
    return 0 if getattr(t, "kind", None) == DATA_PARALLEL else int(t.dim)


def id_width(t: TableConfig) -> float:
    """int64 elements per sample a piece adds to its holder in the input-id all-to-all: its expected
    ids (its ``pooling_factor``: a table-wise table's or column block's the table's, a row-wise
    block's the table's times its row share) plus one length; 0 for a data-parallel replica."""
    return 0.0 if getattr(t, "kind", None) == DATA_PARALLEL else float(t.pooling_factor) + 1.0


def allreduce_bytes(t: TableConfig, ndevices: int, precision: str = "fp16") -> float:
    """Bytes a data-parallel replica's ring all-reduce moves per device (``2 (n-1)/n x rows x dim`` in
    the weights' precision, the dense gradient's dtype); 0 for other pieces or one device."""
    if getattr(t, "kind", None) != DATA_PARALLEL or ndevices < 2:
        return 0.0
    return 2.0 * (ndevices - 1) / ndevices * t.row * t.dim * bytes_per_element(precision)


def id_bytes(id_widths, batch_size: int):
    """Per device ``(bytes sent, bytes received)`` of the input-id all-to-all, ``id_widths[..., d]``
    the sum of device ``d``'s :func:`id_width` (numpy arrays, devices on the last axis)."""
    import numpy as np

    w = np.asarray(id_widths, dtype=float)
    slices = np.asarray(batch_slices(batch_size, w.shape[-1]), dtype=float)
    total = w.sum(axis=-1, keepdims=True)
    sent = ID_ELEMENT_SIZE * slices * (total - w)             # my slice's ids for every other holder
    recv = ID_ELEMENT_SIZE * (batch_size - slices) * w        # the others' ids in my rows
    return sent, recv


@dataclass(frozen=True)
class CommModel:
    """``latency_us + max(sent, received) / bandwidth`` per device and phase (see the module notes)."""

    bandwidth_gbps: float = DEFAULT_COMM_BANDWIDTH_GBPS
    latency_us: float = DEFAULT_COMM_LATENCY_US
    link: str = DEFAULT_LINK
    source: str = "analytic"   # "analytic" (stated constants) or "fitted" (from measured exchanges)

    def __post_init__(self):
        import math

        if not (math.isfinite(self.bandwidth_gbps) and self.bandwidth_gbps > 0):
            raise ShardError(f"communication bandwidth must be a positive number of GB/s, got {self.bandwidth_gbps}")
        if not (math.isfinite(self.latency_us) and self.latency_us >= 0):
            raise ShardError(f"communication latency must be a non-negative number of us, got {self.latency_us}")

    def phase_ms(self, nbytes: int) -> float:
        if nbytes <= 0:
            return 0.0
        return self.latency_us * 1e-3 + nbytes / (self.bandwidth_gbps * 1e9) * 1e3

    def predict(self, dim_sums: Sequence[int], batch_size: int) -> list[tuple[float, float]]:
        """Per device ``(fw_ms, bw_ms)`` of the two all-to-alls."""
        if len(dim_sums) < 2:
            return [(0.0, 0.0)] * len(dim_sums)
        out = []
        for sent, recv in remote_bytes(dim_sums, batch_size):
            t = self.phase_ms(max(sent, recv))
            out.append((t, t))
        return out

    def _phase(self, nbytes):
        """:meth:`phase_ms` of an array of byte counts."""
        import numpy as np

        nbytes = np.asarray(nbytes, dtype=float)
        return np.where(nbytes > 0, self.latency_us * 1e-3 + nbytes / (self.bandwidth_gbps * 1e9) * 1e3, 0.0)

    def exchange_ms(self, pooled_widths, batch_size: int, id_widths=None, backward_bytes=None):
        """``(fw_ms, bw_ms)`` arrays of a plan's exchanges per device (devices on the last axis; leading
        axes: candidate plans), the one place they are priced from widths (see the module notes):

        - both phases: the pooled all-to-all of ``pooled_widths`` (:func:`pooled_width` sums);
        - forward: the input-id all-to-all of ``id_widths`` (:func:`id_width` sums), one latency;
        - backward: ``backward_bytes`` per device in one more collective (the data-parallel
          all-reduce, :func:`allreduce_bytes` sums), one latency.

        One device: nothing is exchanged."""
        import numpy as np

        dims = np.asarray(pooled_widths, dtype=float)
        n = dims.shape[-1]
        if n < 2:
            return np.zeros(dims.shape), np.zeros(dims.shape)
        slices = np.asarray(batch_slices(batch_size, n), dtype=float)
        total = dims.sum(axis=-1, keepdims=True)
        sent = OUTPUT_ELEMENT_SIZE * dims * (batch_size - slices)
        recv = OUTPUT_ELEMENT_SIZE * slices * (total - dims)
        pooled = self._phase(np.maximum(sent, recv))
        fw, bw = pooled, pooled
        if id_widths is not None:
            fw = fw + self._phase(np.maximum(*id_bytes(np.broadcast_to(id_widths, dims.shape), batch_size)))
        if backward_bytes is not None:
            bw = bw + self._phase(np.broadcast_to(np.asarray(backward_bytes, dtype=float), dims.shape))
        return fw, bw

    def describe(self) -> str:
        how = "fitted to measured all-to-alls" if self.source == "fitted" else "analytic"
        return (f"modelled ({how}: {self.latency_us:.1f} us + bytes / {self.bandwidth_gbps:.1f} GB/s; "
                f"{self.link})")

    def to_json(self) -> dict:
        return {"bandwidth_gbps": self.bandwidth_gbps, "latency_us": self.latency_us, "link": self.link,
                "source": self.source}


def fit_comm_model(samples: Sequence[tuple[int, float]], link: str) -> CommModel:
    """Least-squares fit of ``t_ms = latency + bytes / bandwidth`` to measured ``(bytes, ms)`` pairs
    (the per-device maximum of bytes sent and received, and that device's measured time).

    Needs at least two distinct byte counts; a non-positive slope or intercept is clipped (a
    bandwidth cannot be infinite: the slope floor is 1e-9 ms per byte, 1000 GB/s)."""
    import numpy as np

    pts = [(float(b), float(t)) for b, t in samples if b > 0]
    if len({b for b, _ in pts}) < 2:
        raise ShardError("fitting the all-to-all model needs measurements at two or more sizes")
    x = np.array([b for b, _ in pts])
    y = np.array([t for _, t in pts])
    a = np.stack([np.ones_like(x), x], axis=1)
    (intercept, slope), *_ = np.linalg.lstsq(a, y, rcond=None)
    slope = max(float(slope), 1e-9)
    intercept = max(float(intercept), 0.0)
    return CommModel(bandwidth_gbps=1e-6 / slope, latency_us=intercept * 1e3, link=link, source="fitted")


def comm_splits(dim_sums: Sequence[int], batch_size: int, device: int) -> CommSplits:
    """The all-to-all split sizes of ``device`` when device ``d`` holds tables of total dim ``dim_sums[d]``."""
    n = len(dim_sums)
    bs = batch_slices(batch_size, n)
    own = int(dim_sums[device])
    fw_send = tuple(bs[j] * own for j in range(n))
    fw_recv = tuple(bs[device] * int(dim_sums[d]) for d in range(n))
    return CommSplits(device, fw_send, fw_recv, bw_send=fw_recv, bw_recv=fw_send)
