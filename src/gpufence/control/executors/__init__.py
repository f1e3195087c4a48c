"""Executors: what turns a scheduler ``Bind`` into running processes (see ``interface.Executor``).

``local/`` runs gang members on this machine, ``ray/`` on Ray nodes; beside them sit the pieces
both use: the launcher (one per member), the member environment, the gang and stop rules, the
process records and the watcher thread. The executors are not imported here, so that the
launcher (started by file path) loads nothing it does not need.
"""

from gpufence.control.executors.interface import (
    AttemptExit,
    Executor,
    Launch,
    LaunchError,
    Member,
)

__all__ = ["AttemptExit", "Executor", "Launch", "LaunchError", "Member"]
