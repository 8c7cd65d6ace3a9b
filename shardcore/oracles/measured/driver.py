"""Multi-device plan evaluator, the measured cost oracle: one worker process per device, started
once, serving many plans. (The driver that plans tasks and asks an oracle is
:mod:`shardcore.evaluation.compare`; the interface every oracle implements is :mod:`shardcore.types`.)

A plan is a list of shards, one per device (``shards[d]``: the :class:`~shardcore.tables.TableConfig`
list device ``d`` holds). Measuring it reproduces a model-parallel training iteration of the
embedding layer:

1. **forward compute**: device ``d`` runs its fused operator over the whole batch ``B``,
   giving pooled outputs ``[B, D_d]`` (``D_d`` = the sum of its tables' dims), and its
   data-parallel replicas, if any, in a second operator over its own batch slice
   (:func:`shardcore.plan.device_kernels`);
2. **forward communication**: the input-id all-to-all (every device sends each holder of a
   model-parallel table its batch slice's ids of the table plus one length per sample, the counts
   taken from ``data.pt``, :func:`shardcore.oracles.measured.shardings.comm_layout`), then an all-to-all in which
   ``d`` sends every device ``j`` the rows of ``j``'s slice of the batch (``B_j`` samples: ``B``
   split evenly, the first ``B mod n`` devices taking one more) for all of ``d``'s tables, so ``j``
   receives ``[B_j, sum_d D_d]`` in total (``all_to_all_single`` on flat fp32 buffers with input
   split sizes ``B_j * D_d`` and output split sizes ``B_d' * D_d``);
3. **backward communication**: the reverse exchange of the gradients of those outputs, then the
   data-parallel gradient all-reduce, if any;
4. **backward compute**: the fused backward with the sparse optimizer update.

Per device the four costs are reported in ms in that order, and a plan's cost is the maximum over
devices of their sum (:class:`PlanResult`).

**Workers.** :class:`PlanEvaluator` starts one process per device, joined
in a ``torch.distributed`` process group (NCCL on GPUs, gloo on the CPU) through a TCP store that
the parent opens on a free localhost port. Workers load the dataset once (memory-mapped), warm up
fbgemm and the collectives, and then wait on a pipe for requests, so a training loop pays the
start-up once. The parent drives every phase through the pipes; workers never block on each other
except inside the timed all-to-alls. CPU workers are forked by a forkserver that imported torch and
FBGEMM once (:func:`~shardcore.oracles.measured.worker.worker_context`: 4 workers up in 4.2-4.6 s on
the 2-core machine instead of 7.3-8.0 s spawned, docs/oracles.md); CUDA workers are spawned, so
nothing that touched CUDA is forked. A forked worker first lets go of the server's "alive" descriptor
(:func:`~shardcore.processes.release_forkserver`), so the server exits with the driver
and every worker, asked to die with its parent, with the server: no orphans either way. Workers end
without the interpreter's teardown (:func:`~shardcore.processes.exit_now`).

**Isolation on the CPU.** All logical devices share the machine's cores (two here), so compute
would be distorted if the workers ran their kernels at the same time. On the CPU the parent
therefore asks for the compute measurements **one device at a time**: worker ``d`` builds its
shard's operator, runs warm-up and timed forward/backward iterations (one compute thread, timed by
the thread's CPU time, see :mod:`shardcore.oracles.measured.benchmark`) and answers; only then is the next worker
asked, while the others sleep in a blocking pipe read (no CPU used). The timed iterations are
spread over ``compute_passes`` passes that visit the devices in turn (on the CPU by default one pass:
each device's samples back to back after its warm-up, in one request; with more passes the operators stay
built in between and the warm-up runs in the first pass only).

**Repeatability on the CPU.** A shared 2-core VM is not a quiet machine: the same shard's samples
spread by ~14% (relative IQR) within one measurement, and the machine's speed drifts by 20-60% over
seconds to an hour (other tenants' memory traffic; measured on the dev VM, ``tools/cpu_repeatability.py``).
Three things make a CPU cost a property of the shard rather than of the moment:

- *small pages*: weights live on anonymous mappings advised ``MADV_NOHUGEPAGE``
  (:func:`~shardcore.oracles.measured.benchmark.build_operator`); numpy's default huge-page advice made a shard's
  TLB behaviour depend on how fragmented memory was when it was built;
- *a steady heap*: workers keep the C heap's freed memory (:func:`~shardcore.oracles.measured.worker.steady_heap`): FBGEMM's backward
  allocates tens of MB of work buffers per iteration, and whether they came from pages held or
  freshly mapped (~4,000 page faults a backward) made one build of a shard 10-15% slower than another;
- *the lower quartile* of the shard's warm samples (:func:`low_quantile`; and of each exchange's
  repetitions, at least :data:`CPU_MIN_COMM_ITERS`), not the median: the slow samples are the disturbed ones.

No reference shard corrects the samples. Timing one beside every measurement (``speed_rules=True``: a block
of :class:`~shardcore.oracles.measured.benchmark.ReferenceRunner` before and after the shard's samples,
:meth:`~shardcore.oracles.measured.benchmark.ShardRunner.sample_blocked`) and dividing by it -- the block
beside the measurement alone, those of the last :data:`SPEED_WINDOW` measurements, or every block of the session
(:data:`SPEED_RULES`, each times the reference's nominal cost, :func:`at_nominal_speed`) -- was judged on
the same samples by ``tools/cpu_truth.py`` against an independent wall-clock timing of every shard: the
window and the blocks beside a measurement added the reference's own noise (a device's compute deviated
9.6-17% from its median over interleaved rounds against 4.3-7.6% uncorrected) and compressed heavy shards
(a reference iteration right after a heavy shard runs slower than the reference alone: the shard evicted
its rows from the caches); the session's median lagged the machine when its speed moved (6 of 48 devices
within the band in such a session), while the uncorrected lower quartile stayed within the band. So the costs are "CPU ms of this
machine, undisturbed": a machine that stays loaded reports higher costs, and plans are compared in
interleaved rounds of one session (``eval.py --repeats``). ``tools/cpu_repeatability.py``
measures how well the oracle repeats itself (a plan's deviation from its median over interleaved rounds),
``tools/cpu_truth.py`` whether it tells the truth (every device's reported compute against an independent
wall-clock timing of its shard); docs/oracles.md gives their current figures. The CPU hardware fingerprint
names this protocol (:data:`~shardcore.oracles.setting.CPU_PROTOCOL`), so older CPU measurements in a cache
are not mixed with them. After all compute, the all-to-alls run **together** in every worker, each
repetition started from a barrier so that the measured time is the exchange itself and not the wait
for a late peer; the medians per device are reported. Every request that measures (one device's
compute pass, the communication phase) is made under a machine-wide lock
(:func:`~shardcore.oracles.measured.benchmark.host_measurement_lock`), so two evaluators on the same machine (say a
training run and an evaluation) take turns instead of measuring each other's load. On GPUs the devices are independent, so compute runs on all of
them at once (timed with CUDA events); the communication phase is the same.

Each device's compute is a property of its shard alone, while the communication is measured for
each plan. The evaluator itself keeps nothing: the measurement cache is a layer around it
(:class:`~shardcore.oracles.cache.CachedOracle`, built by :func:`~shardcore.oracles.factory.open_oracle`) that
stores each shard and each plan, answers a plan already measured at once, and passes the compute of
shards it knows in ``evaluate(shards, compute=...)``, so that only the other shards are measured.

**Failures.** The parent waits on the workers' pipes *and* their process sentinels with a deadline
(``timeout_s`` per phase): a worker that dies (killed, out of memory, crashed) or does not answer in
time raises a one-line :class:`~shardcore.errors.ShardError` at once; all workers are then killed
and the next call starts fresh ones. The process group's own timeout is set as well, so a worker
stuck in a collective also gives up. Errors that leave the workers healthy (a shard refused for
lack of memory, bad input) are raised without a restart. Workers ignore SIGINT: on Ctrl-C the
parent kills them all before the ``KeyboardInterrupt`` propagates; workers also ask the kernel to
kill them if the parent dies (``PR_SET_PDEATHSIG``) and exit when their pipe closes, so no worker
outlives its evaluator. The CUDA path has run with one NCCL rank on an NVIDIA H200
(``tools/gpu_check.py``); an all-to-all between several GPUs has not been run.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import datetime
import json
import os
import signal
import statistics
import threading
import time
import weakref
from multiprocessing.connection import wait as mp_wait
from pathlib import Path
from typing import Sequence

from shardcore.oracles.measured.benchmark import (DEFAULT_BENCH_ITERS, DEFAULT_LOCK_TIMEOUT_S, DEFAULT_WARMUP_ITERS, ComputeCost,
                                                  check_fits, host_measurement_lock, resolve_batch_size, usable_bytes,
                                                  validate_tables)
from shardcore.oracles.setting import DEFAULT_TIMEOUT_S, EXACT_SGD, normalize_optimizer, normalize_precision
from shardcore.oracles.commmodel import CommModel, comm_splits, fit_comm_model, remote_bytes
from shardcore.types import CommSplits
from shardcore.processes import run_then_exit
from shardcore.oracles.measured.worker import (WorkerConfig, low_quantile, model_extra, relative_iqr, worker_context,
                                               worker_main)
from shardcore.types import CacheContext
from shardcore.oracles.setting import dataset_digest, hardware_fingerprint
from shardcore.oracles.cache import shard_key
from shardcore.errors import ShardError
from shardcore.tables import TableConfig
from shardcore.types import CommLayout, DeviceCost, OracleInfo, PlanResult  # noqa: F401  (PlanResult: the oracles' one result type)

DEFAULT_START_TIMEOUT_S = 300.0
DEFAULT_COMM_ITERS = None  # None: the same as bench_iters (on the CPU at least CPU_MIN_COMM_ITERS)
CPU_MIN_COMM_ITERS = 21    # CPU: a loopback exchange is cheap and noisy (4 processes on 2 cores): more repeats
DEFAULT_CPU_COMPUTE_PASSES = 1  # CPU: a device's samples back to back in one request, warm (module notes)
REWARM_ITERS = 0           # untimed iterations when a pass returns to a shard already warmed up
# the speed rules a CPU measurement is also worked out by with speed_rules=True (PlanEvaluator.speed_rule_costs;
# the first is the one reported): no correction; the median of the reference blocks of the last SPEED_WINDOW
# measurements, beside several shards (a slow-moving factor); the blocks beside this measurement alone; every
# block of the session so far
SPEED_WINDOW = 16
SPEED_RULES = ("none", "window", "beside", "session")
REFERENCE_CALIBRATION_ITERS = 15   # CPU: one-sample requests that calibrate the reference's nominal cost


# --------------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------------
_LIVE: "weakref.WeakSet[PlanEvaluator]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for ev in list(_LIVE):
        try:
            ev.close()
        except Exception:
            pass


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "is unresponsive"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (the kernel's out-of-memory killer sends SIGKILL when memory runs out)" if -code == 9 else ""
        return f"was killed by {name}{hint}"
    return f"exited with status {code}"


def at_nominal_speed(fw: Sequence[float], bw: Sequence[float], refs: Sequence[float], nominal: float) -> ComputeCost:
    """A CPU shard's cost from its samples: each forward and backward time over the reference's time at
    that sample's moment (``refs``, one per sample), the lower quartile of those ratios, times the
    reference's ``nominal`` cost -- so a sample taken while the machine ran at half speed counts as one
    taken at full speed, and the cost is in ms at the machine's nominal speed."""
    if not (len(fw) == len(bw) == len(refs)) or not fw:
        raise ShardError(f"need one reference time per sample, got {len(fw)} fw, {len(bw)} bw, {len(refs)} refs")
    return ComputeCost(nominal * low_quantile([f / r for f, r in zip(fw, refs)]),
                       nominal * low_quantile([b / r for b, r in zip(bw, refs)]))


class PlanEvaluator:
    """Measure plans on real hardware with one long-lived worker per device (the measured
    :class:`~shardcore.types.CostOracle`).

    ::

        with PlanEvaluator("data/dlrm_datasets", ndevices=4, batch_size=4096) as ev:
            result = ev.evaluate(shards)      # shards[d]: list of TableConfig on device d
            result.cost_ms, result.device_costs_ms, result.from_cache

    ``device_ids`` (``--gpu-devices``) picks CUDA devices on a GPU machine; on the CPU it only sets
    how many logical devices there are.

    **More plan devices than GPUs.** ``ndevices`` (``--ndevices``) is the number of devices a plan
    has; it may exceed ``len(device_ids)``, the devices that really run (one worker each). Then plan
    device ``d`` is measured on worker ``d mod workers``, each shard alone on its device (two shards
    never share a GPU at the same time), and the all-to-alls, which cannot run as they would between
    ``ndevices`` GPUs, come from a :class:`~shardcore.oracles.commmodel.CommModel`: the analytic one given by
    ``comm_model`` with one worker, or, with two or more workers, one fitted at start-up to the
    workers' measured all-to-alls (:meth:`calibrate_comm`). Every :class:`PlanResult` says in
    ``parts`` which parts were measured and which modelled. On a GPU machine with fewer GPUs than
    ``ndevices`` and no ``device_ids``, every GPU present serves. ``available_devices`` overrides how
    many devices this machine has (tests fake a small GPU count with it on the CPU).

    It implements :class:`~shardcore.types.ShardCostOracle` and measures everything it is asked
    for; wrap it in :class:`~shardcore.oracles.cache.CachedOracle` to reuse stored measurements (or build it
    with :func:`~shardcore.oracles.factory.open_oracle`). ``comm_iters`` defaults to ``bench_iters`` (on the CPU at least :data:`CPU_MIN_COMM_ITERS`). ``timeout_s`` bounds each phase of a measurement, ``start_timeout_s`` the
    workers' start-up. On the CPU every measurement request is made under the machine-wide
    measurement lock (``host_lock``, see :func:`~shardcore.oracles.measured.benchmark.host_measurement_lock`), so
    several evaluators on one machine take turns instead of disturbing each other; waiting for it
    longer than ``lock_timeout_s`` is an error.
    """

    def __init__(self, dataset_dir: str | os.PathLike = "data/dlrm_datasets", ndevices: int | None = None, *,
                 device_ids: Sequence[int] | None = None, bench_iters: int = DEFAULT_BENCH_ITERS,
                 warmup_iters: int = DEFAULT_WARMUP_ITERS, comm_iters: int | None = DEFAULT_COMM_ITERS,
                 optimizer: str = EXACT_SGD, precision: str = "fp16", batch_size: int | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
                 device: str | None = None, compute_passes: int | None = None, host_lock: bool = True,
                 lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S, comm_model: CommModel | None = None,
                 available_devices: int | None = None, launcher: str = "spawn",
                 speed_rules: bool = False):
        import torch

        from shardcore.dataset import load_dataset

        if launcher not in ("spawn", "torchrun"):
            raise ShardError(f"unknown launcher {launcher!r}: spawn or torchrun")
        self.launcher = launcher
        # CPU: also time the reference shard around every sample and work each cost out by every speed rule
        # (speed_rule_costs; tools/cpu_truth.py judges them side by side); the reported cost is SPEED_RULES[0]'s
        self.speed_rules = bool(speed_rules)
        self._env = None
        if launcher == "torchrun":
            from shardcore.oracles.measured.launch import rank_env

            self._env = rank_env()
            if self._env.rank != 0:
                raise ShardError("--launcher torchrun: only rank 0 drives an evaluator; the other ranks serve")
            if device_ids is not None and len(device_ids) != self._env.world_size:
                raise ShardError(f"--launcher torchrun: the {self._env.world_size} torchrun ranks are the devices "
                                 "that measure; leave --gpu-devices out")
            device_ids = list(range(self._env.world_size))   # placeholders: each rank's own device
            available_devices = None
        self.device_type = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if self.device_type not in ("cpu", "cuda"):
            raise ShardError(f"unknown device type {device!r} (cpu or cuda)")
        if available_devices is None and self.device_type == "cuda":
            available_devices = torch.cuda.device_count()
        if ndevices is not None and int(ndevices) < 1:
            raise ShardError(f"the evaluator needs at least one device, got ndevices={ndevices}")
        if device_ids is not None:
            device_ids = [int(d) for d in device_ids]
            if not device_ids:
                raise ShardError("the evaluator needs at least one device")
            if len(set(device_ids)) != len(device_ids) or min(device_ids) < 0:
                raise ShardError(f"device ids must be distinct and non-negative, got {device_ids}")
            if ndevices is not None and ndevices < len(device_ids):
                raise ShardError(f"{ndevices} plan devices but {len(device_ids)} devices given to run them: "
                                 "list at most as many devices as the plan has")
        else:
            n = ndevices if ndevices is not None else 4
            device_ids = list(range(min(n, available_devices) if available_devices else n))
        if available_devices is not None:
            bad = [d for d in device_ids if d >= available_devices]
            if bad:
                what = "GPU(s)" if self.device_type == "cuda" else "device(s)"
                raise ShardError(f"GPU {bad[0]} requested but this machine has {available_devices} {what}"
                                 f" (run more plan devices on fewer GPUs with --ndevices N --gpu-devices "
                                 f"{','.join(str(i) for i in range(max(1, available_devices)))})")
        self.device_ids = tuple(device_ids)
        self.nworkers = len(device_ids)
        self.ndevices = int(ndevices) if ndevices is not None else self.nworkers
        self.comm_model: CommModel | None = None
        self._comm_model_given = comm_model or CommModel()
        if self.ndevices > self.nworkers:
            self.comm_model = self._comm_model_given
        if bench_iters < 1 or warmup_iters < 0:
            raise ShardError("bench_iters must be >= 1 and warmup_iters >= 0")
        self.bench_iters, self.warmup_iters = int(bench_iters), int(warmup_iters)
        self.comm_iters = (int(comm_iters) if comm_iters is not None else
                           max(self.bench_iters, CPU_MIN_COMM_ITERS) if self.device_type == "cpu" else self.bench_iters)
        if compute_passes is None and self.device_type == "cpu":
            compute_passes = DEFAULT_CPU_COMPUTE_PASSES
        self.compute_passes = max(1, int(compute_passes)) if compute_passes is not None else None
        self.optimizer = normalize_optimizer(optimizer)
        self.precision = normalize_precision(precision)
        self.dataset_dir = str(Path(dataset_dir))
        self.dataset = load_dataset(self.dataset_dir)
        self.batch_size = resolve_batch_size(self.dataset, batch_size)
        self.timeout_s = float(timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self.host_lock = bool(host_lock)
        self.lock_timeout_s = float(lock_timeout_s)
        self._dataset_digest = dataset_digest(self.dataset)
        self._device_name: str | None = None
        self._host0: str | None = None
        self._hosts: list[int] | None = None   # torchrun: each rank's node (GROUP_RANK), once they connected
        self._procs: list | None = None
        self._conns: list | None = None
        self._store = None
        self._req = 0
        self.startup_s: float | None = None
        self._noise: list[float] = []   # relative spread of each measured shard's timed samples
        self._scales: list[float] = []  # CPU, speed_rules: the window rule's speed factor of each measurement
        # CPU: the reference blocks of the last samples, whatever shard each was beside (at_nominal_speed)
        self._speed_window: "collections.deque[float]" = collections.deque(maxlen=SPEED_WINDOW)
        # CPU: per shard of the last compute measurement, its cost under each speed rule (SPEED_RULES)
        self.speed_rule_costs: dict[int, dict[str, ComputeCost]] = {}
        self._session_refs: list[float] = []
        self.reference_nominal_ms: float | None = None   # CPU: see reference_nominal()
        self.reference_store = None      # CPU: where the nominal is kept (the cache layer sets it)
        self._generation = 0
        _LIVE.add(self)

    @property
    def topology(self) -> tuple[int, int]:
        """(hosts, devices per host) of the devices that measure."""
        if self._env is None:
            return 1, self.nworkers
        return max(1, self._env.world_size // max(1, self._env.local_world_size)), self._env.local_world_size

    def _who(self, rank: int, short: bool = False) -> str:
        """How a failure names a worker: ``device r worker`` (``device r``), or under torchrun
        ``rank r on host H``."""
        proc = self._procs[rank] if self._procs and rank < len(self._procs) else None
        if hasattr(proc, "label"):
            return proc.label()
        if self._env is not None:
            return f"rank {rank} on host {self._host0 or '?'}"
        return f"device {rank}" if short else f"device {rank} worker"

    # -- what is measured --------------------------------------------------------------------
    @property
    def oversubscribed(self) -> bool:
        """More plan devices than devices that run (compute in turns, communication modelled)."""
        return self.ndevices > self.nworkers

    @property
    def hardware(self) -> str:
        """The hardware in words, for every figure this evaluator produces."""
        hosts, per_host = self.topology
        if self.device_type == "cuda":
            name = self._device_name or "GPU"
            where = f"{self.nworkers} x {name}" if hosts == 1 else f"{hosts} hosts x {per_host} x {name}"
        else:
            from shardcore.oracles.setting import cpu_cores, cpu_name

            where = f"CPU ({cpu_name()}, {cpu_cores()} cores), {self.nworkers} logical device(s)"
            if hosts > 1:
                where += f" on {hosts} hosts x {per_host} (torchrun)"
        if self.oversubscribed:
            where += f", {self.ndevices} plan devices measured in turns"
        return where

    @property
    def parts(self) -> dict:
        """How each cost part is obtained: ``{"compute": ..., "comm": ...}``; under torchrun also
        ``"hosts"``, each rank's (device's) torchrun node, once the ranks have connected."""
        compute = f"measured ({self.device_type}, FBGEMM)"
        if self.device_type == "cpu":
            compute = "measured (cpu, FBGEMM; the lower quartile of the shard's warm samples, wall clock)"
        if self.ndevices == 1:
            comm = "none (one device)"
        elif self.comm_model is None:
            hosts = self.topology[0]
            comm = (f"measured ({'NCCL' if self.device_type == 'cuda' else 'gloo'} all-to-all"
                    + (f" across {hosts} hosts" if hosts > 1 else "")
                    + ": input ids and pooled outputs; data-parallel all-reduce"
                    + ("; lower quartile of the repetitions" if self.device_type == "cpu" else "")
                    + ")")
        else:
            comm = self.comm_model.describe()
        out = {"compute": compute, "comm": comm}
        if self._hosts is not None:   # torchrun: the node of each rank (device), so which pairs share a host
            out["hosts"] = list(self._hosts)
        return out

    @property
    def fits_exchange(self) -> bool:
        """Whether the modelled exchange is (or, once started, will be) fitted to the workers' measured
        all-to-alls (more plan devices than two or more workers), not the analytic model it was given."""
        return self.comm_model is not None and (self.comm_model.source == "fitted" or self.nworkers >= 2)

    @property
    def info(self) -> OracleInfo:
        """The device kind, the workers' start-up time and the noise so far (:class:`~shardcore.types.OracleInfo`)."""
        return OracleInfo(self.device_type, self.startup_s, self.noise_pct)

    @property
    def noise_pct(self) -> float | None:
        """The oracle's measurement noise so far: the median over measured shards of the relative
        interquartile range of their timed samples (fw + bw), in percent; None before any shard."""
        if not self._noise:
            return None
        return 100.0 * float(statistics.median(self._noise))

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> "PlanEvaluator":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def running(self) -> bool:
        return self._procs is not None

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self._procs] if self._procs else []

    @property
    def context(self) -> CacheContext:
        """The cache setting of this evaluator's measurements."""
        if self.device_type == "cuda":
            if self._device_name is None:
                self.start()
            hw = hardware_fingerprint(self._device_name, 1)
        else:
            hw = hardware_fingerprint(None, 1)
        if self._env is not None:   # several hosts: the exchange is not a one-host one
            hw += "|topology={}x{}".format(*self.topology)
        return CacheContext(hw, self._dataset_digest, self.batch_size, self.optimizer, self.precision)

    def start(self) -> None:
        """Start the workers (done by ``with`` and, if needed, by the first measurement)."""
        if self._procs is not None:
            return
        import torch.distributed as dist

        t0 = time.perf_counter()
        ctx = worker_context(self.device_type)
        forked = ctx.get_start_method() == "forkserver"
        remote: list = []
        if self._env is None:
            self._store = dist.TCPStore("127.0.0.1", 0, None, True,
                                        datetime.timedelta(seconds=self.start_timeout_s), wait_for_workers=False)
            cfg = WorkerConfig(self.dataset_dir, self.device_type, self.device_ids, self._store.port,
                                max(self.timeout_s, 30.0), os.getpid(), self._pool_cap_bytes(), forked=forked)
        else:   # torchrun: the other ranks connect; rank 0's own device gets a local worker below
            from shardcore.oracles.measured.launch import PG_PREFIX, accept_ranks

            if self._generation > 0:
                raise ShardError("--launcher torchrun: the serving ranks are gone after a failure; start the "
                                 "command again")
            self._generation += 1
            remote, self._host0 = accept_ranks(self._env, self.start_timeout_s)
            self._hosts = [self._env.group_rank] + [rr.group_rank for rr in remote]
            self.device_ids = (self._env.local_rank,) + tuple(rr.local_rank for rr in remote)
            cfg = WorkerConfig(self.dataset_dir, self.device_type, self.device_ids, self._env.master_port,
                                max(self.timeout_s, 30.0), os.getpid(), self._pool_cap_bytes(),
                                self._env.master_addr, f"{PG_PREFIX}/{os.getpid()}/{self._generation}",
                                forked=forked)
            for rr in remote:
                rr.conn.send(["config", {"dataset_dir": os.path.abspath(cfg.dataset_dir),
                                         "device_type": cfg.device_type, "device_ids": list(cfg.device_ids),
                                         "store_port": cfg.store_port, "pg_timeout_s": cfg.pg_timeout_s,
                                         "pool_cap_bytes": cfg.pool_cap_bytes, "store_host": cfg.store_host,
                                         "store_prefix": cfg.store_prefix}])
        procs, conns = [], []
        # Children inherit an ignored SIGINT through exec, so a Ctrl-C meant for the parent never
        # interrupts a worker, not even while it is still importing torch.
        main_thread = threading.current_thread() is threading.main_thread()
        old_handler = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
        try:
            try:
                for rank in range(self.nworkers - len(remote)):
                    parent_end, child_end = ctx.Pipe(duplex=True)
                    p = ctx.Process(target=run_then_exit, args=(worker_main, rank, self.nworkers, child_end, cfg),
                                    name=f"shardcore-device-{rank}", daemon=True)
                    p.start()
                    child_end.close()
                    procs.append(p)
                    conns.append(parent_end)
            finally:
                if main_thread:
                    signal.signal(signal.SIGINT, old_handler)
            procs += remote
            conns += [rr.conn for rr in remote]
            self._procs, self._conns = procs, conns
            replies = self._wait(list(range(self.nworkers)), None, self.start_timeout_s, "start-up")
        except BaseException:
            self._procs = self._conns = None
            self._store = None
            self._kill_workers(procs)
            raise
        self._device_name = replies[0][2] if self.device_type == "cuda" else None
        self.startup_s = time.perf_counter() - t0

    def _pool_cap_bytes(self) -> int:
        """Per-worker cap of reusable weight buffers: a quarter of the host's available memory,
        shared by the workers, and at most 2 GiB each (see :class:`~shardcore.oracles.measured.benchmark.BufferPool`)."""
        from shardcore.oracles.measured.benchmark import host_available_bytes

        return int(min(2 << 30, host_available_bytes() // (4 * self.nworkers)))

    def close(self) -> None:
        """Stop the workers (politely, then by force)."""
        procs, conns = self._procs, self._conns
        self._procs = self._conns = None
        if procs is None:
            return
        for c in conns:
            try:
                c.send(("exit", None))
            except Exception:
                pass
        deadline = time.monotonic() + 5.0
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        self._kill_workers(procs)
        for c in conns:
            try:
                c.close()
            except Exception:
                pass
        self._store = None

    def _kill_workers(self, procs) -> None:
        for p in procs:
            if p.is_alive():
                try:
                    p.kill()
                except Exception:
                    pass
        for p in procs:
            p.join(5.0)

    def _abort(self) -> None:
        """Kill every worker now (after a failure or Ctrl-C); the next call starts new ones."""
        procs, conns = self._procs, self._conns
        self._procs = self._conns = None
        self._store = None
        if procs:
            self._kill_workers(procs)
        for c in conns or []:
            try:
                c.close()
            except Exception:
                pass

    # -- messaging ---------------------------------------------------------------------------
    def _send(self, rank: int, msg: tuple) -> None:
        try:
            self._conns[rank].send(msg)
        except (BrokenPipeError, EOFError, OSError):
            code = self._procs[rank].exitcode if self._procs else None
            who = self._who(rank)
            self._abort()
            raise ShardError(f"{who} {_describe_exit(code)}; all workers stopped") from None

    def _wait(self, ranks: list[int], req, timeout: float, phase: str) -> dict:
        """Replies of ``ranks`` to request ``req``; any worker death or the deadline is fatal."""
        deadline = time.monotonic() + timeout
        pending = set(ranks)
        replies: dict = {}
        errors: list[tuple[int, str, str]] = []
        by_conn = {self._conns[r]: r for r in range(self.nworkers)}
        by_sentinel = {self._procs[r].sentinel: r for r in range(self.nworkers) if self._procs[r].sentinel is not None}
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                late = sorted(pending)
                label = self._who(late[0])
                self._abort()
                raise ShardError(
                    f"{label} did not finish {phase} within {timeout:g} s "
                    f"(hung?{' ' + str(len(late)) + ' workers late' if len(late) > 1 else ''}); "
                    "all workers stopped")
            ready = mp_wait(list(by_conn) + list(by_sentinel), timeout=remaining)
            dead = []
            for obj in ready:
                if obj in by_conn:
                    r = by_conn[obj]
                    try:
                        msg = obj.recv()
                    except (EOFError, OSError):
                        dead.append(r)
                        continue
                    if phase == "start-up":
                        if msg[0] == "ready":
                            replies[r] = msg
                        else:
                            errors.append((r, "start", msg[-1]))
                        pending.discard(r)
                    elif msg[1] != req:
                        continue  # a stale reply
                    elif msg[0] == "ok":
                        replies[r] = msg[2]
                        pending.discard(r)
                    else:
                        errors.append((r, msg[2], msg[3]))
                        pending.discard(r)
                else:
                    r = by_sentinel[obj]
                    if not self._conns[r].poll():
                        dead.append(r)
            if dead:
                r = dead[0]
                proc = self._procs[r]
                proc.join(0.5)
                code = proc.exitcode
                who, remote = self._who(r), hasattr(proc, "label")
                self._abort()
                said = [text for rank, _kind, text in errors if rank == r]
                if said:  # it explained itself before exiting
                    what = "failed to start" if phase == "start-up" else "failed"
                    raise ShardError(f"{who} {what}: {said[0]}; all workers stopped")
                how = ("stopped answering (its connection closed: the process exited or was killed)" if remote
                       else _describe_exit(code))
                raise ShardError(f"{who} {how} during {phase}; all workers stopped")
            if errors and phase in ("start-up", "comm"):
                break  # collectives are involved: do not wait for peers that may never answer
        if errors and phase == "comm" and self._env is not None:
            # a peer's "connection closed" in a collective usually means another rank died: name that one
            gone = self._first_dead(settle_s=2.0)
            if gone is not None:
                who = self._who(gone)
                self._abort()
                raise ShardError(f"{who} stopped answering (its connection closed: the process exited or was "
                                 f"killed) during {phase}; all workers stopped")
        if errors:
            r, kind, text = errors[0]
            who, short = self._who(r), self._who(r, short=True)
            if phase == "start-up":
                self._abort()
                raise ShardError(f"{who} failed to start: {text}")
            if kind == "user":
                if phase == "comm":
                    self._abort()
                raise ShardError(f"{short}: {text}")
            self._abort()
            raise ShardError(f"{short}: {text}; all workers stopped")
        return replies

    def _first_dead(self, settle_s: float) -> int | None:
        """The first worker whose process is gone or whose connection is closed, waiting up to
        ``settle_s`` for the news to arrive; None if all still answer."""
        deadline = time.monotonic() + settle_s
        while True:
            for r in range(self.nworkers):
                proc, conn = self._procs[r], self._conns[r]
                if proc.sentinel is not None and not proc.is_alive():
                    return r
                try:
                    while conn.poll(0):
                        conn.recv()   # late replies are stale now; an EOF means the peer is gone
                except (EOFError, OSError):
                    return r
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)

    def _request(self, ranks: list[int], make_msg, phase: str) -> dict:
        self.start()
        self._req += 1
        req = self._req
        lock = (host_measurement_lock(self.lock_timeout_s) if self.device_type == "cpu" and self.host_lock
                else contextlib.nullcontext())
        try:
            with lock:  # no other process measures on this machine meanwhile
                for r in ranks:
                    self._send(r, make_msg(r, req))
                return self._wait(ranks, req, self.timeout_s, phase)
        except KeyboardInterrupt:
            self._abort()
            raise

    # -- measurements ------------------------------------------------------------------------
    def _check_shards(self, shards: Sequence[Sequence[TableConfig]]) -> list[list[TableConfig]]:
        if len(shards) != self.ndevices:
            raise ShardError(f"plan has {len(shards)} shards but the evaluator runs {self.ndevices} devices")
        out = []
        for d, shard in enumerate(shards):
            shard = list(shard)
            validate_tables(self.dataset, shard, what=f"device {d}")
            out.append(shard)
        return out

    def _usable(self) -> int | None:
        """Host memory usable by one shard (CPU: one shard is built at a time); None on GPUs."""
        return usable_bytes("cpu") if self.device_type == "cpu" else None

    def _compute(self, shards: dict[int, list[TableConfig]], ranks: dict[int, int] | None = None
                 ) -> dict[int, ComputeCost]:
        """Compute costs of ``shards`` (key -> tables), each on worker ``ranks[key]`` (default: key).

        CPU: one shard at a time, in ``compute_passes`` passes over all shards (see the module notes);
        GPU: one shard per device in flight, all devices at once, one pass.
        """
        ranks = ranks or {k: k % self.nworkers for k in shards}
        usable = self._usable()
        if usable is not None:
            for k, tables in shards.items():  # refuse before anything is built anywhere
                check_fits(tables, self.precision, self.optimizer, "cpu", what=f"device {ranks[k]} shard",
                           usable=usable)
        if self.device_type == "cpu":
            passes = self.bench_iters if self.compute_passes is None else min(self.compute_passes, self.bench_iters)
        else:
            passes = min(self.compute_passes or 1, self.bench_iters)
        per = -(-self.bench_iters // passes)
        counts = [c for c in (min(per, self.bench_iters - p * per) for p in range(passes)) if c > 0]
        samples: dict[int, tuple[list[float], list[float]]] = {k: ([], []) for k in shards}

        # Chunks with at most one shard per worker, so each worker keeps its operator across passes.
        chunks, todo = [], list(shards)
        while todo:
            chunk, used = [], set()
            for k in list(todo):
                if ranks[k] not in used:
                    chunk.append(k)
                    used.add(ranks[k])
                    todo.remove(k)
            chunks.append(chunk)

        cpu = self.device_type == "cpu"
        refs: dict[int, list[float]] = {k: [] for k in shards}   # CPU: the speed of each sample's moment
        besides: dict[int, list[float]] = {k: [] for k in shards}   # CPU: the reference blocks around it alone
        sessions: dict[int, list[float]] = {k: [] for k in shards}   # CPU: every reference block of the session so far
        for chunk in chunks:
            for p, n in enumerate(counts):
                keep = p < len(counts) - 1
                msgs = {ranks[k]: ("compute", shards[k], self.batch_size, self.optimizer, self.precision,
                                   self.warmup_iters, REWARM_ITERS, n, usable, keep, cpu and self.speed_rules) for k in chunk}
                # CPU: one device at a time, nothing else computes meanwhile; GPU: all at once
                groups = [[k] for k in chunk] if cpu else [chunk]
                for group in groups:
                    rs = [ranks[k] for k in group]
                    reps = self._request(rs, lambda r, req: (msgs[r][0], req) + msgs[r][1:], "compute")
                    for k in group:
                        samples[k][0].extend(reps[ranks[k]]["fw"])
                        samples[k][1].extend(reps[ranks[k]]["bw"])
                        if cpu and self.speed_rules:   # the reference blocks around this measurement, and before it
                            n_k, beside = len(reps[ranks[k]]["fw"]), statistics.median(reps[ranks[k]]["ref"])
                            self._speed_window.append(beside)
                            refs[k].extend([statistics.median(self._speed_window)] * n_k)
                            besides[k].extend([beside] * n_k)
                            self._session_refs.append(beside)
                            sessions[k].extend([statistics.median(self._session_refs)] * n_k)
        if not cpu:
            for fw, bw in samples.values():
                self._noise.append(relative_iqr([f + b for f, b in zip(fw, bw)]))
            return {k: ComputeCost(float(statistics.median(fw)), float(statistics.median(bw)))
                    for k, (fw, bw) in samples.items()}
        # CPU: the lower quartile of the shard's warm samples (see the module notes); with speed_rules also
        # every sample over the speed of its moment by each rule, for tools/cpu_truth.py
        out = {k: ComputeCost(low_quantile(fw), low_quantile(bw)) for k, (fw, bw) in samples.items()}
        for fw, bw in samples.values():
            self._noise.append(relative_iqr([f + b for f, b in zip(fw, bw)]))
        self.speed_rule_costs = {}
        if self.speed_rules:
            nominal = self.reference_nominal()
            for k, (fw, bw) in samples.items():
                self.speed_rule_costs[k] = {"none": out[k], "window": at_nominal_speed(fw, bw, refs[k], nominal),
                                            "beside": at_nominal_speed(fw, bw, besides[k], nominal),
                                            "session": at_nominal_speed(fw, bw, sessions[k], nominal)}
            self._speed_scale([r for rs in refs.values() for r in rs])
        return out

    # -- repeatability on the CPU (see the module notes) ----------------------------------------
    def _reference_samples(self, n: int) -> list[float]:
        """``n`` timed fw+bw samples (ms) of the reference shard on worker 0, after one untimed one."""
        rep = self._request([0], lambda r, req: ("ref", req, self.batch_size, self.optimizer, self.precision,
                                                 self.warmup_iters, int(n)), "reference")
        return [f + b for f, b in zip(rep[0]["fw"], rep[0]["bw"])]

    @property
    def reference_key(self) -> str:
        """What the reference's nominal cost depends on: the hardware, batch, optimizer and precision."""
        return json.dumps([hardware_fingerprint(None, 1), self.batch_size, self.optimizer, self.precision])

    def reference_nominal(self) -> float:
        """The reference shard's nominal cost (ms) on this machine: the stored one
        (``reference_store``, the measurement cache) or, the first time, calibrated now
        (``REFERENCE_CALIBRATION_ITERS`` one-sample requests, their median) and stored."""
        if self.reference_nominal_ms is None:
            store = self.reference_store
            value = store.reference_ms(self.reference_key) if store is not None else None
            if value is None:
                samples = [x for _ in range(REFERENCE_CALIBRATION_ITERS) for x in self._reference_samples(1)]
                value = statistics.median(samples)
                if store is not None:
                    value = store.store_reference_ms(self.reference_key, value)
            self.reference_nominal_ms = float(value)
        return self.reference_nominal_ms

    def _speed_scale(self, refs: Sequence[float]) -> float:
        """nominal / now: the factor that brings costs measured beside ``refs`` to the nominal speed."""
        now = statistics.median(refs)
        scale = self.reference_nominal() / now if now > 0 else 1.0
        self._scales.append(scale)
        return scale

    @property
    def speed_drift_pct(self) -> float | None:
        """How far the machine's speed moved during this session by the reference (CPU with speed_rules):
        (largest / smallest window speed factor - 1) in percent; None before two such measurements."""
        if len(self._scales) < 2:
            return None
        return 100.0 * (max(self._scales) / min(self._scales) - 1.0)

    def measure_comm(self, layout: CommLayout, delays_ms: Sequence[float] | None = None
                     ) -> tuple[list[tuple[float, float]], list[CommSplits]]:
        """Time the exchange of ``layout``: the two all-to-alls when device ``d`` holds a total dim of
        ``layout.dim_sums[d]``, plus what else the layout moves.

        ``delays_ms[d]`` (optional) makes device ``d`` start its forward exchange that much later
        (mimicking imbalanced compute); the others' forward times then include the wait.
        Returns per device ``(fw_ms, bw_ms)`` and the split sizes. With more plan devices than
        workers the times come from the communication model (``delays_ms`` is then refused: a
        model has no waiting peers). A layout of a plan (:func:`~shardcore.oracles.measured.shardings.comm_layout`)
        adds its input-id distribution and data-parallel all-reduce (and the row-wise local sums), as
        :meth:`evaluate` always does; ``CommLayout(dim_sums)`` alone, the pooled all-to-alls.
        """
        dim_sums = layout.dim_sums
        if len(dim_sums) != self.ndevices:
            raise ShardError(f"need {self.ndevices} dim sums, got {len(dim_sums)}")
        dims = [int(x) for x in dim_sums]
        if min(dims) < 0:
            raise ShardError("dim sums must be non-negative")
        if delays_ms is not None and len(delays_ms) != self.ndevices:
            raise ShardError(f"need {self.ndevices} delays, got {len(delays_ms)}")
        if self.oversubscribed:
            if delays_ms is not None:
                raise ShardError("start delays need the real all-to-all: run as many devices as the plan has")
            model = self.calibrate_comm()
            splits = [comm_splits(dims, self.batch_size, d) for d in range(self.ndevices)]
            times = model.predict(dims, self.batch_size)
            if layout.special:
                times = model_extra(model, times, layout, self.precision)
            return times, splits
        delays = [float(x) for x in delays_ms] if delays_ms is not None else None
        return self._measure_comm_workers(dims, delays, layout)

    def calibrate_comm(self) -> CommModel:
        """The communication model of an oversubscribed evaluator: with two or more workers, fitted
        once to their measured all-to-alls (four sizes, equal and unequal dim sums); with one, the
        analytic model given to the constructor."""
        if self.nworkers < 2 or self.comm_model is None or self.comm_model.source == "fitted":
            return self.comm_model or self._comm_model_given
        if self._hosts is not None and len(set(self._hosts)) > 1:
            self.comm_model = self._calibrate_two_levels()
            return self.comm_model
        n = self.nworkers
        pts: list[tuple[int, float]] = []
        for scale in (16, 64, 256, 1024):
            for dims in ([scale] * n, [scale * (1 + (j % 2) * 3) for j in range(n)]):
                costs, _ = self._measure_comm_workers(dims, None)
                for (sent, recv), (fw, bw) in zip(remote_bytes(dims, self.batch_size), costs):
                    pts.append((max(sent, recv), fw))
                    pts.append((max(sent, recv), bw))
        link = (f"fitted to NCCL all-to-alls between {n} x {self._device_name or 'GPU'}" if self.device_type == "cuda"
                else f"fitted to gloo all-to-alls between {n} local CPU processes")
        self.comm_model = fit_comm_model(pts, link)
        return self.comm_model

    def _calibrate_two_levels(self) -> CommModel:
        """Under torchrun on several hosts: each level fitted apart, from exchanges that stay within the
        hosts (every rank to its host's other ranks only) and from exchanges that only cross them (every
        rank to every rank of the other hosts), four sizes each; the model of
        :class:`~shardcore.oracles.commmodel.CommModel` with ``devices_per_host`` the ranks per host (an
        all-to-all over every rank mixes the two levels in a fixed ratio, so it cannot tell them apart)."""
        n, hosts = self.nworkers, list(self._hosts)
        per_host = {h: hosts.count(h) for h in hosts}
        if len(set(per_host.values())) != 1 or hosts != sorted(hosts):
            raise ShardError(f"torchrun: the ranks' hosts {hosts} are not equal consecutive groups; the exchange "
                             "between hosts cannot be modelled for them")
        g = per_host[hosts[0]]
        fits = []
        for same in (True, False):
            pts: list[tuple[int, float]] = []
            for k in (1 << 10, 1 << 12, 1 << 14, 1 << 16):   # int64 elements to each peer of the level
                matrix = [[k if s != d and (hosts[s] == hosts[d]) == same else 0 for d in range(n)] for s in range(n)]
                reps = self._request(list(range(n)), lambda r, req: (
                    "comm", req, [0] * n, self.batch_size, self.warmup_iters, self.comm_iters, None,
                    {"ids_send": matrix}), "comm")
                for r in range(n):
                    pts.append((8 * sum(1 for x in matrix[r] if x) * k, reps[r]["fw_ms"]))
            fits.append(fit_comm_model(pts, "level"))
        intra, inter = fits
        kind = "NCCL" if self.device_type == "cuda" else "gloo"
        return CommModel(bandwidth_gbps=intra.bandwidth_gbps, latency_us=intra.latency_us, source="fitted",
                         link=f"fitted to {kind} exchanges within and between {len(per_host)} torchrun hosts of {g}",
                         devices_per_host=g, inter_bandwidth_gbps=inter.bandwidth_gbps,
                         inter_latency_us=inter.latency_us)

    def _measure_comm_workers(self, dims: list[int], delays: list[float] | None, layout=None
                              ) -> tuple[list[tuple[float, float]], list[CommSplits]]:
        """The all-to-alls measured by the workers (on the CPU the lower quartile of the repetitions)."""
        extra = None
        if layout is not None and layout.special:
            extra = {"ids_send": layout.ids_send, "allreduce": layout.allreduce,
                     "rw_sums": [[list(p) for p in grp] for grp in layout.rw_sums],
                     "allreduce_dtype": "float16" if self.precision == "fp16" else "float32"}
        reps = self._request(list(range(self.nworkers)),
                             lambda r, req: ("comm", req, dims, self.batch_size, self.warmup_iters,
                                             self.comm_iters, delays, extra), "comm")
        costs, splits = [], []
        for r in range(self.nworkers):
            rep = reps[r]
            costs.append((rep["fw_ms"], rep["bw_ms"]))
            splits.append(CommSplits(r, tuple(rep["fw_send"]), tuple(rep["fw_recv"]),
                                     tuple(rep["bw_send"]), tuple(rep["bw_recv"])))
        return costs, splits

    def measure_devices(self, shards: Sequence[Sequence[TableConfig]], no_cache: bool | None = None
                       ) -> list[ComputeCost]:
        """Compute costs of many single shards (e.g. cost-model training data), each measured once
        (duplicates share one measurement; empty shards cost nothing). ``no_cache`` is for a cache
        layer around the evaluator; the evaluator itself always measures.

        On the CPU they are measured one after another; on GPUs spread over the devices.
        """
        shards = [list(s) for s in shards]
        for k, s in enumerate(shards):
            validate_tables(self.dataset, s, what=f"shard {k}")
        out: list[ComputeCost | None] = [None] * len(shards)
        todo: dict[int, list[TableConfig]] = {}
        first_of: dict = {}  # shard key -> position of its first occurrence (duplicates measured once)
        for k, s in enumerate(shards):
            if not s:
                out[k] = ComputeCost(0.0, 0.0)
                continue
            first_of.setdefault(shard_key(s), k)
            if first_of[shard_key(s)] == k:
                todo[k] = s
        if todo:
            for k, cost in self._compute(todo, {k: i % self.nworkers for i, k in enumerate(todo)}).items():
                out[k] = cost
        for k, s in enumerate(shards):
            if out[k] is None:
                out[k] = out[first_of[shard_key(s)]]
        return out  # type: ignore[return-value]

    # -- the oracle interface (shardcore.types.ShardCostOracle) --------------------------------
    @property
    def comm_measured(self) -> bool:
        """Whether the plans' all-to-alls are measured (not modelled): only such plans are cached."""
        return not self.oversubscribed

    def check_devices(self, shards: Sequence[Sequence[TableConfig]]) -> list[list[TableConfig]]:
        """The plan as lists, one shard per device and every table known, or a one-line error."""
        return self._check_shards(shards)

    def evaluate(self, shards: Sequence[Sequence[TableConfig]], no_cache: bool | None = None, *,
                 compute: "dict[int, ComputeCost] | None" = None) -> PlanResult:
        """Measure a plan (``shards[d]``: the tables on device ``d``); see the module notes.

        ``compute[d]``, when given, is device ``d``'s compute cost known already (a cache layer's
        hit): only the other devices' compute is measured, and ``compute_from_cache[d]`` is set.
        ``no_cache`` is for a cache layer; the evaluator itself always measures."""
        t0 = time.perf_counter()
        shards = self._check_shards(shards)
        known = dict(compute or {})
        costs_c: dict[int, ComputeCost] = {}
        # The step's exchanges (shardcore.oracles.measured.shardings.comm_layout): every model-parallel table's input
        # ids, the pooled outputs (with row-wise partials), the data-parallel all-reduce.
        layout = None
        if self.ndevices > 1:
            from shardcore.oracles.measured.shardings import comm_layout

            layout = comm_layout(self.dataset, shards, self.batch_size)
        todo: dict[int, list[TableConfig]] = {}
        from_cache = [False] * self.ndevices
        for d, s in enumerate(shards):
            if not s:
                costs_c[d] = ComputeCost(0.0, 0.0)
            elif d in known:
                costs_c[d] = known[d]
                from_cache[d] = True
            else:
                todo[d] = s
        if todo:
            costs_c.update(self._compute(todo))
        dims = layout.dim_sums if layout is not None else [sum(t.dim for t in s) for s in shards]
        if self.oversubscribed:
            comm, splits = self.measure_comm(layout if layout is not None else CommLayout([int(x) for x in dims]))
        else:
            comm, splits = self._measure_comm_workers([int(x) for x in dims], None, layout)
        costs = [list(DeviceCost(fw_comp=costs_c[d].fw_ms, fw_comm=comm[d][0], bw_comm=comm[d][1],
                                 bw_comp=costs_c[d].bw_ms)) for d in range(self.ndevices)]
        return PlanResult(costs, from_cache=False, compute_from_cache=from_cache, comm=splits,
                          wall_s=time.perf_counter() - t0, parts=self.parts, hardware=self.hardware)
