"""How a script's process is set up: --help answers without importing torch, and torch and numpy's OpenBLAS run
on one thread (SHARDKIT_NUM_THREADS overrides)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


from helpers import ROOT


def test_help_answers_without_torch_and_scripts_keep_one_torch_thread():
    """`eval.py --help` imports no torch (2 s saved on every --help and bad flag); a script that does
    import torch later still runs it on one thread (SHARDKIT_NUM_THREADS overrides), as when run_main
    imported torch first, and the environment is left alone."""
    code = ("import sys, runpy\nsys.argv = ['eval.py', '--help']\n"
            "try:\n    runpy.run_path('eval.py', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('TORCH', 'torch' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and "TORCH False" in proc.stdout, proc.stderr[-2000:]
    code = ("import os, sys\nsys.argv = ['x']\nfrom shardcore.cli.common import run_main\n"
            "def main(argv):\n    assert 'torch' not in sys.modules\n    import torch\n"
            "    print('THREADS', torch.get_num_threads(), os.environ.get('OMP_NUM_THREADS'))\n"
            "run_main(main)\n")
    for given, want in ((None, 1), ("2", 2)):
        env = {k: v for k, v in os.environ.items() if k not in ("SHARDKIT_NUM_THREADS", "OMP_NUM_THREADS")}
        if given:
            env["SHARDKIT_NUM_THREADS"] = given
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
                              timeout=120)
        assert proc.returncode == 0 and f"THREADS {want} None" in proc.stdout, proc.stderr[-2000:]


def test_scripts_run_numpys_openblas_on_the_same_threads_as_torch():
    """run_main sets the OpenBLAS numpy has already loaded to SHARDKIT_NUM_THREADS (default 1), as torch,
    unless OPENBLAS_NUM_THREADS is given; the environment is left alone."""
    code = ("import os, sys, ctypes\nimport numpy\nsys.argv = ['x']\nfrom shardcore.cli.common import run_main\n"
            "def main(argv):\n"   # what run_main left set: read back from the library, not set again here
            "    paths = sorted({l.split()[-1] for l in open('/proc/self/maps') if 'openblas' in l.lower()})\n"
            "    paths = [p for p in paths if p.startswith('/')]\n"
            "    lib = ctypes.CDLL(paths[0]) if paths else None\n"
            "    get = next((getattr(lib, n) for n in ('scipy_openblas_get_num_threads64_', "
            "'openblas_get_num_threads64_', 'openblas_get_num_threads') if lib is not None and hasattr(lib, n)), None)\n"
            "    print('BLAS', len(paths), get() if get else None, os.environ.get('OPENBLAS_NUM_THREADS'))\n"
            "run_main(main)\n")
    runs = {}
    for given in (None, "2", "user"):
        env = {k: v for k, v in os.environ.items() if k not in ("SHARDKIT_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
        if given == "user":
            env["OPENBLAS_NUM_THREADS"] = "2"
        elif given:
            env["SHARDKIT_NUM_THREADS"] = given
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs[given] = proc.stdout.split("BLAS ")[1].split()
    if runs[None][0] == "0" or runs[None][1] == "None":
        pytest.skip("numpy here is not linked against a loadable OpenBLAS")
    assert runs[None] == ["1", "1", "None"] and runs["2"] == ["1", "2", "None"]
    assert runs["user"] == ["1", "2", "2"]          # the user's OPENBLAS_NUM_THREADS stands
