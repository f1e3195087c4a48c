"""What the tracker (kube/tracker.py) keeps of each job the core knows, and the values of the
notice handshake's annotations: ``gpufence.io/notice`` written by the scheduler, copied by the
workload into ``gpufence.io/checkpointed`` to acknowledge it. Apart from the tracker because the
front end's readers of that state (kube/foreign.py, kube/waits.py) need the shapes, not the
tracker."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpufence.kube import names
from gpufence.kube.objects import ObservedPod
from gpufence.kube.placement_notes import BindNote
from gpufence.model.decisions import Reason
from gpufence.model.job import Job


@dataclass(slots=True)
class CoreJob:
    """A job the core knows: its pods (replica order) and how far it got."""

    job: Job
    namespace: str
    pods: tuple[str, ...]  # pod names
    uids: dict[str, str]  # pod name -> uid it was submitted with
    phase: str = "pending"  # pending | running | stopping
    note: BindNote | None = None
    ended: dict[str, bool] = field(default_factory=dict)  # pod -> succeeded (or gone: False)
    stop_requeue: bool = False
    torn_down: bool = False  # its remaining pods were told to go (once)
    notice: str = ""  # the value of the notice in flight (the gpufence.io/notice annotation)
    acked: bool = False  # the workload answered that notice (gpufence.io/checkpointed)
    owner: str = ""  # its pods' controller ("Job/<uid>"): who makes the next attempt's pods
    attempt: int = 1
    # requeued: the pods its controller made for the next attempt, until there are enough
    fresh: dict[str, ObservedPod] = field(default_factory=dict)


ANN_ACK = names.ANN_CHECKPOINTED


def notice_value(reason: Reason, deadline: float) -> str:
    """The ``gpufence.io/notice`` annotation: ``"<reason> <deadline, seconds since the epoch>"``."""
    return f"{reason.value} {deadline:.0f}"


def read_notice(value: str) -> tuple[Reason, float] | None:
    """A notice annotation back in the core's terms; None when it is not one gpufence wrote
    (gpufence writes a whole number of seconds: never NaN or infinite)."""
    reason, _, deadline = value.partition(" ")
    try:
        got = Reason(reason), float(deadline)
    except ValueError:
        return None
    return got if math.isfinite(got[1]) else None


def acks(pod: ObservedPod, notice: str) -> bool:
    """The pod copied ``notice`` into ``gpufence.io/checkpointed`` (the whitespace a copy
    through a file or ``echo`` adds aside)."""
    return bool(notice) and pod.annotations.get(ANN_ACK, "").strip() == notice
