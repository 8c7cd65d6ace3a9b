"""Tiny synthetic datasets for tests (no generator involved, so tests of the core stay independent)."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import torch

from shardcore.dataset import save_dataset
from shardcore.tables import TableConfig


def make_dataset(path, num_tables=40, batch_size=32, seed=0, dims=(4, 8, 16, 32)):
    """Write a small dataset with diverse rows and pooling factors; returns its table configs."""
    rng = np.random.default_rng(seed)
    tables, indices, offsets = [], [], []
    for i in range(num_tables):
        row = int(10 ** rng.uniform(1, 6))
        pf = float(rng.choice([0.0, 1.0, 3.0, 10.0, 40.0]))
        lengths = rng.poisson(pf, size=batch_size)
        off = np.concatenate([[0], np.cumsum(lengths)])
        idx = rng.integers(0, row, size=int(off[-1]))
        tables.append(TableConfig(i, row, int(rng.choice(dims)), float(lengths.mean())))
        indices.append(torch.from_numpy(idx))
        offsets.append(torch.from_numpy(off))
    save_dataset(path, tables, indices, offsets, batch_size)
    return tables


def load_tool(name: str):
    """A script of ``tools/`` imported as a module (``tools.<name>``)."""
    return importlib.import_module(f"tools.{name}")


class FnOracle:
    """A test's cost oracle (:class:`shardcore.types.CostOracle`): ``fn(shards)`` gives per device
    the four costs in ms; ``calls`` counts the plans judged."""

    hardware = "a test function"
    parts = {"compute": "modelled (test function)", "comm": "modelled (test function)"}

    def __init__(self, fn):
        self.fn = fn
        self.calls = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def evaluate(self, shards, no_cache=None):
        from shardcore.types import PlanResult

        self.calls += 1
        return PlanResult([[float(v) for v in dev] for dev in self.fn(shards)], parts=dict(self.parts),
                          hardware=self.hardware)


def require_torchrec() -> None:
    """At a test module's top: skip the module where TorchRec cannot be imported, except under
    ``make test`` (``SHARDKIT_REQUIRE_TORCHREC=1``, which installs it), where that fails the run."""
    import os

    import pytest

    try:
        import torchrec  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - a broken install (e.g. a mismatched fbgemm) is not an ImportError
        reason = f"TorchRec cannot be imported ({type(exc).__name__}: {exc})"
        if os.environ.get("SHARDKIT_REQUIRE_TORCHREC") == "1":
            from shardcore.interop.torchrec_planner import INSTALL_HINT

            pytest.fail(f"{reason}, and SHARDKIT_REQUIRE_TORCHREC=1 (make test) requires it. {INSTALL_HINT}",
                        pytrace=False)
        pytest.skip(f"{reason}; make test, which installs it, would fail here", allow_module_level=True)


def small_base(tmp_path_factory, name: str):
    """A folder with a 12-table dataset (batch 8) in ``ds/`` and two tasks in ``tasks.txt``: the
    attack suites' shared ground."""
    d = tmp_path_factory.mktemp(name)
    make_dataset(d / "ds", num_tables=12, batch_size=8)
    (d / "tasks.txt").write_text("0,1,2,3\n4,5,6\n")
    return d


def marked_processes(marker: str, where: str = "cmdline") -> list[int]:
    """Pids of this machine's processes (this one aside) whose ``/proc/<pid>/<where>`` (``cmdline`` or
    ``environ``) holds ``marker``: a test's own processes, found without knowing their parents."""
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/{where}", "rb") as fh:
                    if marker.encode() in fh.read():
                        pids.append(int(d))
            except OSError:
                pass
    return [p for p in pids if p != os.getpid()]
