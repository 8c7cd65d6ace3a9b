"""User-facing errors.

Every problem caused by bad input (a missing file, a malformed line, an infeasible request) is raised as
:class:`ShardError` with a one-line message; the scripts print it as ``error: <message>`` and exit 2.
How a process ends is here too: :class:`Terminated` on SIGTERM, :func:`set_parent_death_signal` for a
child that must not outlive its parent (an oracle's worker, a training actor), :func:`exit_now`.
"""

import atexit
import os
import signal
import sys
import threading


class ShardError(Exception):
    """A clear, one-line error about the user's input or environment."""


class InfeasibleError(ShardError):
    """A task cannot be placed under the memory cap."""


class Terminated(KeyboardInterrupt):
    """SIGTERM received where a script asked for it (torchrun's rank 0): unwinds like Ctrl-C, so the
    evaluator stops its workers, and the script reports it in one line."""


def set_parent_death_signal() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no orphans)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def exit_now(code: int = 0):
    """``sys.exit(code)`` without the interpreter's teardown (0.5-0.9 s of CPU once torch is imported):
    other threads are joined, the ``atexit`` handlers run (multiprocessing's children and queues,
    temporary folders) and stdout and stderr are flushed; then the process ends."""
    for t in threading.enumerate():
        if t is not threading.current_thread() and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:   # a closed pipe: nothing more can be said
            pass
    os._exit(code)
