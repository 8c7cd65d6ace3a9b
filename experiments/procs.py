"""Supervised subprocesses: each in its own session, output logged, stopped with its children."""

from __future__ import annotations

import os
import selectors
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence


def kill_group(proc: subprocess.Popen) -> None:
    """Stop a subprocess we started (its own session) and everything it started."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_logged(cmd: Sequence[str], log_path: Path, timeout_s: float | None, echo: bool) -> tuple[int | None, float]:
    """Run ``cmd``, copying its output to ``log_path`` (and to stdout when ``echo``).

    Returns ``(exit status or None when stopped at timeout_s, seconds)``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log_path, "wb") as log:
        log.write(("$ " + shlex.join(cmd) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        timed_out = False
        try:
            while True:
                if timeout_s is not None and time.perf_counter() - t0 > timeout_s:
                    timed_out = True
                    break
                if not sel.select(timeout=1.0):
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                log.write(chunk)
                log.flush()
                if echo:
                    sys.stdout.write(chunk.decode(errors="replace"))
                    sys.stdout.flush()
        except BaseException:
            kill_group(proc)
            raise
        finally:
            sel.close()
        if timed_out:
            kill_group(proc)
            log.write(f"\n[stopped by the experiment runner after {timeout_s:g} s]\n".encode())
            proc.stdout.close()
            return None, time.perf_counter() - t0
        proc.stdout.close()
        rc = proc.wait()
    return rc, time.perf_counter() - t0


def tail(path: Path, n: int = 3) -> str:
    """The last ``n`` non-empty lines of a log, joined with ' / '."""
    try:
        lines = [l.strip() for l in path.read_text(errors="replace").replace("\r", "\n").splitlines() if l.strip()]
    except OSError:
        return ""
    return " / ".join(lines[-n:])
