"""Shard micro-benchmark: the hardware cost oracle for one device's tables.

A *shard* is the list of tables one device holds. :class:`ShardRunner` builds **one** fused FBGEMM
operator (``SplitTableBatchedEmbeddingBagsCodegen``) over all of them, feeds it the tables' real
lookup data from the dataset (the indices and offsets of every table concatenated, as a training
step would) and times (a device holding data-parallel replicas runs them in a second fused operator
over its batch slice only, :func:`shardcore.plan.device_kernels`; its times are the two operators'
together)

- **forward**: the pooled (summed) embedding lookup, output ``[B, sum of the shard's dims]`` fp32;
- **backward**: the fused backward, which also applies the sparse optimizer update
  (``exact_sgd`` by default; ``exact_adagrad`` and ``exact_row_wise_adagrad`` are available).

Each phase is run ``warmup_iters`` times untimed, then ``bench_iters`` times timed, and the median
is reported in milliseconds. The same batch is replayed every iteration.

**Clock on the CPU.** The kernels run on one thread, the calling one (fbgemm's CPU kernels with
``torch.set_num_threads(1)``, and the autograd engine runs CPU backward on the caller), so each
phase is timed by that thread's CPU time (``time.thread_time``, i.e. ``CLOCK_THREAD_CPUTIME_ID``:
user plus system time, page faults included). On an idle core it equals the wall time (checked:
medians agree within a few percent); when other processes share the machine's cores it is not
inflated by the time slices they take, which would otherwise double some samples on a 2-core box.
What co-runners still change (shared caches, memory bandwidth) is left in. ``cpu_clock=False``
selects wall time instead.

A :class:`~shardcore.tables.TableConfig` in a shard names the dataset table whose lookups it uses
(``index``) and the ``row``/``dim`` of the weights to build; ``dim`` may differ from the dataset's
(column-wise splits), and ``row`` may be smaller, in which case indices are folded with ``% row``.

**Devices.** On a CUDA machine the weights live in device memory (``EmbeddingLocation.DEVICE``)
and phases are timed with CUDA events. Otherwise fbgemm-gpu-cpu runs the same operator with the
weights in host memory (``EmbeddingLocation.HOST``, ``ComputeDevice.CPU``) on one compute thread,
timed as described above. The CUDA path has run on an NVIDIA H200 (torch 2.11.0+cu130, fbgemm-gpu 1.6.0;
``tools/gpu_check.py``, data/gpu_measurements/); the test suite runs the CPU path only (CI has no GPU).

**Weights** are zero-initialised (their values do not change the cost of a lookup). On the CPU they
are backed by lazily committed pages where fbgemm accepts a preallocated buffer, so building a
multi-gigabyte shard takes milliseconds; the pages the batch touches are committed during warm-up
(the first warm-up iteration of a large, fresh shard is therefore slow; it is never timed). A
long-lived process can pass a :class:`BufferPool` so that pages committed for one shard serve the
next ones.

**Memory.** Before anything is allocated, a shard's weights plus optimizer state are compared with
the memory actually available (host: ``MemAvailable`` less a margin; GPU: free device memory less a
margin); a shard that does not fit is refused with a :class:`~shardcore.errors.ShardError`.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import os
import tempfile
import statistics
import time
from typing import Sequence

import torch

from shardcore.errors import ShardError
from shardcore.oracles.setting import EXACT_SGD, OPTIMIZERS, normalize_optimizer, normalize_precision
from shardcore.tables import TableConfig, bytes_per_element
from shardcore.types import ComputeCost  # noqa: F401  (a shard's cost; defined with the data model)

DEFAULT_WARMUP_ITERS = 2
DEFAULT_BENCH_ITERS = 7
REFERENCE_BLOCK_ITERS = 3   # timed reference iterations before and after each CPU measurement (sample_blocked)
LEARNING_RATE = 0.01


# Host memory kept free beyond a shard's nominal size: 10% of what is available plus 1 GiB.
HOST_MARGIN_FRACTION = 0.10
HOST_MARGIN_BYTES = 1 << 30
# GPU memory kept free: 5% of the free memory plus 512 MiB (inputs, outputs, workspace, NCCL).
GPU_MARGIN_FRACTION = 0.05
GPU_MARGIN_BYTES = 512 << 20


def default_device() -> str:
    """``"cuda"`` when a CUDA device is usable, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


# --------------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------------
def optimizer_state_bytes(table: TableConfig, optimizer: str) -> int:
    """Bytes of optimizer state fbgemm keeps for a table (fp32 momentum)."""
    optimizer = normalize_optimizer(optimizer)
    if optimizer == "exact_adagrad":
        return table.row * table.dim * 4
    if optimizer == "exact_row_wise_adagrad":
        return table.row * 4
    return 0


def shard_memory_bytes(tables: Sequence[TableConfig], precision: str = "fp16",
                       optimizer: str = EXACT_SGD) -> int:
    """Weights plus optimizer state of a shard, in bytes."""
    nbytes = bytes_per_element(normalize_precision(precision))
    return sum(t.row * t.dim * nbytes + optimizer_state_bytes(t, optimizer) for t in tables)


def host_available_bytes() -> int:
    """Host memory available to new allocations (``MemAvailable`` on Linux)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return 1 << 62


def usable_bytes(device: str | torch.device) -> int:
    """Memory a shard may use on ``device``: what is available there less a safety margin."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free * (1 - GPU_MARGIN_FRACTION)) - GPU_MARGIN_BYTES
    avail = host_available_bytes()
    return int(avail * (1 - HOST_MARGIN_FRACTION)) - HOST_MARGIN_BYTES


def check_fits(tables: Sequence[TableConfig], precision: str = "fp16", optimizer: str = EXACT_SGD,
               device: str | torch.device = "cpu", what: str = "shard",
               usable: int | None = None) -> None:
    """Raise :class:`ShardError` when the shard's weights and optimizer state do not fit in the
    memory available on ``device`` (checked before anything is allocated)."""
    need = shard_memory_bytes(tables, precision, optimizer)
    if need == 0:
        return
    have = usable_bytes(device) if usable is None else int(usable)
    if need > have:
        where = "free GPU memory" if torch.device(device).type == "cuda" else "available host memory"
        raise ShardError(
            f"{what} of {len(tables)} table(s) needs {need / 2**30:.2f} GiB ({precision} weights"
            f"{' + ' + optimizer + ' state' if optimizer != EXACT_SGD else ''}) but only "
            f"{max(have, 0) / 2**30:.2f} GiB of {where} can be used: refused before allocation")


# --------------------------------------------------------------------------------------------
# One measurement at a time per machine
# --------------------------------------------------------------------------------------------
HOST_LOCK_PATH = os.path.join(tempfile.gettempdir(), "shardcore-cpu-measure.lock")
DEFAULT_LOCK_TIMEOUT_S = 600.0


@contextlib.contextmanager
def host_measurement_lock(timeout_s: float = DEFAULT_LOCK_TIMEOUT_S, path: str | None = None):
    """Hold the machine-wide CPU measurement lock (an ``flock`` on a file in the temp directory).

    Several processes on one machine (a training run, an evaluation, this repository's tests) may
    measure at the same time; on the CPU they would share the cores and distort each other's
    timings. Every CPU measurement (a shard's compute, an all-to-all phase) is taken under this
    lock, so they take turns. The kernel drops the lock when its holder dies. Waiting longer than
    ``timeout_s`` raises :class:`ShardError`.
    """
    import fcntl

    path = path or HOST_LOCK_PATH
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        deadline = time.monotonic() + timeout_s
        delay = 0.0005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ShardError(f"waited {timeout_s:g} s for the CPU measurement lock {path}: another "
                                     "process keeps measuring (or is stuck while holding it)") from None
                time.sleep(delay)
                delay = min(delay * 2, 0.005)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------
def _dataset(dataset):
    from shardcore.dataset import Dataset, load_dataset

    if isinstance(dataset, Dataset):
        return dataset
    return load_dataset(dataset)


def resolve_batch_size(dataset, batch_size: int | None) -> int:
    if dataset.batch_size is None:
        raise ShardError(f"{dataset.path or 'dataset'}: no lookup data loaded")
    if batch_size is None:
        return int(dataset.batch_size)
    batch_size = int(batch_size)
    if not 1 <= batch_size <= dataset.batch_size:
        raise ShardError(f"batch size {batch_size} not available: the dataset holds one batch of "
                         f"{dataset.batch_size} samples per table")
    return batch_size


def validate_tables(dataset, tables: Sequence[TableConfig], what: str = "shard") -> None:
    for t in tables:
        if not isinstance(t, TableConfig):
            raise ShardError(f"{what}: expected TableConfig entries, got {type(t).__name__}")
        if not 0 <= t.index < dataset.num_tables:
            raise ShardError(f"{what}: table id {t.index} out of range: the dataset has "
                             f"{dataset.num_tables} tables")
        if t.row < 1 or t.dim < 1:
            raise ShardError(f"{what}: table {t.index} needs positive rows and dim (got {t.row}, {t.dim})")


def shard_lookups(dataset, tables: Sequence[TableConfig], batch_size: int | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused operator's input for a shard: all tables' indices concatenated (int64) and offsets
    of ``len(tables) * B + 1`` entries over that concatenation (int64). A row-wise or data-parallel
    piece contributes only its own lookups (:func:`shardcore.oracles.measured.shardings.piece_lookups`); replicas
    (whose bags are their batch slice's ``B_d``) go in an operator of their own
    (:func:`shardcore.plan.device_kernels`), never mixed with whole-batch tables."""
    dataset = _dataset(dataset)
    b = resolve_batch_size(dataset, batch_size)
    validate_tables(dataset, tables)
    all_idx, all_off = [], [torch.zeros(1, dtype=torch.int64)]
    base = 0
    for t in tables:
        if getattr(t, "special", False):  # a row-wise or data-parallel piece (shardcore.plan.ShardPiece)
            from shardcore.oracles.measured.shardings import piece_lookups

            idx, off = piece_lookups(dataset, t, b)
            n = int(off[-1])
        else:
            raw_idx, raw_off = dataset.indices[t.index], dataset.offsets[t.index]
            off = raw_off[: b + 1].to(torch.int64)
            n = int(off[-1])
            idx = raw_idx[:n].to(torch.int64)
            if n and t.row < dataset.tables[t.index].row and int(idx.max()) >= t.row:
                idx = torch.remainder(idx, t.row)
        all_idx.append(idx)
        all_off.append(off[1:] + base)
        base += n
    indices = torch.cat(all_idx) if all_idx else torch.zeros(0, dtype=torch.int64)
    return indices.contiguous(), torch.cat(all_off).contiguous()


# --------------------------------------------------------------------------------------------
# The fused operator
# --------------------------------------------------------------------------------------------
def _fbgemm():
    try:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen)
    except Exception as exc:  # ImportError, or a library that fails to load its operators
        raise ShardError(f"fbgemm-gpu is not usable ({type(exc).__name__}: {exc}); install fbgemm-gpu "
                         "(GPU) or fbgemm-gpu-cpu") from None
    return (SplitTableBatchedEmbeddingBagsCodegen, ComputeDevice, EmbeddingLocation, PoolingMode,
            EmbOptimType, SparseType)


def _accepts_preallocated_buffers(cls) -> bool:
    try:
        return "preallocated_host_buffers" in inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return False


def _lazy_zeros(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor on an anonymous mapping whose pages are committed on first touch, in small pages
    only (``MADV_NOHUGEPAGE``, where the platform has it).

    Why small pages: a lookup's cost is dominated by its TLB and cache misses, and whether the kernel
    backs a region with transparent huge pages depends on how fragmented memory happens to be when
    the pages are first touched. numpy asks for huge pages on every large array, so the same shard
    measured twice ran 15-25% apart depending on the luck of that moment (measured on the 2-core
    EPYC dev VM, THP 'madvise'); with small pages everywhere the cost is a property of the shard."""
    import mmap

    itemsize = torch.empty(0, dtype=dtype).element_size()
    nbytes = max(1, int(numel) * itemsize)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_NOHUGEPAGE)
        except OSError:  # pragma: no cover  (a kernel without THP)
            pass
    return torch.frombuffer(buf, dtype=dtype, count=int(numel)) if numel else torch.zeros(0, dtype=dtype)


class BufferPool:
    """Reusable host buffers for weights and optimizer state (CPU only), one per role.

    A long-lived worker measures one shard after another; building each shard on freshly mapped
    memory would make the kernel commit (and later release) every page the batch touches, which
    costs far more wall time than the measurement itself on a virtual machine. The pool keeps one
    lazily committed byte buffer per role (``weights``, ``momentum1``) and hands out views of its
    start, so pages committed for one shard serve the next. Values left by earlier shards do not
    matter to the cost. Each role reserves ``cap_bytes`` of address space on first use (pages are
    committed only when touched, so the resident size grows with the shards actually run, up to the
    cap); larger requests get a fresh buffer that is not kept. Only warm-up wall time changes: the
    timed iterations run after every page the batch touches has been committed either way.
    """

    def __init__(self, cap_bytes: int):
        self.cap_bytes = int(cap_bytes)
        self._bufs: dict[str, torch.Tensor] = {}

    def take(self, role: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        itemsize = torch.empty(0, dtype=dtype).element_size()
        need = int(numel) * itemsize
        if need > self.cap_bytes:
            return _lazy_zeros(numel, dtype)
        buf = self._bufs.get(role)
        if buf is None:  # reserve the whole cap at once: address space only, pages commit on touch
            buf = _lazy_zeros(-(-self.cap_bytes // 8) * 8, torch.uint8)
            self._bufs[role] = buf
        return buf[: (need // itemsize) * itemsize].view(dtype)[: int(numel)]

    def clear(self) -> None:
        self._bufs.clear()


def build_operator(tables: Sequence[TableConfig], optimizer: str = EXACT_SGD, precision: str = "fp16",
                   device: str | torch.device = "cpu", pool: BufferPool | None = None, pool_role: str = ""):
    """One fused ``SplitTableBatchedEmbeddingBagsCodegen`` over ``tables`` (sum pooling).

    On the CPU, ``pool`` (optional) supplies reusable weight buffers (see :class:`BufferPool`), under
    roles prefixed with ``pool_role`` (operators alive together take different prefixes)."""
    (TBE, ComputeDevice, EmbeddingLocation, PoolingMode, EmbOptimType, SparseType) = _fbgemm()
    optimizer, precision = normalize_optimizer(optimizer), normalize_precision(precision)
    device = torch.device(device)
    opt = getattr(EmbOptimType, OPTIMIZERS[optimizer])
    wprec = SparseType.FP16 if precision == "fp16" else SparseType.FP32
    kwargs = dict(optimizer=opt, learning_rate=LEARNING_RATE, weights_precision=wprec,
                  pooling_mode=PoolingMode.SUM)
    if device.type == "cuda":
        bad = [t.index for t in tables if t.dim % 4]
        if bad:
            raise ShardError(f"fbgemm-gpu on CUDA needs dims that are multiples of 4 (table {bad[0]})")
        specs = [(t.row, t.dim, EmbeddingLocation.DEVICE, ComputeDevice.CUDA) for t in tables]
        with torch.cuda.device(device):
            return TBE(specs, device=device, **kwargs)
    specs = [(t.row, t.dim, EmbeddingLocation.HOST, ComputeDevice.CPU) for t in tables]
    if _accepts_preallocated_buffers(TBE):
        dtype = torch.float16 if precision == "fp16" else torch.float32
        take = pool.take if pool is not None else (lambda _role, n, dt: _lazy_zeros(n, dt))
        buffers = {"weights": take(pool_role + "weights", sum(t.row * t.dim for t in tables), dtype)}
        if optimizer == "exact_adagrad":
            buffers["momentum1"] = take(pool_role + "momentum1", sum(t.row * t.dim for t in tables), torch.float32)
        elif optimizer == "exact_row_wise_adagrad":
            buffers["momentum1"] = take(pool_role + "momentum1", sum(t.row for t in tables), torch.float32)
        try:
            return TBE(specs, preallocated_host_buffers=buffers, **kwargs)
        except (AssertionError, ValueError, TypeError):
            pass  # a layout this fbgemm version does not take: fall back to its own allocation
    return TBE(specs, **kwargs)


class ShardRunner:
    """One shard's fused operator, its inputs and a fixed output gradient, ready to run; with
    data-parallel replicas, a second operator for them over the device's batch slice
    (:func:`shardcore.plan.device_kernels`), run after the first in each phase.

    ``check_memory`` refuses a shard that does not fit (see :func:`check_fits`) before building it.
    An empty shard builds nothing and costs 0.
    """

    def __init__(self, dataset, tables: Sequence[TableConfig], *, batch_size: int | None = None,
                 optimizer: str = EXACT_SGD, precision: str = "fp16", device: str | torch.device | None = None,
                 check_memory: bool = True, usable_bytes: int | None = None, pool: BufferPool | None = None):
        self.dataset = _dataset(dataset)
        self.tables = list(tables)
        self.optimizer = normalize_optimizer(optimizer)
        self.precision = normalize_precision(precision)
        self.device = torch.device(device if device is not None else default_device())
        self.batch_size = resolve_batch_size(self.dataset, batch_size)
        validate_tables(self.dataset, self.tables)
        self.output_dim = sum(t.dim for t in self.tables)
        self.op = None
        self.kernels: list[tuple] = []   # per fused operator: (op, indices, offsets, output gradient)
        if not self.tables:
            return
        if check_memory:
            check_fits(self.tables, self.precision, self.optimizer, self.device, usable=usable_bytes)
        from shardcore.plan import device_kernels

        gen = torch.Generator().manual_seed(0)
        self.num_lookups = 0
        for k, (b, tables) in enumerate(device_kernels(self.tables, self.batch_size)):
            indices, offsets = shard_lookups(self.dataset, tables, self.batch_size)
            self.num_lookups += int(indices.numel())
            op = build_operator(tables, self.optimizer, self.precision, self.device, pool=pool,
                                pool_role="" if k == 0 else f"kernel{k}:")
            grad = torch.randn(b, sum(t.dim for t in tables), generator=gen)
            self.kernels.append((op, indices.to(self.device), offsets.to(self.device), grad.to(self.device)))
        self.op, self.indices, self.offsets, self.grad = self.kernels[0]

    @property
    def empty(self) -> bool:
        return self.op is None

    def forward(self):
        """The pooled outputs: one tensor, or with a data-parallel operator a list, one per operator."""
        if len(self.kernels) == 1:
            return self.op(self.indices, self.offsets)
        return [op(idx, off) for op, idx, off, _g in self.kernels]

    def backward(self, out, grad: torch.Tensor | None = None) -> None:
        if isinstance(out, list):
            for o, (_op, _i, _o, g) in zip(out, self.kernels):
                o.backward(g)
            return
        out.backward(self.grad if grad is None else grad)

    def measure(self, warmup_iters: int = DEFAULT_WARMUP_ITERS, bench_iters: int = DEFAULT_BENCH_ITERS,
                cpu_clock: bool = True) -> ComputeCost:
        """Median forward and backward times (ms) over ``bench_iters`` runs after ``warmup_iters``.

        On the CPU, ``cpu_clock=True`` (the default) times each phase by the calling thread's CPU time
        (``time.thread_time``); ``False`` uses wall time. See the module notes.
        """
        if self.empty:
            return ComputeCost(0.0, 0.0)
        fw, bw = self.sample(warmup_iters, bench_iters, cpu_clock)
        return ComputeCost(float(statistics.median(fw)), float(statistics.median(bw)))

    def sample(self, warmup_iters: int = DEFAULT_WARMUP_ITERS, bench_iters: int = DEFAULT_BENCH_ITERS,
               cpu_clock: bool = True) -> tuple[list[float], list[float]]:
        """The individual forward and backward times (ms) of ``bench_iters`` timed iterations."""
        if self.empty:
            return [0.0] * bench_iters, [0.0] * bench_iters
        if bench_iters < 1:
            raise ShardError(f"bench_iters must be at least 1, got {bench_iters}")
        for _ in range(max(0, warmup_iters)):
            self.backward(self.forward())
        fw, bw = [], []
        gc_was_enabled = gc.isenabled()  # no collection inside the timed loop (a full one costs ~0.1 s)
        gc.disable()
        try:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
                events = [[torch.cuda.Event(enable_timing=True) for _ in range(3)] for _ in range(bench_iters)]
                for e0, e1, e2 in events:
                    e0.record()
                    out = self.forward()
                    e1.record()
                    self.backward(out)
                    e2.record()
                torch.cuda.synchronize(self.device)
                for e0, e1, e2 in events:
                    fw.append(e0.elapsed_time(e1))
                    bw.append(e1.elapsed_time(e2))
            else:
                clock = time.thread_time if cpu_clock else time.perf_counter
                for _ in range(bench_iters):
                    t0 = clock()
                    out = self.forward()
                    t1 = clock()
                    self.backward(out)
                    t2 = clock()
                    fw.append((t1 - t0) * 1e3)
                    bw.append((t2 - t1) * 1e3)
                    del out
        finally:
            if gc_was_enabled:
                gc.enable()
        return fw, bw

    def sample_blocked(self, ref: "ShardRunner", warmup_iters: int = DEFAULT_WARMUP_ITERS,
                       bench_iters: int = DEFAULT_BENCH_ITERS, ref_iters: int = REFERENCE_BLOCK_ITERS
                       ) -> tuple[list[float], list[float], list[float]]:
        """The CPU protocol of :mod:`shardcore.oracles.measured.driver`: a block of ``ref`` (the reference
        shard, :class:`ReferenceRunner`: one untimed iteration, then ``ref_iters`` timed), this shard's
        block (at least one untimed iteration, then ``bench_iters`` timed, back to back), and the
        reference's block again. Each is timed in its own warm state -- a heavy shard evicts the
        reference's rows from the caches, and the reference this shard's, so that a reference iteration
        timed right after the shard (or the shard right after the reference) runs slower than either
        alone, the more so the heavier the shard. Returns this shard's forward and backward times (ms)
        and the reference's fw+bw times of both blocks: their median is the machine's speed of the
        moment."""
        if self.empty:
            return [0.0] * bench_iters, [0.0] * bench_iters, [1.0]
        if bench_iters < 1:
            raise ShardError(f"bench_iters must be at least 1, got {bench_iters}")

        def ref_block() -> list[float]:
            rf, rb = ref.sample(1, ref_iters)
            return [f + b for f, b in zip(rf, rb)]

        refs = ref_block()
        fw, bw = self.sample(max(1, warmup_iters), bench_iters)
        refs += ref_block()
        return fw, bw, refs

    def close(self) -> None:
        self.op = None
        self.kernels = []
        self.indices = self.offsets = self.grad = None


# The reference shard measured beside every CPU measurement (see shardcore.oracles.measured.driver): one synthetic
# table of REFERENCE_ROWS x REFERENCE_DIM, REFERENCE_POOLING uniformly random lookups per sample.
REFERENCE_ROWS = 1 << 20
REFERENCE_DIM = 64
REFERENCE_POOLING = 16
REFERENCE_SEED = 20261126


class ReferenceRunner(ShardRunner):
    """A fixed synthetic shard, independent of any dataset: one table of ``REFERENCE_ROWS`` rows of
    ``REFERENCE_DIM`` columns (weights larger than the caches, like a real table's), ``batch_size``
    bags of ``REFERENCE_POOLING`` uniformly random rows each (a fixed seed). Its cost moves with the
    machine's speed of the moment and with nothing else, which is what the measured oracle divides
    out (:mod:`shardcore.oracles.measured.driver`, 'Drift')."""

    def __init__(self, batch_size: int, *, optimizer: str = EXACT_SGD, precision: str = "fp16",
                 device: str | torch.device = "cpu"):
        self.dataset = None
        self.optimizer = normalize_optimizer(optimizer)
        self.precision = normalize_precision(precision)
        self.device = torch.device(device)
        self.batch_size = int(batch_size)
        self.tables = [TableConfig(0, REFERENCE_ROWS, REFERENCE_DIM, float(REFERENCE_POOLING))]
        self.output_dim = REFERENCE_DIM
        gen = torch.Generator().manual_seed(REFERENCE_SEED)
        n = self.batch_size * REFERENCE_POOLING
        indices = torch.randint(0, REFERENCE_ROWS, (n,), generator=gen, dtype=torch.int64)
        offsets = torch.arange(0, n + 1, REFERENCE_POOLING, dtype=torch.int64)
        grad = torch.randn(self.batch_size, REFERENCE_DIM, generator=gen)
        op = build_operator(self.tables, self.optimizer, self.precision, self.device)
        self.num_lookups = n
        self.kernels = [(op, indices.to(self.device), offsets.to(self.device), grad.to(self.device))]
        self.op, self.indices, self.offsets, self.grad = self.kernels[0]


def benchmark_shard(dataset, tables: Sequence[TableConfig], *, batch_size: int | None = None,
                    optimizer: str = EXACT_SGD, precision: str = "fp16",
                    warmup_iters: int = DEFAULT_WARMUP_ITERS, bench_iters: int = DEFAULT_BENCH_ITERS,
                    device: str | torch.device | None = None, num_threads: int | None = 1,
                    cpu_clock: bool = True, host_lock: bool = True) -> ComputeCost:
    """Measure one shard in this process: median forward and backward compute in ms.

    ``dataset`` is a :class:`~shardcore.dataset.Dataset` or a dataset directory. On the CPU the
    kernels run on ``num_threads`` threads (1 by default; the previous setting is restored after)
    and, with ``host_lock``, under the machine-wide measurement lock (:func:`host_measurement_lock`).
    """
    device = torch.device(device if device is not None else default_device())
    old_threads = torch.get_num_threads()
    if device.type == "cpu" and num_threads:
        torch.set_num_threads(int(num_threads))
    try:
        runner = ShardRunner(dataset, tables, batch_size=batch_size, optimizer=optimizer,
                             precision=precision, device=device)
        lock = host_measurement_lock() if device.type == "cpu" and host_lock else contextlib.nullcontext()
        try:
            with lock:
                return runner.measure(warmup_iters, bench_iters, cpu_clock=cpu_clock)
        finally:
            runner.close()
    finally:
        if torch.get_num_threads() != old_threads:
            torch.set_num_threads(old_threads)
