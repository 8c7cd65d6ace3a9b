"""The setting a cost depends on besides the shard itself (:class:`~shardcore.types.CacheContext`):
the hardware fingerprint (device, torch and fbgemm-gpu versions, threads, and on the CPU how the cost
is taken), the dataset's content digest, the optimizer and the weights' precision by their canonical
names; and the defaults every oracle shares. The cache keys its entries by it
(:mod:`shardcore.oracles.cache`); the oracles name their setting with it."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING

from shardcore.errors import ShardError

if TYPE_CHECKING:
    from shardcore.dataset import Dataset

EXACT_SGD = "exact_sgd"        # the default optimizer (the one the emulated card was measured with)
DEFAULT_TIMEOUT_S = 120.0      # seconds one measurement request may take before the workers are stopped

OPTIMIZERS = {
    EXACT_SGD: "EXACT_SGD",
    "exact_adagrad": "EXACT_ADAGRAD",
    "exact_row_wise_adagrad": "EXACT_ROWWISE_ADAGRAD",
}
_OPTIMIZER_ALIASES = {
    "sgd": EXACT_SGD,
    "adagrad": "exact_adagrad",
    "exact_rowwise_adagrad": "exact_row_wise_adagrad",
    "row_wise_adagrad": "exact_row_wise_adagrad",
    "rowwise_adagrad": "exact_row_wise_adagrad",
}
PRECISIONS = ("fp16", "fp32")

# How the measured CPU oracle takes a cost (shardcore.oracles.measured.driver, 'Repeatability on the CPU'): part of
# the CPU hardware fingerprint, so costs taken another way are never mixed with these.
CPU_PROTOCOL = "small-pages,warm-samples,lower-quartile"


def normalize_optimizer(name: str) -> str:
    """Canonical optimizer name (``exact_sgd``, ``exact_adagrad``, ``exact_row_wise_adagrad``)."""
    key = str(name).strip().lower().replace("-", "_")
    key = _OPTIMIZER_ALIASES.get(key, key)
    if key not in OPTIMIZERS:
        raise ShardError(f"unknown optimizer {name!r}: choose one of {', '.join(OPTIMIZERS)}")
    return key


def normalize_precision(name: str) -> str:
    key = str(name).strip().lower()
    if key not in PRECISIONS:
        raise ShardError(f"unknown weights precision {name!r}: choose one of {', '.join(PRECISIONS)}")
    return key


# --------------------------------------------------------------------------------------------
# Fingerprints
# --------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def cpu_cores() -> int | None:
    """``os.cpu_count()``, asked once (it reads /sys and costs ~20 us in a container; every oracle
    answer names its hardware)."""
    return os.cpu_count()


@functools.lru_cache(maxsize=1)
def cpu_name() -> str:
    """The CPU model (from /proc/cpuinfo on Linux) and its logical core count (read once: every
    oracle answer names its hardware)."""
    name = ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    if not name:
        name = platform.processor() or platform.machine() or "unknown-cpu"
    return f"{name} ({os.cpu_count()} cores)"


def _fbgemm_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return "unknown"
    for dist in ("fbgemm-gpu-cpu", "fbgemm-gpu", "fbgemm-gpu-nightly", "fbgemm-gpu-nightly-cpu"):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return "unknown"


@functools.lru_cache(maxsize=None)
def hardware_fingerprint(device_name: str | None = None, num_threads: int = 1) -> str:
    """A canonical JSON string naming the hardware and software that produced a measurement.

    ``device_name`` is the accelerator's name (``torch.cuda.get_device_name``) on GPUs; ``None``
    means the CPU (its model name and core count are used). ``num_threads`` is the number of compute
    threads each device's kernels ran with (1 on the CPU oracle).
    """
    import torch

    name = device_name if device_name else "cpu: " + cpu_name()
    obj = {"device": name, "torch": torch.__version__, "fbgemm": _fbgemm_version(),
           "threads": int(num_threads)}
    if not device_name:   # CPU costs depend on how they are taken (shardcore.oracles.measured.driver, 'Repeatability')
        obj["protocol"] = CPU_PROTOCOL
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def is_cpu_hardware(hardware: str) -> bool:
    """Whether a :func:`hardware_fingerprint` names a CPU (its device starts with ``cpu:``)."""
    try:
        return str(json.loads(hardware).get("device", "")).startswith("cpu:")
    except (ValueError, AttributeError):
        return False


_SAMPLE_ELEMS = 1024


def dataset_digest(data_dir: "str | os.PathLike | Dataset") -> str:
    """A cheap content digest of a dataset (SHA-256, hex, 16 characters).

    Hashes ``table_configs.json`` (as parsed, so formatting does not matter), the batch size, and
    per table the number of lookups plus the first and last 1024 indices and offsets. It reads a
    few kilobytes per table from the memory-mapped ``data.pt`` (milliseconds), ignores how the file
    was written (``torch.save`` archives name their records after the file), and changes for any
    regenerated dataset (other seed, batch, tables). ``data_dir`` may be a loaded
    :class:`~shardcore.dataset.Dataset`.
    """
    import torch

    from shardcore.dataset import Dataset, load_dataset

    if isinstance(data_dir, Dataset):
        ds = data_dir
    else:
        if not Path(data_dir).is_dir():
            raise ShardError(f"cannot read dataset {data_dir} to identify it (not a directory)")
        ds = load_dataset(data_dir, with_lookups=(Path(data_dir) / "data.pt").is_file())
    h = hashlib.sha256()
    # the bag-length CV is read from data.pt's lengths: a dataset that gained it is the same dataset
    h.update(json.dumps([{k: v for k, v in t.to_json().items() if k != "length_cv"} for t in ds.tables],
                        sort_keys=True).encode())
    h.update(f"batch={ds.batch_size}".encode())
    if ds.indices is not None:
        for idx, off in zip(ds.indices, ds.offsets):
            h.update(f"|{idx.numel()},{off.numel()}|".encode())
            for t in (idx, off):
                t = t.reshape(-1)
                k = min(_SAMPLE_ELEMS, t.numel())
                h.update(t[:k].to(torch.int64).numpy().tobytes())
                h.update(t[t.numel() - k:].to(torch.int64).numpy().tobytes())
    else:
        h.update(b"no-lookups")
    return h.hexdigest()[:16]


# -- provenance: what produced a file's costs ------------------------------------------------------------
PRODUCED_BY = "produced_by"   # the key every record, cost-data meta file and checkpoint the tools write carries


def produced_by(tool: str, oracle: object = None, predicted: bool = False) -> dict:
    """The provenance stamp of an output: the ``tool`` (script or trainer) that wrote it, the oracle whose
    costs it holds (its hardware line) and whether those costs are a model's *predictions* (a cost model,
    NeuroShard's simulator) rather than an oracle's answers. A reader of costs refuses predictions
    (:func:`refuse_predictions`)."""
    out: dict = {"tool": str(tool), "predicted": bool(predicted)}
    if oracle is not None:
        out["oracle"] = str(oracle)
    return out


def refuse_predictions(obj: object, where: str, expected: str = "measured costs") -> None:
    """One line naming ``where`` when ``obj`` (a record, a meta file's dict, a checkpoint) says it holds
    predictions: its ``produced_by`` stamp has ``predicted`` true, or (tools/predict_shard_costs.py's older
    lines) a top-level ``predicted``. A stamp that is not an object with a true/false ``predicted`` is
    refused too. A prediction is never read as a measurement."""
    if not isinstance(obj, dict):
        return
    stamp = obj.get(PRODUCED_BY)
    if stamp is not None and not (isinstance(stamp, dict) and isinstance(stamp.get("predicted"), bool)):
        raise ShardError(f"{where}: '{PRODUCED_BY}' must be an object with a true/false 'predicted', got {stamp!r}")
    if (stamp or {}).get("predicted") or obj.get("predicted"):
        by = (stamp or {}).get("tool") or obj.get("oracle") or "a cost model"
        raise ShardError(f"{where}: holds predictions (produced by {by}), not {expected}; "
                         "give a file an oracle's run wrote")
