"""The pending reason of a job that waits for victims to make room (incident preemption, a
reclaim): who, and what holds it up -- a checkpoint with its deadline counting down, or an
eviction a PodDisruptionBudget refuses."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping

from gpufence.kube.tracker import Tracker


def waiting_reason(
    victims: Mapping[str, float | None],
    tracker: Tracker,
    refused: Mapping[str, str],
    now: float,
) -> tuple[str, str] | None:
    """(message, gist) for a job waiting for ``victims`` (job id -> notice deadline, None once
    told to stop); the gist leaves the countdown out (see ShowPending.gist). None: no victims."""
    if not victims:
        return None
    said: list[str] = []
    gist: list[str] = []
    for v, deadline in victims.items():
        if deadline is not None:
            at = dt.datetime.fromtimestamp(deadline, dt.UTC).strftime("%H:%M:%S")
            left = max(0, math.ceil(deadline - now))
            said.append(f"waiting for {v} to checkpoint, deadline in {left} s (at {at} UTC)")
            gist.append(f"waiting for {v} to checkpoint, deadline at {at} UTC")
            continue
        core = tracker.jobs.get(v)
        keys = [f"{core.namespace}/{p}" for p in core.pods] if core is not None else []
        why = next((f"{k}: {refused[k]}" for k in keys if k in refused), "")
        text = f"waiting for {v} to stop"
        if why:
            text += f"; its eviction is refused and retried until allowed ({why})"
        said.append(text)
        gist.append(text)
    return "; ".join(said), "; ".join(gist)
