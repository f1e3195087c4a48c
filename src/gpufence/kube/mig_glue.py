"""The scheduler loop's side of dynamic MIG (kube/mig_recut.py carries a re-cut out through the
GPU operator's MIG manager): what the API writes and the MIG manager reported since the last
cycle become the core's events and Events on the waiting pods; the core's ``MigReconfigure``
decisions become re-cuts for the jobs that wait for them; a waiting pod is told the re-cut's
progress.

Kept apart from the loop so that the loop only routes: it calls ``take`` before the core's step
and ``decide`` after it, and asks ``waiting`` when it writes pending reasons.
"""

from __future__ import annotations

import queue
from collections.abc import Iterable, Mapping

from gpufence.kube.actions import Action, PodEvent
from gpufence.kube.mig_recut import MigRecuts
from gpufence.kube.objects import ObservedNode
from gpufence.kube.tracker import Tracker
from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Decision, MigReconfigure
from gpufence.model.events import Event
from gpufence.sched.scheduler import Scheduler


def layouts(core: Scheduler) -> dict[int, tuple[str, ...]]:
    """Each MIG GPU's instances as the core holds them (``profile@start``)."""
    return {
        g: tuple(f"{i.profile}@{i.start}" for i in st.instances)
        for g, st in core.ledger.mig.items()
    }


def take(
    mig: MigRecuts,
    core: Scheduler,
    cluster: Cluster,
    nodes: Mapping[str, ObservedNode],
    tracker: Tracker,
    refusals: queue.Queue[tuple[str, str]],
    written: queue.Queue[tuple[str, float | None, float]],
    now: float,
) -> tuple[list[Event], list[Action]]:
    """What the MIG manager (and the API's answers to our writes) reported since the last
    cycle, as the core's events, and the Events on the pods a failed re-cut was made for."""
    while not refusals.empty():
        mig.refused(*refusals.get_nowait())
    while not written.empty():
        mig.config_written(*written.get_nowait())
    current = layouts(core) if mig.queued else {}
    events, actions = mig.take(cluster, current, nodes, now)
    for r in mig.newly_failed:
        core_job = tracker.jobs.get(r.job)
        if core_job is None:
            continue
        text = mig.failure_for(r.job)
        ns = core_job.namespace
        actions += [PodEvent(ns, p, "MigReconfigureFailed", text) for p in core_job.pods]
    mig.newly_failed = []
    return events, actions


def decide(
    mig: MigRecuts,
    core: Scheduler,
    cluster: Cluster,
    nodes: Mapping[str, ObservedNode],
    decisions: Iterable[Decision],
    now: float,
) -> list[Event]:
    """The core's re-cuts, each for the first job that waits for it; what to tell the core
    now (a re-cut that cannot be asked for)."""
    recuts = [d for d in decisions if isinstance(d, MigReconfigure)]
    if not recuts:
        return []
    current = layouts(core)
    out: list[Event] = []
    for d in recuts:
        waiters = core.recut_waiters(d.gpu)
        out += mig.decide(cluster, d, current, nodes, waiters[0] if waiters else "", now)
    return out


def waiting(
    mig: MigRecuts, core: Scheduler, cluster: Cluster, jid: str, now: float
) -> tuple[str, str]:
    """How far the re-cuts ``jid`` waits for are (message, gist; empty: none asked yet)."""
    gids = [
        g
        for n in cluster.nodes
        if n.name in mig.asked
        for g in n.gpu_ids
        if jid in core.recut_waiters(g)
    ]
    return mig.waiting_for(cluster, gids, now)
