"""The emulated oracle: an NVIDIA H200 emulated from real measurements, chosen with
``--oracle emulated:h200`` (see :mod:`shardcore.oracles.factory`'s notes), or the device of a calibrated
card, ``--oracle emulated:<card file>`` (:mod:`shardcore.oracles.emulated.card`). Each shard's compute
comes from :mod:`shardcore.oracles.emulated.emulator`'s model (the card's fit), the exchanges from
:class:`~shardcore.oracles.commmodel.CommModel` (the analytic figures, or the card's measured ones unless
flags set others); it needs only the table configs and answers in microseconds. The held-out refits
(``fit`` heldout, devices) are made from the shipped H200 measurements; a card file judges with its own
fit, and says so."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Sequence

from shardcore.dataset import configs_batch_size
from shardcore.errors import ShardError
from shardcore.oracles.commmodel import PIECES_NOTE, CommModel, allreduce_bytes, comm_splits, id_width, pooled_width
from shardcore.oracles.setting import EXACT_SGD, normalize_optimizer, normalize_precision
from shardcore.oracles.emulated.model import FP32_NOTE
from shardcore.tables import TableConfig
from shardcore.types import CacheContext, CommLayout, CommSplits, ComputeCost, DeviceCost, OracleInfo, PlanResult
from shardcore.planning import (DEVICES, EMULATED_CARDS, EMULATOR_FITS, FULL, HELDOUT,  # noqa: F401  (re-exported)
                                check_emulator_fit, is_card_file)

CARD_NAMES = {"h200": "NVIDIA H200"}
# which fit of the emulated card judges a plan (EmulatedOracle's fit): held out by the plan's tables (the
# default), by its devices (never a shard made only of its tables; the tables seen mixed with others, as a
# learned method's training oracle sees them), or the shipped fit
HOLDOUT_RULE = {HELDOUT: "tables", DEVICES: "devices"}   # emulator.HOLDOUT_RULES


def _length_cv(data_dir: str, batch_size: int) -> list[float] | None:
    """Per table the coefficient of variation of its per-sample lookup counts, from ``data.pt``
    (the first ``batch_size`` samples); None without lookup data (the emulator then uses its table
    of known tables, see :mod:`shardcore.oracles.emulated.emulator`)."""
    import numpy as np

    from shardcore.dataset import load_dataset

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


class EmulatedOracle:
    """Plan costs on an emulated GPU (see the module notes): a
    :class:`~shardcore.types.ShardCostOracle` like :class:`~shardcore.oracles.measured.driver.PlanEvaluator`
    (``evaluate``, ``measure_devices``, ``measure_comm``, context manager, ``batch_size``,
    ``ndevices``...). It keeps nothing; :class:`~shardcore.oracles.cache.CachedOracle` can wrap it."""

    comm_measured = False   # the exchange is modelled: a cache layer stores its shards, never its plans
    running = True
    worker_pids: list[int] = []
    bench_iters = 0
    warmup_iters = 0

    def __init__(self, dataset_dir: str | os.PathLike, ndevices: int = 4, *, card: str = "h200",
                 batch_size: int | None = None, optimizer: str = EXACT_SGD, precision: str = "fp16",
                 comm_model: CommModel | None = None, fit: str = HELDOUT):
        from shardcore.dataset import load_dataset
        from shardcore.oracles.emulated.measurements import load_gpu_model

        check_emulator_fit(fit)
        self.card_file = None
        if is_card_file(card):
            from shardcore.oracles.emulated.card import read_card

            self.card_file = read_card(card)
            fit = FULL            # held-out refits exist for the shipped measurements only
        elif card not in EMULATED_CARDS:
            raise ShardError(f"no emulated GPU {card!r}: choose one of {', '.join(EMULATED_CARDS)} or a card file")
        self.fit = fit
        if int(ndevices) < 1:
            raise ShardError(f"the oracle needs at least one device, got {ndevices}")
        self.card = card
        self.ndevices = int(ndevices)
        self.nworkers = 0
        self.optimizer = normalize_optimizer(optimizer)
        self.precision = normalize_precision(precision)
        self.pricing_note = FP32_NOTE if self.precision == "fp32" else None
        if self.card_file is not None:
            self.pricing_note = self.card_file.check_setting(self.optimizer, self.precision, f"emulated:{card}")
        elif self.optimizer != EXACT_SGD:
            raise ShardError(f"emulated:{card} was measured with {EXACT_SGD} only; got {self.optimizer}")
        self.dataset_dir = str(Path(dataset_dir))
        self.dataset = load_dataset(self.dataset_dir, with_lookups=False)
        batch = batch_size if batch_size is not None else configs_batch_size(self.dataset_dir)
        if batch is None:
            raise ShardError(f"{self.dataset_dir}: no data.pt and no batch_size in its table configs; "
                             "give the batch the configs were taken at with --batch-size")
        self.batch_size = int(batch)
        if self.batch_size < 1:
            raise ShardError(f"batch size must be positive, got {self.batch_size}")
        if self.card_file is not None:   # a card file is named by what it holds, not where it lies
            import hashlib

            self._card_digest = "card:" + hashlib.sha256(json.dumps(self.card_file.obj, sort_keys=True).encode()
                                                         ).hexdigest()[:16]
        if self.card_file is not None and self.batch_size != self.card_file.batch_size:
            self.pricing_note = "; ".join(filter(None, [self.pricing_note, (
                f"measured at batch {self.card_file.batch_size}, priced at {self.batch_size} by its features' "
                "scaling with the batch")]))
        self.model = self.card_file.model if self.card_file is not None else load_gpu_model(card)
        self.length_cv = _length_cv(self.dataset_dir, self.batch_size)
        self.comm_model = (self.card_file.comm_model(comm_model) if self.card_file is not None
                           else comm_model or CommModel())
        self.device_type = f"emulated:{card}"
        self._ntables = self.dataset.num_tables

    # -- what is measured --------------------------------------------------------------------
    @property
    def hardware(self) -> str:
        note = f"; {self.pricing_note}" if self.pricing_note else ""
        if self.card_file is not None:
            c = self.card_file
            return (f"emulated {c.hardware} (calibrated card {self.card}: compute model fitted on {c.measured_shards} "
                    f"devices measured on it{note}), {self.ndevices} devices")
        held = {HELDOUT: ", held out: never fitted on a plan's own tables",
                DEVICES: ", held out by devices: never fitted on a shard made only of a plan's tables"}.get(self.fit, "")
        return (f"emulated {CARD_NAMES.get(self.card, self.card)} (compute model fitted on real "
                f"{CARD_NAMES.get(self.card, self.card)} measurements{held}{note}), {self.ndevices} devices")

    @property
    def info(self) -> OracleInfo:
        """Nothing to start and no noise: a model answers."""
        return OracleInfo(self.device_type, startup_s=0.0, noise_pct=None)

    @property
    def parts(self) -> dict:
        note = f"; {self.pricing_note}" if self.pricing_note else ""
        if self.card_file is not None:
            how = (f"the card's own fit on its {self.card_file.measured_shards} measured devices, "
                   f"{self.card_file.accuracy_line()}; held-out refits exist only for the shipped h200 measurements")
        else:
            how = {HELDOUT: "refitted per plan without the measured shards that hold any of its tables",
                   DEVICES: "refitted per plan without the measured shards made only of its tables"}.get(
                self.fit, "the shipped fit on every measured shard")
        return {"compute": f"modelled (emulated:{self.card}, {how}{note})",
                "comm": ("none (one device)" if self.ndevices == 1
                         else f"{self.comm_model.describe()}; {PIECES_NOTE}")}

    @property
    def context(self) -> CacheContext:
        from shardcore.oracles.setting import dataset_digest

        held = {HELDOUT: ":heldout", DEVICES: ":devices"}.get(self.fit, "")   # a held-out answer depends on the plan's tables
        name = self.card if self.card_file is None else self._card_digest
        return CacheContext(f"emulated:{name}{held}", dataset_digest(self.dataset), self.batch_size,
                            self.optimizer, self.precision)

    def domain_note(self, tables: Sequence[TableConfig], names: Sequence[str] | None = None) -> str | None:
        """One line naming the tables this card prices outside its measured range, and by how far
        (:mod:`shardcore.oracles.emulated.domain`); None when all are inside and fp16."""
        from shardcore.oracles.emulated.domain import BEYOND, domain_note

        if self.card_file is not None:
            how = ("priced by the card's CPU model, its features extrapolated beyond the measured tables"
                   if self.card_file.device_type == "cpu" else BEYOND)
            return domain_note(self.card_file.domain(self.card), tables, names, self.precision, how=how)
        from shardcore.oracles.emulated.measurements import card_domain

        return domain_note(card_domain(self.card), tables, names, self.precision)

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
        out, the default) the fit without every measured shard that holds one of them, or (``devices``)
        without every measured shard made only of them (:func:`shardcore.oracles.emulated.emulator.heldout_model`;
        tables of another dataset were never measured)."""
        if self.fit == FULL:
            return self.model
        from shardcore.oracles.emulated.measurements import heldout_model, seen_tables

        seen = seen_tables(tables, self.card)
        return heldout_model(seen, self.card, rule=HOLDOUT_RULE[self.fit]) if seen else self.model

    def measure_devices(self, shards: Sequence[Sequence[TableConfig]], no_cache: bool | None = None, *,
                       judged: Sequence[TableConfig] | None = None) -> list[ComputeCost]:
        """Each device's (fw, bw) compute; the held-out fit is the one without the tables of ``judged``
        (default: every table of ``shards``)."""
        from shardcore.oracles.emulated.model import predict_devices

        shards = [self._check(s, f"shard {k}") for k, s in enumerate(shards)]
        cv_of = None if self.length_cv is None else (lambda t: self.length_cv[t.index])
        model = self.compute_model([t for s in shards for t in s] if judged is None else judged)
        # a device's model-parallel pieces at the batch, its data-parallel replicas at its slice
        pred = predict_devices(model, shards, self.batch_size, cv_of, precision=self.precision)
        return [ComputeCost(float(fw), float(bw)) for fw, bw in pred]

    def measure_comm(self, layout: CommLayout, delays_ms: Sequence[float] | None = None
                     ) -> tuple[list[tuple[float, float]], list[CommSplits]]:
        """Per device ``(fw_ms, bw_ms)`` of the pooled all-to-all of ``layout.dim_sums`` and the split
        sizes; the layout's ``id_widths`` / ``allreduce_bytes`` (per device,
        :func:`~shardcore.oracles.commmodel.id_width` and :func:`~shardcore.oracles.commmodel.allreduce_bytes`
        sums) add a plan's input-id all-to-all (forward) and data-parallel all-reduce (backward)."""
        dim_sums, id_widths, allreduce = layout.dim_sums, layout.id_widths, layout.allreduce_bytes
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

    def check_devices(self, shards: Sequence[Sequence[TableConfig]]) -> list[list[TableConfig]]:
        """The plan as lists, one shard per device and every table known, or a one-line error."""
        if len(shards) != self.ndevices:
            raise ShardError(f"plan has {len(shards)} shards but the oracle has {self.ndevices} devices")
        return [self._check(s, f"shard {d}") for d, s in enumerate(shards)]

    def evaluate(self, shards: Sequence[Sequence[TableConfig]], no_cache: bool | None = None, *,
                 compute: "dict[int, ComputeCost] | None" = None) -> PlanResult:
        """The plan's costs; ``compute[d]`` (a cache layer's hit) replaces device ``d``'s model."""
        t0 = time.perf_counter()
        shards = self.check_devices(shards)
        known = dict(compute or {})
        costs_c = self.measure_devices([[] if d in known else s for d, s in enumerate(shards)],
                                      judged=[t for s in shards for t in s])
        from_cache = [bool(s) and d in known for d, s in enumerate(shards)]
        costs_c = [known[d] if from_cache[d] else c for d, c in enumerate(costs_c)]
        n = self.ndevices
        comm, splits = self.measure_comm(CommLayout(
            [sum(pooled_width(t) for t in s) for s in shards],
            id_widths=[sum(id_width(t) for t in s) for s in shards],
            allreduce_bytes=[sum(allreduce_bytes(t, n, self.precision) for t in s) for s in shards]))
        costs = [list(DeviceCost(fw_comp=c.fw_ms, fw_comm=f, bw_comm=b, bw_comp=c.bw_ms)) for c, (f, b) in zip(costs_c, comm)]
        return PlanResult(costs, from_cache=False, compute_from_cache=from_cache, comm=splits,
                          wall_s=time.perf_counter() - t0, parts=self.parts, hardware=self.hardware)
