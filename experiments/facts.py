"""Facts about the run's environment for ``summary.json`` and the Markdown headers."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def software_versions() -> dict:
    import torch
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for dist in ("fbgemm-gpu-cpu", "fbgemm-gpu", "torchrec", "numpy", "pandas", "matplotlib"):
        v = _dist_version(dist)
        if v is not None:
            out[dist] = v
    return out


def machine_info() -> dict:
    from shardcore.oracles.setting import cpu_name
    info = {"platform": platform.platform(), "cpu": cpu_name(), "cpu_count": os.cpu_count()}
    try:
        import torch
        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # pragma: no cover - informational only
        pass
    try:
        with open("/proc/meminfo") as fh:
            kb = int(re.search(r"MemTotal:\s+(\d+)", fh.read()).group(1))
        info["memory_gb"] = round(kb / 2 ** 20, 1)
    except (OSError, AttributeError):
        pass
    return info


def now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")
