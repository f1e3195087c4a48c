"""What a write function of the reconciler's cycle may touch: ``WriteContext``.

The write functions (``item_writes``, ``job_writes``, ``decision_writes``) turn inbox items and
the core's decisions into store writes plus side effects queued for after the commit. They get
this context, never the ``Reconciler``: they cannot run a scheduling step, start a process,
open a transaction of their own or reach the inbox. What they change in memory is the live set
(attempts whose processes may exist) and the cache of resolved homes; everything else they read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpufence.control.base.config import ControlConfig
from gpufence.control.gpus.devices import DeviceMap
from gpufence.control.gpus.mig_manager import MigManager
from gpufence.control.metrics import Telemetry
from gpufence.control.reconciler.inbox import Live, SubmitResult
from gpufence.control.store import database as st
from gpufence.model.cluster import Cluster
from gpufence.model.decisions import PendingReason
from gpufence.sched.jobs import JobRecord, JobState
from gpufence.sched.query import SchedulerQuery
from gpufence.sched.scheduler import SchedulerConfig
from gpufence.state.ledger import Ledger


class SchedulerView(Protocol):
    """The scheduling core as the write functions see it: read-only (only the reconciler's
    cycle calls ``Scheduler.step``). ``Scheduler`` satisfies it as it is."""

    @property
    def cluster(self) -> Cluster: ...

    @property
    def ledger(self) -> Ledger: ...

    @property
    def config(self) -> SchedulerConfig: ...

    @property
    def query(self) -> SchedulerQuery: ...

    def job(self, job_id: str) -> JobRecord: ...

    def jobs(self) -> Mapping[str, JobRecord]: ...

    def why_pending(self, job_id: str) -> PendingReason | None: ...


Homes = dict[tuple[object, ...], tuple[str, str]]
"""A kind of request (partition, queue, tenant, shape) -> the home the core resolved for it."""


@dataclass(frozen=True, slots=True)
class WriteContext:
    scheduler: SchedulerView
    config: ControlConfig
    data_dir: Path
    devices: DeviceMap
    telemetry: Telemetry
    mig: MigManager
    """Carries out ``MigReconfigure`` (scheduling it only: safe to write twice)."""
    live: dict[str, Live]
    """The reconciler's live set itself (shared, not a copy): a Bind adds its attempt here."""
    homes_seen: Homes
    """``job_writes.predicted_home``'s cache, shared with the reconciler."""


def submit_result(
    view: SchedulerView,
    live: Mapping[str, Live],
    jid: str,
    row_of: Callable[[str], st.JobRow | None],
    replayed: bool = False,
) -> SubmitResult:
    """The answer to a submit of job ``jid``: its state as the core has it (with the pending
    reason), or as the store has it where the core does not know the job or rejected it."""
    core = view.jobs().get(jid)
    if core is None or core.state is JobState.REJECTED:
        row = row_of(jid)
        if row is None:
            return SubmitResult(jid, st.PENDING, replayed=replayed)
        state = st.REJECTED if core is not None else row.state
        return SubmitResult(jid, state, row.reason, row.message, replayed)
    if core.state is JobState.PENDING:
        why = view.why_pending(jid)
        return SubmitResult(
            jid,
            st.PENDING,
            str(why.reason) if why else "",
            why.message if why else "",
            replayed,
        )
    state = st.RUNNING if jid in live else str(core.state)
    return SubmitResult(jid, state, replayed=replayed)
