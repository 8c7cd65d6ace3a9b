"""User-facing errors.

Every problem caused by bad input (a missing file, a malformed line, an
infeasible request) is raised as :class:`ShardError` with a one-line message;
the command-line scripts print it as ``error: <message>`` and exit with status 2.
"""


class ShardError(Exception):
    """A clear, one-line error about the user's input or environment."""


class InfeasibleError(ShardError):
    """A task cannot be placed under the memory cap."""


class Terminated(KeyboardInterrupt):
    """SIGTERM received where a script asked for it (torchrun's rank 0): unwinds like Ctrl-C, so the
    evaluator stops its workers, and the script reports it in one line."""
