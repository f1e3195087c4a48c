"""Drains and maintenance windows on the control plane: each request runs on the reconciler's
thread (``Reconciler.call``, so the reconciler's thread stays the store's only writer), is committed
durably with its audit line, and only then handed to the core as its event for the next cycle
(``Reconciler.boot``: applied before any placement). ``boot_events`` gives a starting plane the
stored drains and windows, after recovery's restores.

Times: the reconciler's clock is the plane clock (monotonic, anchored: ``base/plane_clock``);
a start given as a Unix time is taken as one, a start given relative to now (``start_in_s``) and
a drain's deadline are added to the plane clock's "now", and both are stored as absolute
plane-clock readings, which a restart on the same boot resumes on the same line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufence.control.reconciler.inbox import InvalidField
from gpufence.control.reconciler.loop import Reconciler
from gpufence.control.store import closures as rows
from gpufence.control.store.database import Store
from gpufence.model.events import (
    Event,
    MaintenanceCancelled,
    MaintenanceScheduled,
    NodeDrained,
    NodeUndrained,
)

MAX_TEXT = 200  # a reason is a line of a table, not a document


class NotFound(KeyError):
    """No such drain or maintenance window (HTTP 404)."""


@dataclass(frozen=True, slots=True)
class WindowAsk:
    nodes: tuple[str, ...]
    duration_s: float
    reason: str
    start: float | None = None  # a plane-clock (Unix-like) time
    start_in_s: float | None = None  # or this long from now


def _check_node(r: Reconciler, node: str, field: str) -> None:
    if node not in r.scheduler.cluster.node_by_name:
        known = ", ".join(n.name for n in r.scheduler.cluster.nodes)
        raise InvalidField(("body", field), f"no node {node!r} in the cluster; nodes: {known}")


def _check_reason(reason: str) -> str:
    text = reason.strip()
    if not text or len(text) > MAX_TEXT or any(ord(c) < 32 for c in text):
        raise InvalidField(
            ("body", "reason"),
            f"give a reason of 1-{MAX_TEXT} printable characters (what the work is, for whom "
            "it waits)",
        )
    return text


def drain(
    r: Reconciler, store: Store, node: str, reason: str, deadline_s: float | None, by: str
) -> dict[str, Any]:
    _check_node(r, node, "node")
    why = _check_reason(reason)
    now = r.clock()
    deadline = None if deadline_s is None else now + deadline_s
    row = rows.DrainRow(node, why, deadline, now, by)
    with store.transaction(durable=True) as tx:
        rows.put_drain(tx, row)
    r.boot([NodeDrained(node, why, deadline)], [])
    return _drain_doc(row)


def undrain(r: Reconciler, store: Store, node: str, by: str) -> dict[str, Any]:
    _check_node(r, node, "node")
    now = r.clock()
    with store.transaction(durable=True) as tx:
        gone = rows.delete_drain(tx, node, now, by)
    if not gone:
        raise NotFound(f"node {node} is not drained")
    r.boot([NodeUndrained(node)], [])
    return {"node": node, "drained": False}


def add_window(r: Reconciler, store: Store, ask: WindowAsk, by: str) -> dict[str, Any]:
    if not ask.nodes:
        raise InvalidField(("body", "nodes"), "name at least one node (--nodes n1,n2)")
    for n in ask.nodes:
        _check_node(r, n, "nodes")
    why = _check_reason(ask.reason)
    now = r.clock()
    start = ask.start if ask.start is not None else now + (ask.start_in_s or 0.0)
    end = start + ask.duration_s
    if end <= now:
        raise InvalidField(
            ("body", "start"), f"the window would be over already (it ends {now - end:.0f} s ago)"
        )
    nodes = tuple(dict.fromkeys(ask.nodes))
    with store.transaction(durable=True) as tx:
        wid = rows.next_window_id(tx)
        row = rows.WindowRow(wid, nodes, start, end, why, now, by)
        rows.put_window(tx, row)
    r.boot([MaintenanceScheduled(wid, nodes, start, end, why)], [])
    return {**_window_doc(row, now), "running_into": running_into(r, nodes, start)}


def running_into(r: Reconciler, nodes: tuple[str, ...], start: float) -> list[str]:
    """The jobs running on ``nodes`` now that may still run when a window begins at ``start``
    (no time limit, or one that ends later): a window leaves them running (Slurm refuses such
    a reservation without IGNORE_JOBS), so the operator is told, to drain with a deadline."""
    sched = r.scheduler
    idx = {sched.cluster.node_by_name[n] for n in nodes}
    out: list[str] = []
    for jid, alloc in sched.ledger.allocs.items():
        if idx.isdisjoint(a.node for a in alloc.assignments):
            continue
        rec = sched.job(jid)
        limit = rec.job.time_limit_s
        if limit is None:
            out.append(f"{jid} (no time limit)")
        elif rec.started_at is not None and rec.started_at + limit > start:
            out.append(f"{jid} (time limit ends {rec.started_at + limit - start:.0f} s into it)")
    return sorted(out)


def delete_window(r: Reconciler, store: Store, window_id: str, by: str) -> dict[str, Any]:
    with store.transaction(durable=True) as tx:
        gone = rows.delete_window(tx, window_id, r.clock(), by)
    if not gone:
        raise NotFound(f"no maintenance window {window_id}")
    r.boot([MaintenanceCancelled(window_id)], [])
    return {"id": window_id, "deleted": True}


def listing(r: Reconciler, store: Store) -> dict[str, Any]:
    now = r.clock()
    with store.reader() as rd:
        ds, ws = rows.drains(rd), rows.windows(rd)
    return {
        "now": now,
        "drains": [_drain_doc(d) for d in ds],
        "maintenance": [_window_doc(w, now) for w in ws],
    }


def boot_events(store: Store) -> list[Event]:
    """The stored drains and the windows not yet over, as the core's events (a start)."""
    with store.reader() as rd:
        ds, ws = rows.drains(rd), rows.windows(rd)
    out: list[Event] = [NodeDrained(d.node, d.reason, d.deadline) for d in ds]
    out += [MaintenanceScheduled(w.window_id, w.nodes, w.start, w.end, w.reason) for w in ws]
    return out


def _drain_doc(d: rows.DrainRow) -> dict[str, Any]:
    return {"node": d.node, "reason": d.reason, "deadline": d.deadline, "since": d.at, "by": d.by}


def _window_doc(w: rows.WindowRow, now: float) -> dict[str, Any]:
    state = "scheduled" if now < w.start else "active" if now < w.end else "over"
    return {
        "id": w.window_id,
        "nodes": list(w.nodes),
        "start": w.start,
        "end": w.end,
        "duration_s": w.end - w.start,
        "reason": w.reason,
        "state": state,
        "by": w.by,
    }
