"""Cost oracles: which landscape a plan is judged on, chosen with ``--oracle``.

- ``measured`` (default): this machine's hardware, :class:`~shardcore.oracles.measured.driver.PlanEvaluator`
  (FBGEMM on the CPU or on CUDA GPUs, real all-to-alls, or modelled ones when the plan has more
  devices than the machine has GPUs).
- ``emulated:h200``: an NVIDIA H200 emulated from real measurements (:class:`EmulatedOracle`):
  each shard's forward and backward compute from :mod:`shardcore.oracles.emulated.emulator`'s model fitted on the
  shipped H200 shard measurements (``data/gpu_measurements/``), a device's model-parallel pieces
  as one kernel at the batch and its data-parallel replicas as another at its batch slice
  (:func:`~shardcore.oracles.emulated.emulator.predict_devices`); the exchanges from the analytic
  :class:`~shardcore.oracles.commmodel.CommModel`: the pooled all-to-all (without data-parallel replicas,
  which send nothing), every model-parallel table's input-id all-to-all (forward, ids expected from
  the tables' pooling factors) and a data-parallel table's gradient all-reduce (backward), as the
  measured evaluator runs them, at the same bandwidth and latency
  (:meth:`~shardcore.oracles.commmodel.CommModel.exchange_ms`). **Held out** (the default, ``--emulator-fit
  heldout``): the compute model that judges a plan is the emulator refitted without every measured
  shard that holds one of the plan's tables (:func:`shardcore.oracles.emulated.emulator.heldout_model`), so a judge
  never saw the tables it judges; ``--emulator-fit full`` uses the shipped fit. It needs only the table configs (no
  ``data.pt``), no workers and no cache, and answers in microseconds, so every trainer can use it.
- ``emulated:<card file>``: the same oracle on a calibrated card (:mod:`shardcore.oracles.emulated.card`,
  written by ``tools/calibrate.py`` on the hardware a user has): the card's compute fit, domain and
  exchange figures (``--comm-bandwidth`` / ``--comm-latency`` set to other values than their defaults
  replace the latter); it judges with its own fit (the held-out refits are the shipped H200's).

Both implement :class:`~shardcore.types.ShardCostOracle`, give the same
:class:`~shardcore.types.PlanResult` (per device ``[fw_comp, fw_comm, bw_comm, bw_comp]`` ms, plan
cost = the slowest device) and say in ``hardware`` and ``parts`` what the figures stand for.
:func:`open_oracle` is the one place either is built, the measured one wrapped in the measurement
cache (:class:`~shardcore.oracles.cache.CachedOracle`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

from shardcore.argtypes import bandwidth_gbps, latency_us, nonnegative_int, positive_int, seconds
from shardcore.config import Config, param
from shardcore.errors import ShardError
from shardcore.oracles.commmodel import (DEFAULT_COMM_BANDWIDTH_GBPS, DEFAULT_COMM_LATENCY_US,
                                        DEFAULT_INTER_HOST_BANDWIDTH_GBPS, DEFAULT_INTER_HOST_LATENCY_US, CommModel)
from shardcore.oracles.emulated.oracle import EmulatedOracle
from shardcore.planning import (EMULATED_PREFIX, EMULATOR_FITS, HELDOUT, LANDSCAPES,  # noqa: F401  (re-exported)
                                MEASURED, parse_landscape)
from shardcore.oracles.setting import DEFAULT_TIMEOUT_S, EXACT_SGD



def is_emulated(oracle) -> bool:
    """Whether an open ``oracle`` (bare or behind the cache) models its costs, an emulated card, rather than
    measuring them: its hardware line starts with "emulated" (:class:`EmulatedOracle`)."""
    return str(oracle.hardware).lower().startswith("emulated")


MAX_BATCH = 2 ** 31 - 1   # samples per iteration; beyond, lookups overflow the kernels' 32-bit offsets


def batch_size_int(text: str) -> int:
    """argparse type for a batch size: an integer in 1 .. :data:`MAX_BATCH`."""
    import argparse

    v = positive_int(text)
    if v > MAX_BATCH:
        raise argparse.ArgumentTypeError(f"expected a batch size <= {MAX_BATCH}, got {text!r}")
    return v


@dataclass
class OracleConfig(Config):
    """The cost oracle's settings, stated once: every script's oracle flags
    (:func:`shardcore.cli.common.add_oracle_args`) are generated from these fields."""

    batch_size: int | None = param(None, "samples per benchmark iteration, the first B of the dataset's batch "
                                         "(default: the dataset's whole batch)",
                                   type=batch_size_int, metavar="B", group="batch")
    bench_iters: int | None = param(None, "timed iterations per measurement (default: the "
                                          "evaluator's)", type=positive_int, metavar="N", group="oracle")
    warmup_iters: int | None = param(None, "untimed iterations before timing (default: the evaluator's)",
                                     type=nonnegative_int, metavar="N", group="oracle")
    comm_iters: int | None = param(None, "timed repetitions of each measured all-to-all (default: the timed "
                                         "iterations, on a CPU at least 21: a loopback exchange is cheap and noisy)",
                                   type=positive_int, metavar="N", group="oracle")
    optimizer: str = param(EXACT_SGD, f"sparse optimizer applied in the backward: {EXACT_SGD} (default), "
                                      "exact_adagrad, exact_row_wise_adagrad", type=str, group="oracle")
    cache_path: str | None = param(None, "measurement cache (SQLite; default data/cost_cache.sqlite)",
                                   type=str, metavar="FILE", group="oracle")
    no_cache: bool = param(False, "measure everything again, ignoring the cache", action="store_true",
                           group="oracle")
    timeout: float = param(DEFAULT_TIMEOUT_S, "seconds a worker may take for one plan before it is declared hung "
                                              f"(default {DEFAULT_TIMEOUT_S:g})", type=seconds, metavar="S",
                           group="oracle")
    launcher: str = param("spawn", "how the measuring workers start: spawn (default: one process per device on "
                                   "this machine) or torchrun (run the whole command under torchrun, one rank per "
                                   "device on every host; rank 0 drives, the others serve; see README 'Beyond one "
                                   "machine')", type=str, choices=("spawn", "torchrun"), group="oracle")
    oracle: str = param(MEASURED, "cost landscape the plans are judged on: 'measured' (default: this machine's "
                                  "hardware, FBGEMM on its CPU or CUDA GPUs), 'emulated:h200' (an NVIDIA H200 "
                                  "emulated from real shard measurements, data/gpu_measurements/; needs no GPU and "
                                  "no data.pt, only the table configs) or 'emulated:CARD.json' (a card of the "
                                  "hardware it was calibrated on by tools/calibrate.py; docs/cards.md)", type=str, metavar="NAME", group="oracle")
    emulator_fit: str = param(HELDOUT, "which fit of the emulated GPU judges a plan: 'heldout' (default: refitted "
                                       "without every measured shard that holds one of the plan's tables, so the "
                                       "judge never saw the tables it judges), 'devices' (refitted without every "
                                       "measured shard made only of the plan's tables: no device any plan of them "
                                       "could have, the tables seen among others, as a learned method's training "
                                       "oracle saw them) or 'full' (the shipped fit on every measurement); emulated "
                                       "oracles only",
                              type=str, choices=EMULATOR_FITS, group="oracle")
    comm_bandwidth: float = param(DEFAULT_COMM_BANDWIDTH_GBPS,
                                  "modelled all-to-all bandwidth per device and direction, used where the exchange "
                                  "is not measured (emulated oracle, or more plan devices than GPUs) (default "
                                  f"{DEFAULT_COMM_BANDWIDTH_GBPS:g}: NVLink 4 within one 8-GPU H100/H200 node, "
                                  "assumed)", type=bandwidth_gbps, metavar="GB/S", group="oracle")
    comm_latency: float = param(DEFAULT_COMM_LATENCY_US, "modelled start-up of one all-to-all in microseconds "
                                                         f"(default {DEFAULT_COMM_LATENCY_US:g})",
                                type=latency_us, metavar="US", group="oracle")
    devices_per_host: int = param(0, "devices per host: with more plan devices than G, they form hosts of G (device d "
                                     "on host d // G) and every modelled exchange runs on two levels, within a host "
                                     "at --comm-bandwidth, between hosts at --inter-host-bandwidth; planners that "
                                     "model the exchange (shardkit, TorchRec: local_world_size) plan for the same "
                                     "hosts (default 0: one host)", type=nonnegative_int, metavar="G", group="oracle")
    inter_host_bandwidth: float = param(DEFAULT_INTER_HOST_BANDWIDTH_GBPS,
                                        "modelled bandwidth between hosts per device and direction (default "
                                        f"{DEFAULT_INTER_HOST_BANDWIDTH_GBPS:g}: 8 x 400 Gb/s NICs per 8-GPU host, "
                                        "assumed); only with --devices-per-host", type=bandwidth_gbps, metavar="GB/S",
                                        group="oracle")
    inter_host_latency: float = param(DEFAULT_INTER_HOST_LATENCY_US, "modelled start-up of an exchange between hosts "
                                      f"in microseconds (default {DEFAULT_INTER_HOST_LATENCY_US:g}, assumed); only "
                                      "with --devices-per-host", type=latency_us, metavar="US", group="oracle")


RESUME_LABELS = {"ndevices": "device count", "max_memory_gb": "memory cap (GiB)", "precision": "weights precision",
                 "emulator_fit": "emulator fit", "hardware": "oracle (hardware)", "exchange": "exchange model",
                 "dataset": "dataset", "batch_size": "batch size", "optimizer": "optimizer", "pf_augment": "--pf-augment"}


def exchange_setting(oracle) -> str:
    """How an open oracle prices the exchange, in words two runs compare: ``measured`` (timed all-to-alls),
    ``fitted to measured all-to-alls`` (the measured oracle's model past its workers), or the analytic
    model's constants (``--comm-bandwidth``, ``--comm-latency``, hosts); ``none`` on one device."""
    model = getattr(oracle, "comm_model", None)
    if getattr(oracle, "ndevices", 2) == 1:
        return "none (one device)"
    if model is None:
        return "measured"
    if model.source == "fitted" or getattr(oracle, "fits_exchange", False):
        return "fitted to measured all-to-alls"
    hosts = (f", hosts of {model.devices_per_host}: {model.inter_latency_us:g} us + bytes / "
             f"{model.inter_bandwidth_gbps:g} GB/s between them" if model.devices_per_host else "")
    return f"analytic: {model.latency_us:g} us + bytes / {model.bandwidth_gbps:g} GB/s{hosts}"


def pricing(oracle) -> dict:
    """What a plan's cost depends on besides the plan, for the records an oracle prices (``eval.py --out``'s
    ``pricing``): two records compare only where every field agrees (:func:`check_same_pricing`)."""
    ctx = getattr(oracle, "context", None)
    out = {"oracle": str(getattr(oracle, "hardware", "")), "batch_size": int(oracle.batch_size),
           "precision": str(oracle.precision), "optimizer": str(oracle.optimizer), "exchange": exchange_setting(oracle)}
    if str(getattr(ctx, "hardware", "")).startswith("emulated"):
        out["emulator_fit"] = str(getattr(oracle, "fit", ""))
    return out


PRICING_LABELS = {"emulator_fit": "emulator fits", "oracle": "oracles", "exchange": "exchange models",
                  "batch_size": "batches", "precision": "weights precisions", "optimizer": "optimizers"}


def check_same_pricing(settings: dict, where: str) -> None:
    """``settings``: a label (a file, a record) -> its pricing dict. Records priced differently (another
    emulator fit, exchange model, oracle, batch, precision or optimizer) do not compare: one line naming
    the first field that differs and both values. A field a setting lacks (an older record) is not compared."""
    items = list(settings.items())
    for field, label in PRICING_LABELS.items():
        seen = [(k, s[field]) for k, s in items if s.get(field) is not None]
        other = next(((k, v) for k, v in seen if v != seen[0][1]), None)
        if other is not None:
            raise ShardError(f"{where}: records priced with different {label} ({seen[0][0]}: {seen[0][1]!r}; "
                             f"{other[0]}: {other[1]!r}): their costs do not compare; compare records of one setting")


def training_provenance(oracle, topology, pf_augment: float | None = None) -> dict:
    """What a training's measurements depend on (kept in its checkpoint): the devices, cap and
    precision, the oracle's hardware and, where it has a cache setting, the dataset, batch and
    optimizer; ``pf_augment``, where given, the share of its training tables made heavier
    (:func:`shardcore.data.features.augment_tasks`). A resumed training must match it (:func:`check_resume`)."""
    out = {"ndevices": topology.ndevices, "max_memory_gb": topology.max_memory_gb, "precision": topology.precision,
           "hardware": str(getattr(oracle, "hardware", "")), "exchange": exchange_setting(oracle)}
    if getattr(oracle, "fit", None) is not None:   # the emulated card's
        out["emulator_fit"] = str(oracle.fit)
    if pf_augment is not None:
        out["pf_augment"] = float(pf_augment)
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
                optimizer: str = EXACT_SGD, precision: str = "fp16", comm_model: CommModel | None = None,
                cache=None, no_cache: bool = False, **measure_kwargs):
    """The one place a cost oracle is built (:func:`shardcore.cli.common.open_evaluator` builds it from
    command-line flags). Use it as a context manager.

    ``oracle='measured'``: a :class:`~shardcore.oracles.measured.driver.PlanEvaluator` for plans of ``ndevices``
    devices measured on ``device_ids`` (``measure_kwargs``: ``bench_iters``, ``warmup_iters``,
    ``timeout_s``, ``launcher``... as the evaluator takes them), wrapped in the measurement cache
    (:class:`~shardcore.oracles.cache.CachedOracle`) unless ``cache`` is None or False (``True``: the
    default file; a path; a :class:`~shardcore.oracles.cache.CostCache`). ``oracle='emulated:<card>'``: an
    :class:`EmulatedOracle` for ``ndevices`` devices (default ``len(device_ids)``), never cached (it
    answers in microseconds); the measuring arguments do not apply to it.
    """
    spec = parse_landscape(oracle)
    if spec.startswith(EMULATED_PREFIX):
        n = ndevices if ndevices is not None else (len(device_ids) if device_ids else 4)
        return EmulatedOracle(data_dir, n, card=spec[len(EMULATED_PREFIX):], batch_size=batch_size,
                              optimizer=optimizer, precision=precision, comm_model=comm_model,
                              fit=measure_kwargs.pop("emulator_fit", HELDOUT))
    from shardcore.oracles.cache import CachedOracle, open_cache
    from shardcore.oracles.measured.driver import PlanEvaluator

    store = open_cache(cache)
    if store is not None:
        store.check_usable()   # an unusable --cache-path is found before any worker starts
    evaluator = PlanEvaluator(data_dir, ndevices, device_ids=device_ids, batch_size=batch_size, optimizer=optimizer,
                              precision=precision, comm_model=comm_model, **measure_kwargs)
    return evaluator if store is None else CachedOracle(evaluator, store, no_cache=no_cache)


MIN_JUDGED_TASKS = 5   # validation tasks below which "beats its untrained self" is not judged (too few to tell)


def check_beats_untrained(trained: Sequence[float | None], untrained: Sequence[float | None], where: str) -> None:
    """A trained placement model is saved only if it beats its untrained self on its own validation
    tasks: ``trained`` and ``untrained`` give per task the oracle's cost (ms) of the plan each model
    makes, None where the plan is over the cap. Judged on the tasks the untrained model planned, when
    there are at least :data:`MIN_JUDGED_TASKS` of them (fewer are noise, as NeuroShard's
    ``MIN_JUDGED_VALIDATION``): a plan over the cap, or a mean cost not below the untrained one, is
    refused in one line naming ``where`` (the checkpoint not written)."""
    pairs = [(a, b) for a, b in zip(trained, untrained) if b is not None]
    if len(pairs) < MIN_JUDGED_TASKS:
        return
    over = sum(a is None for a, _ in pairs)
    mean_t = sum(a for a, _ in pairs if a is not None) / max(len(pairs) - over, 1)
    mean_u = sum(b for _, b in pairs) / len(pairs)
    if over or not mean_t < mean_u:
        how = f"{over} of its plans over the cap" if over else f"mean plan cost {mean_t:.4g} ms vs {mean_u:.4g} ms untrained"
        raise ShardError(f"{where}: not saved: training did not beat the untrained model on its own validation tasks "
                         f"({how}, {len(pairs)} training tasks judged by the training oracle); train longer, lower "
                         "the learning rate or check the oracle")
