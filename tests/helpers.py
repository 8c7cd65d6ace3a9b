"""Tiny synthetic datasets for tests (no generator involved, so tests of the core stay independent)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import torch

from shardcore.dataset import save_dataset
from shardcore.tables import TableConfig
from shardcore.topology import Topology


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
            from shardcore.interop.torchrec_lib import INSTALL_HINT

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


# -- the attack suites' shared tools: scripts run in this process, one-line errors, attack files ------------
ROOT = Path(__file__).resolve().parent.parent
_SCRIPTS: dict = {}
NON_UTF8 = b"\xff\xfe\x00bad \xe9 bytes\n"


def script(rel):
    """A script of the repository (``eval.py``, ``tools/gen_tasks.py``) imported as a module, once."""
    if rel not in _SCRIPTS:
        name = "attacked_" + rel.replace("/", "_").replace(".py", "")
        spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, rel))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _SCRIPTS[rel] = mod
    return _SCRIPTS[rel]


def run_script(rel, argv, capsys):
    """(exit status, stdout, stderr) of ``rel``'s main through run_main, in this process (a traceback
    fails the test)."""
    import pytest

    from shardcore.cli import common as cli

    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        cli.run_main(script(rel).main, [str(a) for a in argv])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def one_line_error(code, err, pattern):
    """Exit status 2 and exactly one line ``error: ...`` on stderr, matching ``pattern``."""
    import re

    lines = err.splitlines()
    assert code == 2, err[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    assert re.search(pattern, lines[0]), lines[0]


def attack_base(tmp_path_factory, name: str):
    """A 20-table dataset (batch 16) in ``ds/``, four tasks in ``tasks.txt`` and a plain file ``a_file``
    (where a folder is expected)."""
    d = tmp_path_factory.mktemp(name)
    make_dataset(d / "ds", num_tables=20, batch_size=16)
    (d / "tasks.txt").write_text("0,1,2,3,4\n5,6,7,8,9\n10,11,12\n13,14,15,16\n")
    (d / "a_file").write_text("not a directory\n")
    return d


def check_one_line_case(case, base, tmp_path, capsys):
    """One row of an attack table ``(id, script, argv builder, pattern)``: exactly one line
    ``error: ...`` matching the pattern, exit status 2, before any expensive work, nothing half-written."""
    import re
    import time

    _, rel, build, pattern = case
    argv = build(base, tmp_path)
    t0 = time.perf_counter()
    code, out, err = run_script(rel, argv, capsys)
    lines = err.splitlines()
    assert code == 2, (out[-500:], err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and "weights_only=False" not in err
    assert re.search(pattern, lines[0]), lines[0]
    assert "PWNED" not in out and "Beautiful is better" not in out     # nothing in the file ran
    assert time.perf_counter() - t0 < 20    # before any expensive work (no workers, no measuring)
    assert not list(tmp_path.rglob("*.tmp"))


def copy_ds(base, tmp_path):
    import shutil

    shutil.copytree(base / "ds", tmp_path / "ds")
    return tmp_path / "ds"


def edit_configs(base, tmp_path, change):
    """A copy of ``base``'s dataset whose table configs ``change(tables)`` edited (NaN / Infinity kept)."""
    import json

    ds = copy_ds(base, tmp_path)
    p = ds / "table_configs.json"
    obj = json.loads(p.read_text())
    change(obj["tables"])
    p.write_text(json.dumps(obj, allow_nan=True))
    return ds


def write(t, name, data):
    p = t / name
    if isinstance(data, bytes):
        p.write_bytes(data)
    else:
        p.write_text(data)
    return p


def set_field(k, name, value):
    def change(tables):
        tables[k][name] = value
    return change


def save_checkpoint_file(t, obj, name="ck.pt"):
    p = t / name
    torch.save(obj, p)
    return p


class Evil:
    """A pickle that runs code when loaded: no loader may ever run it."""

    def __reduce__(self):
        return (print, ("PWNED: code ran while loading",))


COMPUTE_HEADER = "sample,table_ids,dims,rows,pooling_factors,fw_ms,bw_ms\n"


def compute_csv(path, rows):
    path.write_text(COMPUTE_HEADER + "".join(rows))
    return path


def good_rows(n):
    return [f"{k},{k % 5};{(k + 1) % 5},8;4,{100 + k};{50 + k},2.0;1.0,{1.0 + 0.1 * k},{2.0 + 0.2 * k}\n"
            for k in range(n)]


def fake_trainer(tmp_path, measure, name):
    """An AutoShard trainer on 12 tables and 3 tasks, its plans judged by ``measure(shards)``."""
    from autoshard.config import AutoShardConfig
    from autoshard.trainer import AutoShardTrainer
    from shardcore.tasks import Task

    tables = [TableConfig(i, 1000 * (i + 1), 8 if i % 2 else 16, float(i % 5 + 1)) for i in range(12)]
    tasks = [Task(tuple(range(k, k + 6))) for k in range(0, 6, 2)]
    cfg = AutoShardConfig(unroll_length=6, batch_size=2, replay_ratio=0, cost_steps_per_update=1)
    return AutoShardTrainer(cfg, tables, tasks, Topology(2, 5.0), FnOracle(measure), tmp_path / name, log=lambda *_: None)


def additive_costs(shards):
    return [[sum(t.dim * t.pooling_factor for t in s) / 100.0, 0.1, 0.1, 0.05] for s in shards]


def planning_ctx(ndevices: int = 4, cap: float = 5.0, precision: str = "fp16", oracle: str | None = "emulated:h200",
                 batch_size: int | None = None, data_dir=None, devices_per_host: int = 0, seed: int = 0, **landscape):
    """A :class:`~shardcore.planning.PlanningContext` for a test: the topology, batch and landscape."""
    from shardcore.planning import Landscape, PlanningContext
    from shardcore.topology import Topology

    return PlanningContext(Topology(ndevices, cap, precision, devices_per_host=devices_per_host), batch_size,
                           Landscape(oracle, data_dir=None if data_dir is None else str(data_dir), **landscape), seed)


def build_planner(name: str, ctx=None, **settings):
    """The registry's planner ``name`` for ``ctx`` (default :func:`planning_ctx`), its own settings (its config's
    fields) replaced by ``settings``."""
    import dataclasses

    from shardcore.cli import algorithms

    configs = None
    if settings:
        table = algorithms.planners()
        owner = table[name].settings_of if name in table else algorithms.lookup(name)[0].settings_of
        configs = {owner: dataclasses.replace(algorithms.config_class(owner)(), **settings)}
    return algorithms.build(name, ctx if ctx is not None else planning_ctx(), configs)


BIG_CAP = 1e6   # GiB per device: a topology whose cap binds nothing (tests of what a plan holds, not of memory)
