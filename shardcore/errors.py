"""User-facing errors.

Every problem caused by bad input (a missing file, a malformed line, an
infeasible request) is raised as :class:`ShardError` with a one-line message;
the command-line scripts print it as ``error: <message>`` and exit with status 2.
How a process ends is here too: :class:`Terminated` on SIGTERM, :func:`set_parent_death_signal`
for a child (an oracle's worker, a training actor) that must not outlive its parent.
"""

import signal
import sys


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
