"""How the toolkit's processes start and end: an oracle's measuring workers and ranks, a training's
actors, every script's own process.

- :func:`preloaded_context`: children forked by a ``forkserver`` that imported torch (and what else a
  child needs) once, instead of each spending ~3 s of CPU on those imports as a spawned child does;
- :func:`run_then_exit`: the target such a child runs through: it asks to die with its parent
  (:func:`set_parent_death_signal`), lets go of the server's descriptor (:func:`release_forkserver`),
  runs its own target and ends by :func:`exit_now`;
- :func:`exit_now`: ``sys.exit`` without the interpreter's teardown (0.5-0.9 s of CPU once torch is
  imported);
- :func:`output_lock`: one run at a time writes an output folder (a trainer's, a collection's);
- :func:`unwind_on_sigterm`: SIGTERM unwinds like Ctrl-C, so ``finally`` blocks and temporary folders
  are cleaned up.
"""

from __future__ import annotations

import contextlib
import atexit
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Iterator, Sequence


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


LOCK_NAME = ".shardkit.lock"


@contextlib.contextmanager
def output_lock(directory: str | os.PathLike, flag: str) -> Iterator[Path]:
    """Hold ``<directory>/.shardkit.lock`` (an exclusive ``flock``) while a run writes ``directory``: a
    second run into the same folder is refused in one line, naming the first's process, instead of
    interleaving its logs and checkpoints with the first's. The folder is made where missing (and
    removed again when the run leaves it empty); the lock file goes when the run ends, and a run killed
    outright leaves a file the next run locks again (the kernel drops a dead process's lock)."""
    import fcntl

    from shardcore.errors import ShardError

    folder = Path(directory)
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise ShardError(f"{flag} {folder}: another run (process {holder}) is writing this folder; wait "
                             f"for it to end, or choose another {flag}") from None
        try:   # the file locked may be one an ending run has just removed: lock the one in the folder
            current = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    try:
        yield folder
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)
        if made:
            with contextlib.suppress(OSError):
                folder.rmdir()   # only if the run left it empty


@contextlib.contextmanager
def unwind_on_sigterm() -> Iterator[None]:
    """While the block runs (in the main thread), SIGTERM raises :class:`~shardcore.errors.Terminated`,
    which unwinds like Ctrl-C: ``finally`` blocks and ``with`` exits run (temporary folders are removed,
    workers stopped) before the script reports it in one line; the previous handler is restored after."""
    from shardcore.errors import Terminated

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
