"""The fenced act's stage, derived from the machine: which GPUs each fence holds
(``fence_layout``), the cluster spec (``fenced_spec``) and who is cast in the act (``cast``), so
the act tells the same story on 1, 2, 4, 8 or 16 GPUs (issue 33, item 9)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from gpufence.control.gpus.discovery import Discovery, node_spec
from gpufence.spec.errors import number_ranges

# The fenced act's fences: how each is set up (its GPUs come from ``fence_layout``).
_SERVING_PREEMPTION = {
    "mode": "incident-only",
    "budget": 2,
    "window_s": 3600,
    "min_runtime_s": 0,
    "grace_s": 10,
}
_NOTEBOOK_RECLAIM = {"idle_threshold": 0.05, "idle_after_s": 3, "warning_s": 2}


def fence_layout(whole: list[int]) -> dict[str, list[int]]:
    """The whole GPUs (indices) of each fence of the fenced act on this machine: serving and
    interactive a quarter each (at least one GPU), training the rest -- 0-1 / 2-5 / 6-7 on 8
    GPUs, 0-3 / 4-11 / 12-15 on 16. Two GPUs: serving and training, which also holds the
    notebooks; one GPU: one fence for everything."""
    n = len(whole)
    if n <= 1:
        return {"shared": whole}
    if n == 2:
        return {"serving": whole[:1], "training": whole[1:]}
    q = max(1, n // 4)
    return {"serving": whole[:q], "training": whole[q : n - q], "interactive": whole[n - q :]}


def whole_gpus(d: Discovery) -> list[int]:
    """The indices of the machine's GPUs not in MIG mode (the fences' GPUs)."""
    return sorted(g.index for g in d.gpus if not g.mig_enabled)


def fenced_spec(d: Discovery) -> dict[str, Any]:
    """The fenced act's cluster spec for the machine ``d`` describes (GPUs in MIG mode keep
    the partitions ``node_spec`` gives them)."""
    spec = copy.deepcopy(node_spec(d))
    group = spec["node_groups"][0]["name"]
    spec["name"] = "demo-fenced"
    whole = whole_gpus(d)
    mig = {k: v for k, v in spec["partitions"].items() if v.get("sharing") == "mig"}
    layout = fence_layout(whole)

    def on(indices: list[int]) -> list[str]:
        return [f"{group}:{r}" for r in number_ranges(indices).split(",")]

    parts: dict[str, Any] = {}
    if "shared" in layout and whole:
        parts["shared"] = {
            "gpus": on(layout["shared"]),
            "admits": ["serving", "training", "interactive", "batch"],
            "sharing": "exclusive",  # (a fence cannot preempt from itself: no incident here)
            "reclaim": _NOTEBOOK_RECLAIM,
        }
    if "serving" in layout:
        parts["serving"] = {
            "gpus": on(layout["serving"]),
            "admits": ["serving"],
            "sharing": "exclusive",
            "backfill": False,
            "preemption": {**_SERVING_PREEMPTION, "from": ["training"]},
        }
        notebooks_here = "interactive" not in layout
        parts["training"] = {
            "gpus": on(layout["training"]),
            "admits": ["training", "interactive"] if notebooks_here else ["training"],
            "sharing": "exclusive",
            **({"reclaim": _NOTEBOOK_RECLAIM} if notebooks_here else {}),
        }
    if "interactive" in layout:
        parts["interactive"] = {
            "gpus": on(layout["interactive"]),
            "admits": ["interactive"],
            "sharing": "exclusive",
            "reclaim": _NOTEBOOK_RECLAIM,
        }
    spec["partitions"] = {**parts, **mig}
    spec.pop("queues", None)
    return spec


@dataclass(frozen=True)
class Cast:
    """Who the fenced act submits on a given layout. The serving replicas fill the serving
    fence and the gang fills the training fence, so the surge finds both full and can only be
    served by one incident preemption of the gang, whatever the size of the fences (with a gang
    of 4 GPUs on 4 GPUs it never fitted; on 16 the surge found idle training GPUs and preempted
    nobody)."""

    base_replicas: int
    gang_replicas: int
    gang_gpus: int
    """GPUs per gang member."""
    surge_replicas: int
    base_seconds: float | None
    """How long the base replicas serve (None: until the act scales them down)."""
    missing: str = ""
    """What this machine lacks for the incident preemption (empty: it is shown)."""

    @property
    def preempts(self) -> bool:
        return not self.missing


def cast(layout: dict[str, list[int]]) -> Cast:
    if "serving" not in layout:
        # one fence for everything: serving cannot take GPUs from a fence of its own, so the
        # replica serves a while and the gang follows it onto the GPU
        gpus = len(layout["shared"])
        return Cast(
            base_replicas=1,
            gang_replicas=1,
            gang_gpus=max(1, gpus),
            surge_replicas=0,
            base_seconds=3.0,
            missing=f"a serving fence beside a training fence: 2 GPUs or more; this machine "
            f"has {gpus}",
        )
    train = len(layout["training"])
    members = 2 if train % 2 == 0 else 1
    return Cast(
        base_replicas=len(layout["serving"]),
        gang_replicas=members,
        gang_gpus=train // members,
        surge_replicas=min(2, train),
        base_seconds=None,
    )
