"""Capacity advice: catch the anti-patterns of shared GPU clusters in a spec and in what the
cluster did, and say what to change.

Pure functions, no I/O. Spec rules (``lint.lint_cluster``) read a validated ``Cluster`` plus
optional numbers (``inputs.LintInputs``: a serving peak, an SLO, gang sizes); live rules
(``advise.advise``) read a ``history.History`` summary of jobs, attempts and decisions that the
control plane (``control/observe/advice_history.py``) or the simulator (``sim/advice_run.py``)
builds.
Both return ``record.Advice`` records: rule id, severity, field path, why, evidence, fix, diff.
The rule list is ``catalog.RULES``.
"""
