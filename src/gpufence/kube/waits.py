"""The pending reason of a job that waits for victims to make room (incident preemption, a
reclaim): who, and what holds it up -- a checkpoint with its deadline counting down, or an
eviction a PodDisruptionBudget refuses."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping

from gpufence.kube.core_jobs import read_notice
from gpufence.kube.tracker import Tracker
from gpufence.model.decisions import Reason


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
    said = _reclaims(victims, tracker)
    gist = list(said)
    for v, deadline in victims.items():
        if deadline is not None:
            at = _clock(deadline)
            left = max(0, math.ceil(deadline - now))
            said.append(f"waiting for {v} to checkpoint, deadline in {left} s (at {at})")
            gist.append(f"waiting for {v} to checkpoint, deadline at {at}")
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


def _clock(t: float) -> str:
    """``HH:MM:SS UTC`` of a deadline; past the calendar (a fence's grace_s of 1e12: "never
    force it") the date cannot be written, so the seconds since the epoch are."""
    try:
        return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%H:%M:%S UTC")
    except (ValueError, OverflowError, OSError):
        return f"{t:.0f} s since the epoch"


def _reclaims(victims: Mapping[str, float | None], tracker: Tracker) -> list[str]:
    """Per lender, what a reclaim takes back: "reclaiming 2 lent GPUs of serving from ns/a"
    -- the victims whose notice is a lending rule's reclaim, with the GPUs they borrowed."""
    taken: dict[str, list[tuple[str, int]]] = {}
    for v in victims:
        core = tracker.jobs.get(v)
        told = read_notice(core.notice) if core is not None and core.notice else None
        if core is None or told is None or told[0] is not Reason.LENT_RECLAIM:
            continue
        lender = core.note.lent_from if core.note is not None else None
        if lender:
            taken.setdefault(lender, []).append((v, core.job.total_gpus))
    out = []
    for lender, jobs in taken.items():
        n = sum(g for _, g in jobs)
        who = ", ".join(v for v, _ in jobs)
        out.append(f"reclaiming {n} lent GPU{'' if n == 1 else 's'} of {lender} from {who}")
    return out
