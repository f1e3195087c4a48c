"""Spec lint: every spec rule over one cluster, in a fixed order, minus the ignored ones.

``lint_cluster(cluster, inputs)`` is what ``gpufence validate``, ``up`` and ``sim`` call; it is
pure (no I/O). Each rule is a function ``(Cluster, LintInputs) -> list[Advice]``; ``SPEC_RULES``
maps rule ids to them so the catalogue and the code cannot drift apart (a test checks).
"""

from __future__ import annotations

from collections.abc import Callable

from gpufence.advice import catalog
from gpufence.advice.inputs import LintInputs
from gpufence.advice.lint_fences import (
    mig_not_a_fence,
    serving_no_failure_margin,
    serving_shares_partition,
    wrong_shape,
)
from gpufence.advice.lint_limits import (
    gang_exceeds_capacity,
    lending_reclaim_slow,
    preempts_non_checkpointable,
    quota_borrow_unbounded,
)
from gpufence.advice.record import Advice
from gpufence.model.cluster import Cluster

SpecRule = Callable[[Cluster, LintInputs], list[Advice]]

SPEC_RULES: dict[str, SpecRule] = {
    catalog.SERVING_SHARES_PARTITION: serving_shares_partition,
    catalog.MIG_NOT_A_FENCE: mig_not_a_fence,
    catalog.SERVING_NO_FAILURE_MARGIN: serving_no_failure_margin,
    catalog.LENDING_RECLAIM_SLOW: lending_reclaim_slow,
    catalog.GANG_EXCEEDS_CAPACITY: gang_exceeds_capacity,
    catalog.WRONG_SHAPE: wrong_shape,
    catalog.PREEMPTS_NON_CHECKPOINTABLE: preempts_non_checkpointable,
    catalog.QUOTA_BORROW_UNBOUNDED: quota_borrow_unbounded,
}


def lint_cluster(cluster: Cluster, inputs: LintInputs | None = None) -> list[Advice]:
    """Every spec rule's advice for ``cluster``, each located at its source line if known."""
    inp = inputs or LintInputs()
    out: list[Advice] = []
    for rule, check in SPEC_RULES.items():
        if rule in inp.ignore:
            continue
        out += [a.located(inp.lines) for a in check(cluster, inp)]
    return out
