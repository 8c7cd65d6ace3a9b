"""The console commands setup.py installs (shardkit-eval, shardkit-plan, ...) run the scripts' mains,
as `python <script>.py` does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import shardkit_scripts

ROOT = Path(__file__).resolve().parent.parent


def test_every_command_names_a_script_with_a_main():
    assert len(set(shardkit_scripts.SCRIPTS)) == len(shardkit_scripts.SCRIPTS)
    for module in shardkit_scripts.SCRIPTS:
        path = ROOT / (module.replace(".", "/") + ".py")
        assert path.is_file(), module
        assert "\ndef main(" in path.read_text(), module
        assert callable(getattr(shardkit_scripts, shardkit_scripts.function(module))), module
    names = [shardkit_scripts.command(m) for m in shardkit_scripts.SCRIPTS]
    assert {"shardkit-eval", "shardkit-plan", "shardkit-train-autoshard", "shardkit-train-dreamshard",
            "shardkit-train-neuroshard", "shardkit-collect-compute-cost-data", "shardkit-collect-comm-cost-data",
            "shardkit-run-experiments"} <= set(names)


def test_setup_declares_the_commands_and_installs_their_modules():
    """setup.py (read as pip reads it): one console_scripts entry per script, and every module a command
    imports is installed (the top-level scripts as modules, tools/ as a package)."""
    code = ("import setuptools, json, sys\n"
            "seen = {}\n"
            "setuptools.setup = lambda **kw: seen.update(kw)\n"
            "exec(compile(open('setup.py').read(), 'setup.py', 'exec'), {'__file__': 'setup.py', '__name__': 'x'})\n"
            "json.dump({k: seen[k] for k in ('entry_points', 'py_modules', 'packages', 'name')}, sys.stdout)\n")
    import json

    out = json.loads(subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                                    check=True).stdout)
    assert out["name"] == "shardkit"
    assert out["entry_points"]["console_scripts"] == shardkit_scripts.console_scripts()
    for module in shardkit_scripts.SCRIPTS:
        top = module.split(".")[0]
        assert top in out["py_modules"] or top in out["packages"], module
    assert "shardkit_scripts" in out["py_modules"] and "shardkit_methods" in out["py_modules"]


def test_a_command_runs_the_script_with_its_one_line_errors(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(sys, "argv", ["shardkit-gen-tasks", "--data-dir", str(tmp_path / "none")])
    with pytest.raises(SystemExit) as exc:
        shardkit_scripts.gen_tasks_cli()
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: dataset directory not found")
