"""Executors: what turns a scheduler ``Bind`` into running processes (``base.executor.Executor``).

``local/`` runs gang members on this machine, ``ray/`` on Ray nodes; beside them sit the pieces
both use: the gang and stop rules, the processes and the watcher thread. The interface, the
launcher (one per member), its records and the member environment are in ``control/base``.
"""
