"""Executors: what turns a scheduler ``Bind`` into running processes (see ``base.Executor``).

``LocalExecutor`` lives in ``gpufence.control.executors.local``; it is not imported here so that
``python -m gpufence.control.executors.launcher`` runs without loading the executor.
"""

from gpufence.control.executors.base import (
    AttemptExit,
    Executor,
    Launch,
    LaunchError,
    Member,
)

__all__ = ["AttemptExit", "Executor", "Launch", "LaunchError", "Member"]
