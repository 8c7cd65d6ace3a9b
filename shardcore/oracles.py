"""Cost oracles: which landscape a plan is judged on, chosen with ``--oracle``.

- ``measured`` (default): this machine's hardware, :class:`~shardcore.evaluator.PlanEvaluator`
  (FBGEMM on the CPU or on CUDA GPUs, real all-to-alls, or modelled ones when the plan has more
  devices than the machine has GPUs).
- ``emulated:h200``: an NVIDIA H200 emulated from real measurements (:class:`EmulatedOracle`):
  each shard's forward and backward compute from :mod:`shardcore.emulator`'s model fitted on the
  shipped H200 shard measurements (``data/gpu_measurements/``), a device's model-parallel pieces
  as one kernel at the batch and its data-parallel replicas as another at its batch slice
  (:func:`~shardcore.emulator.predict_devices`); the exchanges from the analytic
  :class:`~shardcore.commmodel.CommModel`: the pooled all-to-all (without data-parallel replicas,
  which send nothing), every model-parallel table's input-id all-to-all (forward, ids expected from
  the tables' pooling factors) and a data-parallel table's gradient all-reduce (backward), as the
  measured evaluator runs them, at the same bandwidth and latency
  (:meth:`~shardcore.commmodel.CommModel.exchange_ms`). **Held out** (the default, ``--emulator-fit
  heldout``): the compute model that judges a plan is the emulator refitted without every measured
  shard that holds one of the plan's tables (:func:`shardcore.emulator.heldout_model`), so a judge
  never saw the tables it judges; ``--emulator-fit full`` uses the shipped fit. It needs only the table configs (no
  ``data.pt``), no workers and no cache, and answers in microseconds, so every trainer can use it.

Both implement :class:`~shardcore.types.ShardCostOracle`, give the same
:class:`~shardcore.types.PlanResult` (per device ``[fw_comp, fw_comm, bw_comm, bw_comp]`` ms, plan
cost = the slowest device) and say in ``hardware`` and ``parts`` what the figures stand for.
:func:`open_oracle` is the one place either is built, the measured one wrapped in the measurement
cache (:class:`~shardcore.cache.CachedOracle`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Sequence

from .benchmark import ComputeCost, normalize_optimizer, normalize_precision
from .cache import CacheContext
from .commmodel import PIECES_NOTE, CommModel, allreduce_bytes, id_width, pooled_width
from .errors import ShardError
from .tables import TableConfig
from .types import PlanResult

MEASURED = "measured"
EMULATED_PREFIX = "emulated:"
EMULATED_CARDS = ("h200",)
ORACLE_CHOICES = (MEASURED,) + tuple(EMULATED_PREFIX + c for c in EMULATED_CARDS)
CARD_NAMES = {"h200": "NVIDIA H200"}
HELDOUT, FULL = "heldout", "full"     # which fit of the emulated card judges a plan (EmulatedOracle's fit)
EMULATOR_FITS = (HELDOUT, FULL)


def parse_oracle(spec: str) -> str:
    """Canonical oracle name, or a one-line error naming the choices."""
    key = str(spec).strip().lower()
    if key in ("measured", "hardware", "hw"):
        return MEASURED
    if key.startswith("emulated-"):
        key = EMULATED_PREFIX + key[len("emulated-"):]
    if key in ORACLE_CHOICES:
        return key
    raise ShardError(f"unknown oracle {spec!r}: choose one of {', '.join(ORACLE_CHOICES)}")


def configs_batch_size(data_dir: str | os.PathLike) -> int | None:
    """The batch a dataset's lookups were taken at, from ``data.pt`` or a ``batch_size`` key in
    ``table_configs.json``; None when neither says."""
    from .dataset import CONFIGS_FILE, load_dataset

    path = Path(data_dir)
    try:
        with open(path / CONFIGS_FILE, "rb") as fh:
            obj = json.loads(fh.read().decode("utf-8"))
        if isinstance(obj, dict) and "batch_size" in obj:
            value = obj["batch_size"]
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
            raise ShardError(f"{path / CONFIGS_FILE}: batch_size must be a positive integer, got {value!r}")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        pass  # the dataset loader reports unreadable configs
    try:
        return load_dataset(path).batch_size
    except ShardError:
        return None


def _length_cv(data_dir: str, batch_size: int) -> list[float] | None:
    """Per table the coefficient of variation of its per-sample lookup counts, from ``data.pt``
    (the first ``batch_size`` samples); None without lookup data (the emulator then uses its table
    of known tables, see :mod:`shardcore.emulator`)."""
    import numpy as np

    from .dataset import load_dataset

    try:
        ds = load_dataset(data_dir)
    except ShardError:
        return None
    out = []
    for off in ds.offsets:
        n = min(batch_size, off.numel() - 1)
        lengths = np.diff(off[: n + 1].numpy().astype(np.int64))
        mean = float(lengths.mean()) if n > 0 else 0.0
        out.append(float(lengths.std() / mean) if mean > 0 else 0.0)
    return out


RESUME_LABELS = {"ndevices": "device count", "max_memory_gb": "memory cap (GB)", "precision": "weights precision",
                 "hardware": "oracle (hardware)", "dataset": "dataset", "batch_size": "batch size",
                 "optimizer": "optimizer"}


def training_provenance(oracle, ndevices: int, max_memory_gb: float, precision: str) -> dict:
    """What a training's measurements depend on (kept in its checkpoint): the devices, cap and
    precision, the oracle's hardware and, where it has a cache setting, the dataset, batch and
    optimizer. A resumed training must match it (:func:`check_resume`)."""
    out = {"ndevices": int(ndevices), "max_memory_gb": float(max_memory_gb), "precision": precision,
           "hardware": str(getattr(oracle, "hardware", ""))}
    try:
        ctx = getattr(oracle, "context", None)
    except Exception:  # noqa: BLE001 - an oracle without a cache setting
        ctx = None
    if ctx is not None:
        out.update(hardware=ctx.hardware, dataset=ctx.dataset, batch_size=int(ctx.batch_size),
                   optimizer=ctx.optimizer)
    return out


def check_resume(stored: dict, now: dict, anew: str) -> None:
    """``--resume`` continues only the training it saved: another oracle, device count, cap, dataset
    or batch would mix measurements of different settings in one model. ``anew``: how to start a
    separate training instead (e.g. ``"with another --xpid"``)."""
    for key, label in RESUME_LABELS.items():
        if key in stored and key in now and stored[key] != now[key]:
            raise ShardError(f"--resume: the checkpoint was trained with {label} {stored[key]!r}, this run has "
                             f"{now[key]!r}: measurements of different settings would be mixed; train anew {anew}")


def open_oracle(data_dir: str | os.PathLike, ndevices: int | None = None, *, oracle: str = MEASURED,
                device_ids: Sequence[int] | None = None, batch_size: int | None = None,
                optimizer: str = "exact_sgd", precision: str = "fp16", comm_model: CommModel | None = None,
                cache=None, no_cache: bool = False, **measure_kwargs):
    """The one place a cost oracle is built (:func:`shardcore.cli.open_evaluator` builds it from
    command-line flags). Use it as a context manager.

    ``oracle='measured'``: a :class:`~shardcore.evaluator.PlanEvaluator` for plans of ``ndevices``
    devices measured on ``device_ids`` (``measure_kwargs``: ``bench_iters``, ``warmup_iters``,
    ``timeout_s``, ``launcher``... as the evaluator takes them), wrapped in the measurement cache
    (:class:`~shardcore.cache.CachedOracle`) unless ``cache`` is None or False (``True``: the
    default file; a path; a :class:`~shardcore.cache.CostCache`). ``oracle='emulated:<card>'``: an
    :class:`EmulatedOracle` for ``ndevices`` devices (default ``len(device_ids)``), never cached (it
    answers in microseconds); the measuring arguments do not apply to it.
    """
    spec = parse_oracle(oracle)
    if spec.startswith(EMULATED_PREFIX):
        n = ndevices if ndevices is not None else (len(device_ids) if device_ids else 4)
        return EmulatedOracle(data_dir, n, card=spec[len(EMULATED_PREFIX):], batch_size=batch_size,
                              optimizer=optimizer, precision=precision, comm_model=comm_model,
                              fit=measure_kwargs.pop("emulator_fit", HELDOUT))
    from .cache import CachedOracle, open_cache
    from .evaluator import PlanEvaluator

    store = open_cache(cache)
    if store is not None:
        store.check_usable()   # an unusable --cache-path is found before any worker starts
    evaluator = PlanEvaluator(data_dir, ndevices, device_ids=device_ids, batch_size=batch_size, optimizer=optimizer,
                              precision=precision, comm_model=comm_model, **measure_kwargs)
    return evaluator if store is None else CachedOracle(evaluator, store, no_cache=no_cache)


class EmulatedOracle:
    """Plan costs on an emulated GPU (see the module notes): a
    :class:`~shardcore.types.ShardCostOracle` like :class:`~shardcore.evaluator.PlanEvaluator`
    (``evaluate``, ``measure_shards``, ``measure_comm``, context manager, ``batch_size``,
    ``ndevices``...). It keeps nothing; :class:`~shardcore.cache.CachedOracle` can wrap it."""

    cache = None     # a bare oracle keeps nothing
    no_cache = True
    comm_measured = False   # the exchange is modelled: a cache layer stores its shards, never its plans
    running = True
    worker_pids: list[int] = []
    bench_iters = 0
    warmup_iters = 0

    def __init__(self, dataset_dir: str | os.PathLike, ndevices: int = 4, *, card: str = "h200",
                 batch_size: int | None = None, optimizer: str = "exact_sgd", precision: str = "fp16",
                 comm_model: CommModel | None = None, fit: str = HELDOUT):
        from .dataset import load_dataset
        from .emulator import load_gpu_model

        if fit not in EMULATOR_FITS:
            raise ShardError(f"emulator fit must be one of {', '.join(EMULATOR_FITS)}, got {fit!r}")
        self.fit = fit
        if card not in EMULATED_CARDS:
            raise ShardError(f"no emulated GPU {card!r}: choose one of {', '.join(EMULATED_CARDS)}")
        if int(ndevices) < 1:
            raise ShardError(f"the oracle needs at least one device, got {ndevices}")
        self.card = card
        self.ndevices = int(ndevices)
        self.nworkers = 0
        self.optimizer = normalize_optimizer(optimizer)
        self.precision = normalize_precision(precision)
        if self.optimizer != "exact_sgd" or self.precision != "fp16":
            raise ShardError(f"emulated:{card} was measured with exact_sgd and fp16 weights only; "
                             f"got {self.optimizer} and {self.precision}")
        self.dataset_dir = str(Path(dataset_dir))
        self.dataset = load_dataset(self.dataset_dir, with_lookups=False)
        batch = batch_size if batch_size is not None else configs_batch_size(self.dataset_dir)
        if batch is None:
            raise ShardError(f"{self.dataset_dir}: no data.pt and no batch_size in its table configs; "
                             "give the batch the configs were taken at with --batch-size")
        self.batch_size = int(batch)
        if self.batch_size < 1:
            raise ShardError(f"batch size must be positive, got {self.batch_size}")
        self.model = load_gpu_model(card)
        self.length_cv = _length_cv(self.dataset_dir, self.batch_size)
        self.comm_model = comm_model or CommModel()
        self.device_type = f"emulated:{card}"
        self.startup_s = 0.0
        self.noise_pct = None
        self._ntables = self.dataset.num_tables

    # -- what is measured --------------------------------------------------------------------
    @property
    def hardware(self) -> str:
        held = ", held out: never fitted on a plan's own tables" if self.fit == HELDOUT else ""
        return (f"emulated {CARD_NAMES.get(self.card, self.card)} (compute model fitted on real "
                f"{CARD_NAMES.get(self.card, self.card)} measurements{held}), {self.ndevices} devices")

    @property
    def parts(self) -> dict:
        how = ("refitted per plan without the measured shards that hold any of its tables" if self.fit == HELDOUT
               else "the shipped fit on every measured shard")
        return {"compute": f"modelled (emulated:{self.card}, {how})",
                "comm": ("none (one device)" if self.ndevices == 1
                         else f"{self.comm_model.describe()}; {PIECES_NOTE}")}

    @property
    def context(self) -> CacheContext:
        from .cache import dataset_digest

        held = ":heldout" if self.fit == HELDOUT else ""   # a held-out answer depends on the plan's tables
        return CacheContext(f"emulated:{self.card}{held}", dataset_digest(self.dataset), self.batch_size,
                            self.optimizer, self.precision)

    # -- lifecycle (nothing to start) ----------------------------------------------------------
    def __enter__(self) -> "EmulatedOracle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    # -- costs -------------------------------------------------------------------------------
    def _check(self, tables: Sequence[TableConfig], what: str) -> list[TableConfig]:
        tables = list(tables)
        for t in tables:
            if not 0 <= t.index < self._ntables:
                raise ShardError(f"{what}: table id {t.index} out of range (the dataset has {self._ntables} tables)")
            if t.dim < 1:
                raise ShardError(f"{what}: table {t.index} has dim {t.dim}")
        return tables

    def compute_model(self, tables: Sequence[TableConfig]):
        """The compute model that judges a plan or shards holding ``tables``: the shipped fit, or (held
        out, the default) the fit without every measured shard that holds one of them
        (:func:`shardcore.emulator.heldout_model`; tables of another dataset were never measured)."""
        if self.fit == FULL:
            return self.model
        from .emulator import heldout_model, seen_tables

        seen = seen_tables(tables, self.card)
        return heldout_model(seen, self.card) if seen else self.model

    def measure_shards(self, shards: Sequence[Sequence[TableConfig]], no_cache: bool | None = None, *,
                       judged: Sequence[TableConfig] | None = None) -> list[ComputeCost]:
        """Each device's (fw, bw) compute; the held-out fit is the one without the tables of ``judged``
        (default: every table of ``shards``)."""
        from .emulator import predict_devices

        shards = [self._check(s, f"shard {k}") for k, s in enumerate(shards)]
        cv_of = None if self.length_cv is None else (lambda t: self.length_cv[t.index])
        model = self.compute_model([t for s in shards for t in s] if judged is None else judged)
        # a device's model-parallel pieces at the batch, its data-parallel replicas at its slice
        pred = predict_devices(model, shards, self.batch_size, cv_of)
        return [ComputeCost(float(fw), float(bw)) for fw, bw in pred]

    def measure_shard(self, tables: Sequence[TableConfig], no_cache: bool | None = None) -> ComputeCost:
        return self.measure_shards([tables])[0]

    def measure_comm(self, dim_sums: Sequence[int], delays_ms: Sequence[float] | None = None, *,
                     id_widths: Sequence[float] | None = None, allreduce: Sequence[float] | None = None):
        """Per device ``(fw_ms, bw_ms)`` of the pooled all-to-all of ``dim_sums`` and the split sizes;
        ``id_widths`` / ``allreduce`` (per device, :func:`~shardcore.commmodel.id_width` and
        :func:`~shardcore.commmodel.allreduce_bytes` sums) add a plan's input-id all-to-all
        (forward) and data-parallel all-reduce (backward)."""
        from .evaluator import comm_splits

        if len(dim_sums) != self.ndevices:
            raise ShardError(f"need {self.ndevices} dim sums, got {len(dim_sums)}")
        dims = [int(x) for x in dim_sums]
        if min(dims) < 0:
            raise ShardError("dim sums must be non-negative")
        for name, vals in (("id widths", id_widths), ("all-reduce sizes", allreduce)):
            if vals is not None and len(vals) != self.ndevices:
                raise ShardError(f"need {self.ndevices} {name}, got {len(vals)}")
        fw, bw = self.comm_model.exchange_ms(dims, self.batch_size, id_widths, allreduce)
        costs = [(float(f), float(b)) for f, b in zip(fw, bw)]
        if delays_ms is not None:  # a late starter makes the others wait in the forward exchange
            if len(delays_ms) != self.ndevices:
                raise ShardError(f"need {self.ndevices} delays, got {len(delays_ms)}")
            latest = max(float(x) for x in delays_ms)
            costs = [(fw + latest - float(dl), bw) for (fw, bw), dl in zip(costs, delays_ms)]
        return costs, [comm_splits(dims, self.batch_size, d) for d in range(self.ndevices)]

    def check_shards(self, shards: Sequence[Sequence[TableConfig]]) -> list[list[TableConfig]]:
        """The plan as lists, one shard per device and every table known, or a one-line error."""
        if len(shards) != self.ndevices:
            raise ShardError(f"plan has {len(shards)} shards but the oracle has {self.ndevices} devices")
        return [self._check(s, f"shard {d}") for d, s in enumerate(shards)]

    def evaluate(self, shards: Sequence[Sequence[TableConfig]], no_cache: bool | None = None, *,
                 compute: "dict[int, ComputeCost] | None" = None) -> PlanResult:
        """The plan's costs; ``compute[d]`` (a cache layer's hit) replaces device ``d``'s model."""
        t0 = time.perf_counter()
        shards = self.check_shards(shards)
        known = dict(compute or {})
        costs_c = self.measure_shards([[] if d in known else s for d, s in enumerate(shards)],
                                      judged=[t for s in shards for t in s])
        from_cache = [bool(s) and d in known for d, s in enumerate(shards)]
        costs_c = [known[d] if from_cache[d] else c for d, c in enumerate(costs_c)]
        n = self.ndevices
        comm, splits = self.measure_comm([sum(pooled_width(t) for t in s) for s in shards],
                                         id_widths=[sum(id_width(t) for t in s) for s in shards],
                                         allreduce=[sum(allreduce_bytes(t, n, self.precision) for t in s)
                                                    for s in shards])
        costs = [[c.fw_ms, f, b, c.bw_ms] for c, (f, b) in zip(costs_c, comm)]
        return PlanResult(costs, from_cache=False, compute_from_cache=from_cache, comm=splits,
                          wall_s=time.perf_counter() - t0, parts=self.parts, hardware=self.hardware)
