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

**Past one host** (``CommModel(devices_per_host=G)``, the first step of the multi-host issue): devices
form hosts of G, and each exchange is priced on two levels at once (:func:`host_bytes`): within a host
at the link above, between hosts at ``inter_bandwidth_gbps`` (default 50 GB/s per GPU and direction:
8 x 400 Gb/s NICs per 8-GPU host, assumed) plus ``inter_latency_us`` (50 us, assumed); a data-parallel
all-reduce hierarchically. No command-line flag sets G yet: the planners' own topologies (TorchRec's
``local_world_size`` and ``inter_host_bw``, shardkit's model) must learn it in the same change, so
that no comparison judges plans on hosts their planners did not know.
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


def host_bytes(widths, batch_size: int, devices_per_host: int, element: int):
    """The all-to-all of per-sample ``widths`` (devices on the last axis) split by level: per device
    ``((sent, received) to and from devices of its own host, (sent, received) to and from other hosts)``,
    bytes of ``element`` each; device ``d`` is on host ``d // devices_per_host``. ``d`` sends its
    columns for every other device's batch slice and receives theirs for its own slice, as
    :func:`remote_bytes` (whose totals are the two levels' sums)."""
    import numpy as np

    w = np.asarray(widths, dtype=float)
    n = w.shape[-1]
    g = int(devices_per_host)
    slices = np.asarray(batch_slices(batch_size, n), dtype=float)
    hosts = np.arange(n) // g
    same = (hosts[:, None] == hosts[None, :]).astype(float)           # [d, j]: on one host
    host_slices = same @ slices                                       # samples on d's host, d's included
    host_width = w @ same                                             # widths on d's host, d's included
    total = w.sum(axis=-1, keepdims=True)
    intra = (element * w * (host_slices - slices), element * slices * (host_width - w))
    inter = (element * w * (batch_size - host_slices), element * slices * (total - host_width))
    return intra, inter


DEFAULT_INTER_HOST_BANDWIDTH_GBPS = 50.0   # 8 x 400 Gb/s NICs per 8-GPU host, per GPU and direction (assumed)
DEFAULT_INTER_HOST_LATENCY_US = 50.0       # a collective's start-up across hosts (assumed)
DEFAULT_INTER_HOST_LINK = "8 x 400 Gb/s NICs per 8-GPU host: 50 GB/s per GPU between hosts (assumed)"


@dataclass(frozen=True)
class CommModel:
    """``latency_us + max(sent, received) / bandwidth`` per device and phase (see the module notes).

    With ``devices_per_host`` G (0: every device on one host) and more than G devices, the devices form
    hosts of G (device ``d`` on host ``d // G``): the bytes a device exchanges with its own host's
    devices move at ``bandwidth_gbps`` + ``latency_us``, those with other hosts at
    ``inter_bandwidth_gbps`` + ``inter_latency_us`` (its network share), both at once; a phase ends when
    the slower level has (:func:`host_bytes`). A data-parallel all-reduce runs hierarchically: a
    reduce-scatter and all-gather within the host (``2 (G - 1) / G`` of the gradient) and, on its
    ``1 / G`` share, a ring across the H hosts (``2 (H - 1) / H``), one after the other."""

    bandwidth_gbps: float = DEFAULT_COMM_BANDWIDTH_GBPS
    latency_us: float = DEFAULT_COMM_LATENCY_US
    link: str = DEFAULT_LINK
    source: str = "analytic"   # "analytic" (stated constants) or "fitted" (from measured exchanges)
    devices_per_host: int = 0
    inter_bandwidth_gbps: float = DEFAULT_INTER_HOST_BANDWIDTH_GBPS
    inter_latency_us: float = DEFAULT_INTER_HOST_LATENCY_US

    def __post_init__(self):
        import math

        if not (math.isfinite(self.bandwidth_gbps) and self.bandwidth_gbps > 0):
            raise ShardError(f"communication bandwidth must be a positive number of GB/s, got {self.bandwidth_gbps}")
        if not (math.isfinite(self.latency_us) and self.latency_us >= 0):
            raise ShardError(f"communication latency must be a non-negative number of us, got {self.latency_us}")
        if not (math.isfinite(self.inter_bandwidth_gbps) and self.inter_bandwidth_gbps > 0):
            raise ShardError(f"inter-host bandwidth must be a positive number of GB/s, got {self.inter_bandwidth_gbps}")
        if not (math.isfinite(self.inter_latency_us) and self.inter_latency_us >= 0):
            raise ShardError(f"inter-host latency must be a non-negative number of us, got {self.inter_latency_us}")
        if isinstance(self.devices_per_host, bool) or not isinstance(self.devices_per_host, int) \
                or self.devices_per_host < 0:
            raise ShardError(f"devices per host must be a whole number >= 0 (0: one host), got {self.devices_per_host!r}")

    @classmethod
    def of(cls, comm_bandwidth=None, comm_latency=None, devices_per_host=None, inter_host_bandwidth=None,
           inter_host_latency=None) -> "CommModel":
        """The model of the oracle flags (:func:`comm_kwargs`; None: each default)."""
        given = {"bandwidth_gbps": comm_bandwidth, "latency_us": comm_latency, "devices_per_host": devices_per_host,
                 "inter_bandwidth_gbps": inter_host_bandwidth, "inter_latency_us": inter_host_latency}
        return cls(**{k: (int(v) if k == "devices_per_host" else float(v)) for k, v in given.items() if v is not None})

    def hosts(self, ndevices: int) -> int:
        """How many hosts ``ndevices`` devices span (1 unless ``devices_per_host`` splits them)."""
        g = self.devices_per_host
        return -(-int(ndevices) // g) if g and ndevices > g else 1

    def _inter_phase(self, nbytes):
        import numpy as np

        nbytes = np.asarray(nbytes, dtype=float)
        return np.where(nbytes > 0, self.inter_latency_us * 1e-3 + nbytes / (self.inter_bandwidth_gbps * 1e9) * 1e3, 0.0)

    def _all_to_all(self, widths, batch_size: int, element: int):
        """ms per device of the all-to-all of per-sample ``widths`` (devices on the last axis), on one level
        or two (see the class notes). The input ids travel the other way (:func:`id_bytes`), which swaps
        each device's sent and received bytes and leaves their maximum, the phase's time, as it is."""
        import numpy as np

        n = np.shape(widths)[-1]
        if self.hosts(n) == 1:
            w = np.asarray(widths, dtype=float)
            slices = np.asarray(batch_slices(batch_size, n), dtype=float)
            total = w.sum(axis=-1, keepdims=True)
            sent, recv = element * w * (batch_size - slices), element * slices * (total - w)
            return self._phase(np.maximum(sent, recv))
        intra, inter = host_bytes(widths, batch_size, self.devices_per_host, element)
        return np.maximum(self._phase(np.maximum(*intra)), self._inter_phase(np.maximum(*inter)))

    def phase_ms(self, nbytes: int) -> float:
        if nbytes <= 0:
            return 0.0
        return self.latency_us * 1e-3 + nbytes / (self.bandwidth_gbps * 1e9) * 1e3

    def predict(self, dim_sums: Sequence[int], batch_size: int) -> list[tuple[float, float]]:
        """Per device ``(fw_ms, bw_ms)`` of the two all-to-alls."""
        if len(dim_sums) < 2:
            return [(0.0, 0.0)] * len(dim_sums)
        return [(float(t), float(t)) for t in self._all_to_all(list(dim_sums), batch_size, OUTPUT_ELEMENT_SIZE)]

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
        pooled = self._all_to_all(dims, batch_size, OUTPUT_ELEMENT_SIZE)
        fw, bw = pooled, pooled
        if id_widths is not None:
            ids = np.broadcast_to(np.asarray(id_widths, dtype=float), dims.shape)
            fw = fw + self._all_to_all(ids, batch_size, ID_ELEMENT_SIZE)
        if backward_bytes is not None:
            ring = np.broadcast_to(np.asarray(backward_bytes, dtype=float), dims.shape)
            h = self.hosts(n)
            if h == 1:
                bw = bw + self._phase(ring)
            else:   # the flat ring's bytes, 2 (n-1)/n x S, back to S; then the hierarchical all-reduce
                g = self.devices_per_host
                size = ring * n / (2.0 * (n - 1))
                bw = bw + self._phase(2.0 * (g - 1) / g * size) + self._inter_phase(2.0 * (h - 1) / h * size / g)
        return fw, bw

    def step_bytes(self, pooled_widths, batch_size: int, id_widths, backward_bytes):
        """Per device ``(bytes within its host, bytes with other hosts)`` of one training step, sent and
        received together (numpy arrays): both pooled all-to-alls, the id all-to-all and the all-reduce,
        split by level as :meth:`exchange_ms` prices them (one host: everything is within it)."""
        import numpy as np

        pooled, ids = np.asarray(pooled_widths, dtype=float), np.asarray(id_widths, dtype=float)
        ring = np.asarray(backward_bytes, dtype=float)
        n, g = pooled.shape[-1], self.devices_per_host
        if self.hosts(n) == 1:
            (ps, pr), _ = host_bytes(pooled, batch_size, n, OUTPUT_ELEMENT_SIZE)
            (is_, ir), _ = host_bytes(ids, batch_size, n, ID_ELEMENT_SIZE)
            return 2 * (ps + pr) + is_ + ir + 2 * ring, np.zeros(n)
        (ps, pr), (qs, qr) = host_bytes(pooled, batch_size, g, OUTPUT_ELEMENT_SIZE)
        (is_, ir), (js, jr) = host_bytes(ids, batch_size, g, ID_ELEMENT_SIZE)
        h = self.hosts(n)
        size = ring * n / (2.0 * (n - 1))
        intra = 2 * (ps + pr) + is_ + ir + 2 * (2.0 * (g - 1) / g * size)
        inter = 2 * (qs + qr) + js + jr + 2 * (2.0 * (h - 1) / h * size / g)
        return intra, inter

    def describe(self) -> str:
        how = "fitted to measured all-to-alls" if self.source == "fitted" else "analytic"
        hosts = (f"; between hosts of {self.devices_per_host} devices {self.inter_latency_us:.1f} us + bytes / "
                 f"{self.inter_bandwidth_gbps:.1f} GB/s, {'fitted' if self.source == 'fitted' else DEFAULT_INTER_HOST_LINK if self.inter_bandwidth_gbps == DEFAULT_INTER_HOST_BANDWIDTH_GBPS else 'given'}"
                 if self.devices_per_host else "")
        return (f"modelled ({how}: {self.latency_us:.1f} us + bytes / {self.bandwidth_gbps:.1f} GB/s; "
                f"{self.link}{hosts})")

    def to_json(self) -> dict:
        out = {"bandwidth_gbps": self.bandwidth_gbps, "latency_us": self.latency_us, "link": self.link,
               "source": self.source}
        if self.devices_per_host:
            out.update(devices_per_host=self.devices_per_host, inter_bandwidth_gbps=self.inter_bandwidth_gbps,
                       inter_latency_us=self.inter_latency_us)
        return out


COMM_FLAGS = ("comm_bandwidth", "comm_latency", "devices_per_host", "inter_host_bandwidth", "inter_host_latency")


def comm_kwargs(args) -> dict:
    """The modelled exchange's flags of an argparse namespace (those it has), as keyword arguments for
    :meth:`CommModel.of` and for every planner that models the exchange (shardkit, TorchRec)."""
    return {k: getattr(args, k) for k in COMM_FLAGS if getattr(args, k, None) is not None}


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


def fit_exchange_model(samples: Sequence[tuple[float, float, float, float]], link: str) -> CommModel:
    """Least-squares fit of one ``latency`` and one ``bandwidth`` to a training step's measured exchanges,
    both phases at once, as :meth:`CommModel.exchange_ms` prices them: per device ``(pooled, ids, fw_ms,
    bw_ms)``, ``pooled`` and ``ids`` the maxima of bytes sent and received of the pooled-output and the
    input-id all-to-alls, ``fw_ms = 2 latency + (pooled + ids) / bandwidth`` (two all-to-alls) and
    ``bw_ms = latency + pooled / bandwidth`` (the pooled gradients back; no replicas in the samples).

    Needs at least two distinct byte counts; a negative latency is refitted at 0, a non-positive slope
    clipped as in :func:`fit_comm_model`."""
    import numpy as np

    pts = [tuple(float(v) for v in s) for s in samples if s[0] > 0]
    if len({p[0] for p in pts}) < 2:
        raise ShardError("fitting the exchange model needs measurements at two or more sizes")
    a = np.array(pts)
    lat = np.concatenate([np.full(len(a), 2.0), np.ones(len(a))])
    x = np.concatenate([a[:, 0] + a[:, 1], a[:, 0]])
    y = np.concatenate([a[:, 2], a[:, 3]])
    (intercept, slope), *_ = np.linalg.lstsq(np.stack([lat, x], axis=1), y, rcond=None)
    if intercept < 0:
        intercept, slope = 0.0, float(x @ y / (x @ x))
    slope = max(float(slope), 1e-9)
    return CommModel(bandwidth_gbps=1e-6 / slope, latency_us=float(intercept) * 1e3, link=link, source="fitted")


def comm_splits(dim_sums: Sequence[int], batch_size: int, device: int) -> CommSplits:
    """The all-to-all split sizes of ``device`` when device ``d`` holds tables of total dim ``dim_sums[d]``."""
    n = len(dim_sums)
    bs = batch_slices(batch_size, n)
    own = int(dim_sums[device])
    fw_send = tuple(bs[j] * own for j in range(n))
    fw_recv = tuple(bs[device] * int(dim_sums[d]) for d in range(n))
    return CommSplits(device, fw_send, fw_recv, bw_send=fw_recv, bw_recv=fw_send)
