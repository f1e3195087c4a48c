"""Executors: what turns a scheduler ``Bind`` into running processes (see ``interface.Executor``).

``local/`` runs gang members on this machine, ``ray/`` on Ray nodes; beside them sit the pieces
both use: the launcher (one per member), the member environment, the gang and stop rules, the
process records and the watcher thread. Nothing is imported here (the interface is
``executors.interface``), so that the launcher, started by file path, loads only its own records
module beside it.
"""
