"""The backend seam: where state is kept (``JobStore``), as the reconciler uses it.

The reconciler drives the scheduling core against two narrow interfaces: this one, and where
work runs (``gpufence.control.base.executor.Executor``). Today the SQLite store
(``store.database.Store``) is the first and local processes or Ray nodes the second; a
Kubernetes front end has the API server as both. A backend plugs in by satisfying these
protocols (structurally: it imports nothing from here), never by changing the reconciler.

The contract (docs/seam.md says it at length):

* ``transaction(durable=True)`` commits to stable storage before it returns: the reconciler
  acknowledges a submit, cancel, hold or release only after such a commit. A transaction that
  raises committed nothing; ``StoreUnavailable`` says the medium refused it (503 for waiting
  requests, observations held in memory and written again).
* A transaction sees its own writes; ``savepoint()`` undoes exactly the writes made inside it.
* Job states move only along ``gpufence.model.lifecycle``; ``next_id`` is the id the next
  ``add_job`` of the same transaction returns (an Idempotency-Key is bound to it first).
* Writing the same decisions twice (after the store refused them once) gives the same result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from gpufence.control.store.names import Named
from gpufence.control.store.rows import JobRow


class JobTx(Protocol):
    """One transaction: every write of one reconciler phase."""

    def savepoint(self) -> AbstractContextManager[None]: ...

    # jobs
    def job(self, job_id: str) -> JobRow: ...

    def next_id(self, reserve: bool = False) -> str: ...

    def add_job(
        self,
        *,
        tenant: str,
        spec: dict[str, Any],
        workload_class: str,
        partition: str,
        queue: str,
        submitted_at: float,
        job_id: str | None = None,
        gpus: str | None = None,
        text: str | None = None,
    ) -> str: ...

    def set_job(self, job_id: str, **fields: object) -> None: ...

    def set_spec(self, job_id: str, spec: dict[str, Any]) -> None: ...

    def set_homes(self, homes: Sequence[tuple[str, str, str | None]]) -> None: ...

    # names, arrays and idempotency keys (looked up inside the transaction that inserts)
    def live_holder(self, tenant: str, name: str, serving: bool = False) -> Named | None: ...

    def pending_count(self, tenant: str) -> int: ...

    def submit_refusal(self) -> str | None: ...

    def resolve_ref(self, tenant: str, ref: str) -> list[Named]: ...

    def array_tasks(self, ref: str) -> tuple[str, ...]: ...

    def idempotent(self, tenant: str, key: str) -> tuple[str, str] | None: ...

    def claim_key(self, tenant: str, key: str, job_id: str, request: str, at: float) -> bool: ...

    # attempts: one per Bind of a job
    def add_attempt(
        self,
        *,
        job_id: str,
        attempt: int,
        pool: str,
        lent_from: str | None,
        assignments: list[dict[str, Any]],
        devices: list[list[str]],
        started_at: float,
        gpus: float = 0.0,
    ) -> None: ...

    def set_attempt(self, job_id: str, attempt: int, **fields: object) -> None: ...

    # the decision log and the core's state kept over restarts
    def log(self, t: float, job_id: str | None, kind: str, reason: str, message: str) -> None: ...

    def save_usage(self, usage: dict[str, float], at: float) -> None: ...

    def save_preemptions(self, times: Mapping[str, Sequence[float]]) -> None: ...

    def save_defrags(self, times: Mapping[str, Sequence[float]]) -> None: ...


class JobStore(Protocol):
    """Where the control plane's state is kept."""

    def transaction(self, durable: bool = False) -> AbstractContextManager[JobTx]: ...

    def job(self, job_id: str) -> JobRow | None: ...
