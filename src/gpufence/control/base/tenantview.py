"""What a tenant is shown of other tenants' work: counts, never job ids.

The admin sees everything. A tenant's view of ``/v1/nodes`` lists only its own job ids on each
GPU; the others' are counted (``other_tenants_jobs`` per GPU, ``other_tenants_gpus`` per node,
and a cluster-wide ``"3 GPUs held by other tenants"``). Scheduler messages name the jobs they are
about ("GPUs reserved for gang j12"); in a tenant's view an id of another tenant's job becomes
``OTHER_JOB``. Job ids are the reconciler's ``j<N>``; a word of that form that is no known job is
left as it is.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from gpufence.control.base.config import ADMIN

OTHER_JOB = "<another tenant's job>"
_JOB_ID = re.compile(r"\bj\d+\b")

Owner = Callable[[str], "str | None"]
"""Job id -> the tenant that submitted it (None: no such job)."""


def redact(text: str, viewer: str, owner: Owner) -> str:
    """``text`` with the ids of jobs that are not ``viewer``'s replaced by ``OTHER_JOB``."""
    if viewer == ADMIN or not text:
        return text

    def sub(m: re.Match[str]) -> str:
        who = owner(m.group(0))
        return m.group(0) if who is None or who == viewer else OTHER_JOB

    return _JOB_ID.sub(sub, text)


def nodes_for(nodes: list[dict[str, Any]], viewer: str, owner: Owner) -> list[dict[str, Any]]:
    """``views.nodes`` output as ``viewer`` may see it (in place; returned for convenience)."""
    if viewer == ADMIN:
        return nodes
    for n in nodes:
        held = 0
        for g in n["gpus"]:
            jobs: list[str] = g["jobs"]
            mine = [j for j in jobs if owner(j) == viewer]
            g["jobs"] = mine
            g["other_tenants_jobs"] = len(jobs) - len(mine)
            held += len(jobs) > len(mine)
            if g.get("held_for") is not None and owner(g["held_for"]) != viewer:
                g["held_for"] = None  # kept for another tenant's gang: said, never named
            for slot in g.get("mig", ()):
                if slot["job"] is not None and owner(slot["job"]) != viewer:
                    slot["job"] = None
                    slot["other_tenant"] = True
        n["other_tenants_gpus"] = held
    return nodes


def others_summary(nodes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """``{"gpus": N, "summary": "N GPUs held by other tenants"}`` of a tenant's nodes view (None
    in the admin's, which has no counts)."""
    if not nodes or "other_tenants_gpus" not in nodes[0]:
        return None
    n = sum(int(node["other_tenants_gpus"]) for node in nodes)
    return {"gpus": n, "summary": f"{n} GPU{'s' if n != 1 else ''} held by other tenants"}
