"""User-facing errors.

Every problem caused by bad input (a missing file, a malformed line, an infeasible request) is raised as
:class:`ShardError` with a one-line message; the scripts print it as ``error: <message>`` and exit 2.
:class:`Terminated` is how SIGTERM unwinds a script (``run_main``); how processes start and end is in
:mod:`shardcore.processes`.
"""


class ShardError(Exception):
    """A clear, one-line error about the user's input or environment."""


class InfeasibleError(ShardError):
    """A task cannot be placed under the memory cap."""


class Terminated(KeyboardInterrupt):
    """SIGTERM received by a script (``run_main``, torchrun's rank 0): unwinds like Ctrl-C, so the
    evaluator stops its workers and temporary folders go, and the script reports it in one line."""
