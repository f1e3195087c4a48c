"""Drains and maintenance windows as the core's own events and state (``state/closures.py``).

Phase 1 applies ``NodeDrained`` / ``NodeUndrained`` / ``MaintenanceScheduled`` /
``MaintenanceCancelled`` here; ``advance`` runs right before it every cycle, so that a window
closes its nodes when it begins and opens them when it ends (``Scheduler.next_wakeup`` names
those times). A drain with a deadline notices what runs on the node through the same handshake
as a preemption (``Notice`` -> ``CheckpointAck`` or the deadline -> ``Stop``, requeued:
``sched/expiry.expire_notices``); an undrain before the deadline withdraws those notices.
"""

from __future__ import annotations

from gpufence.model.decisions import Decision, NoticeWithdrawn, Reason
from gpufence.model.events import (
    MaintenanceCancelled,
    MaintenanceScheduled,
    NodeDrained,
    NodeUndrained,
)
from gpufence.sched.book import JobBook
from gpufence.sched.context import Core
from gpufence.sched.jobs import JobState
from gpufence.state.closures import Drain, Window, when

ClosureEvent = NodeDrained | NodeUndrained | MaintenanceScheduled | MaintenanceCancelled


def apply_closure(core: Core, book: JobBook, ev: ClosureEvent, out: list[Decision]) -> None:
    closures = core.closures
    closures.version += 1
    if isinstance(ev, NodeDrained):
        _drain(core, book, ev, out)
    elif isinstance(ev, NodeUndrained):
        idx = core.cluster.node_by_name.get(ev.node)
        if idx is not None and closures.drained.pop(idx, None) is not None:
            closures.sync(core.ledger, (idx,))
            _withdraw(core, book, idx, out)
    elif isinstance(ev, MaintenanceScheduled):
        nodes = tuple(i for n in ev.nodes if (i := core.cluster.node_by_name.get(n)) is not None)
        old = closures.windows.get(ev.window_id)
        w = Window(ev.window_id, nodes, ev.start, ev.end, ev.reason)
        closures.windows[ev.window_id] = w
        closures.sync(core.ledger, (*nodes, *(old.nodes if old else ())))
        if old is not None:
            core.ledger.capacity_back()  # (the old window may have kept jobs off)
    else:
        gone = closures.windows.pop(ev.window_id, None)
        if gone is not None:
            closures.sync(core.ledger, gone.nodes)
            core.ledger.capacity_back()  # jobs it kept off before it began may start now


def _drain(core: Core, book: JobBook, ev: NodeDrained, out: list[Decision]) -> None:
    idx = core.cluster.node_by_name.get(ev.node)
    if idx is None:
        return  # (front ends check names; a stale one is no drain at all)
    core.closures.drained[idx] = Drain(ev.reason, ev.deadline)
    core.closures.sync(core.ledger, (idx,))
    if ev.deadline is None:
        return
    msg = f"node {ev.node} drained: {ev.reason}; checkpoint and stop by {when(ev.deadline)}"
    for jid in core.ledger.jobs_on_node(idx):
        rec = book.records[jid]
        if rec.state is not JobState.RUNNING or jid in book.stopping:
            continue
        if rec.notice is not None and rec.notice.deadline <= ev.deadline:
            continue  # an earlier notice (a preemption, say) stands
        out.append(book.notice(rec, Reason.DRAIN, max(ev.deadline, core.now), False, msg))


def _withdraw(core: Core, book: JobBook, idx: int, out: list[Decision]) -> None:
    """The drain's notices on ``idx``'s jobs are withdrawn, unless another node the job runs
    on is still drained with a deadline."""
    name = core.cluster.nodes[idx].name
    for jid in core.ledger.jobs_on_node(idx):
        rec = book.records[jid]
        if rec.notice is None or rec.notice.reason is not Reason.DRAIN:
            continue
        others = {a.node for a in core.ledger.allocs[jid].assignments} - {idx}
        drained = core.closures.drained
        if any(n in drained and drained[n].deadline is not None for n in others):
            continue
        book.withdraw(rec)
        out.append(NoticeWithdrawn(jid, Reason.DRAIN, f"node {name} undrained"))


def advance(core: Core) -> None:
    """Before phase 1: windows that began or ended since the last step close or open their
    nodes."""
    closures = core.closures
    before = closures.now
    closures.now = core.now
    for w in closures.windows.values():
        if w.active(before) != w.active(core.now):
            closures.version += 1
            closures.sync(core.ledger, w.nodes)
    # windows long over are forgotten (nothing is kept off by them any more)
    for wid in [wid for wid, w in closures.windows.items() if w.end <= core.now]:
        del closures.windows[wid]


def closed_note(core: Core, pool: str) -> str:
    """ " (node n3 drained: ...; maintenance m1 on ...)" for a partition with nodes closed
    now, to follow its free-GPU count in a pending reason; "" when none is."""
    closures = core.closures
    if not (closures.drained or closures.windows):
        return ""
    closed = closures.opened(core.cluster.partition_nodes[pool])
    return f" ({closures.describe(closed)})" if closed else ""
