"""How the toolkit's processes start and end: an oracle's measuring workers and ranks, a training's
actors, every script's own process.

- :func:`preloaded_context`: children forked by a ``forkserver`` that imported torch (and what else a
  child needs) once, instead of each spending ~3 s of CPU on those imports as a spawned child does;
- :func:`run_then_exit`: the target such a child runs through: it asks to die with its parent
  (:func:`set_parent_death_signal`), lets go of the server's descriptor (:func:`release_forkserver`),
  runs its own target and ends by :func:`exit_now`;
- :func:`exit_now`: ``sys.exit`` without the interpreter's teardown (0.5-0.9 s of CPU once torch is
  imported).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from typing import Sequence


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


def preloaded_context(preload: Sequence[str]):
    """The ``forkserver`` context whose server imports ``preload`` once (``spawn`` where there is none).
    Python runs one forkserver per process: the first caller's preload is the one it gets (a child
    imports what else it needs itself). A child of this context has the server, not the caller, as its
    parent and inherits the server's signal dispositions: start it through :func:`run_then_exit`."""
    import multiprocessing as mp

    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))
    return ctx


def run_then_exit(target, *args) -> None:
    """A started process's target: the process asks to die with its parent and, forked by a forkserver,
    lets go of the server's descriptor (:func:`release_forkserver`); then ``target(*args)``, and the
    process ends without the interpreter's teardown (:func:`exit_now`). An exception ends it as a plain
    target's would."""
    set_parent_death_signal()
    release_forkserver()
    target(*args)
    exit_now(0)


def release_forkserver() -> bool:
    """In a child of a forkserver, close the server's "alive" descriptor, which Python hands every such
    child so that it could ask the server for children of its own (ours never do). The server exits
    when every holder has closed it; a child that kept it would keep the server alive after the driver
    died, and so itself, whose parent-death signal waits for the server's end. True if it was closed;
    a no-op in the driver and in spawned children (reads ``multiprocessing.forkserver``'s state)."""
    try:
        from multiprocessing import forkserver

        server = forkserver._forkserver
        fd = server._forkserver_alive_fd
        if fd is None or server._forkserver_pid is not None:   # not a server's child: the driver's own end
            return False
        server._forkserver_alive_fd = None
        os.close(fd)
        return True
    except (AttributeError, ImportError, OSError):
        return False


def end_forkserver() -> None:
    """SIGKILL this process's forkserver, if it runs (at exit: its children end with it by their
    parent-death signal; a server still importing would otherwise hold the caller's stdout and stderr
    open for seconds). Reads ``multiprocessing.forkserver``'s state; a no-op where it differs."""
    try:
        from multiprocessing import forkserver

        pid = forkserver._forkserver._forkserver_pid
        if pid:
            os.kill(pid, signal.SIGKILL)
    except (AttributeError, ImportError, OSError):
        pass
