"""The control plane as one object: store + scheduler + reconciler + executor + telemetry.

``gpufence up`` wraps it in an HTTP server; the demo and the tests drive it directly or over
HTTP. Every method is safe to call from any thread: writes go through the reconciler's inbox,
reads of job history go to SQLite, reads of live scheduler state run on the reconciler thread.
Reads take the caller's tenant: a tenant sees other tenants' job ids nowhere, not even in the
scheduler's messages about its own jobs (``tenantview.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from gpufence.advice.advise import advise
from gpufence.advice.inputs import LintInputs
from gpufence.advice.record import Advice
from gpufence.control import views
from gpufence.control.advice_history import read_history
from gpufence.control.config import ADMIN, ControlConfig
from gpufence.control.containment.members import Containment
from gpufence.control.executors.interface import Executor
from gpufence.control.executors.jobdirs import JOBS_DIR, open_job_file
from gpufence.control.executors.local.local_executor import LocalExecutor
from gpufence.control.gpus.activity import GpuUtilization
from gpufence.control.gpus.devices import DeviceMap, check_machine
from gpufence.control.gpus.discovery import Discovery
from gpufence.control.gpus.nvml import NvmlError, PynvmlApi
from gpufence.control.gpus.records import DiscoveryError
from gpufence.control.inbox import SubmitResult
from gpufence.control.jobspec import SubmitRequest
from gpufence.control.metrics import Telemetry
from gpufence.control.privatefs import dir_mode, ensure_dir, tighten_existing
from gpufence.control.reconciler import Reconciler
from gpufence.control.runas import blocking_dir
from gpufence.control.store import database as st
from gpufence.control.store.recovery import recover
from gpufence.control.tenantview import Owner, redact
from gpufence.model.cluster import Cluster
from gpufence.model.partition import SharingMode
from gpufence.sched.scheduler import Scheduler, SchedulerConfig

log = logging.getLogger("gpufence.plane")
CALL_TIMEOUT_S = 30.0


class AccessError(PermissionError):
    """The caller's tenant may not do this (HTTP 403)."""


class ControlPlane:
    def __init__(
        self,
        cluster: Cluster,
        config: ControlConfig,
        discovery: Discovery,
        data_dir: Path,
        executor: Executor | None = None,
        validate: bool = True,
        containment: Containment | None = None,
    ) -> None:
        """``containment``: the cgroups of the local executor's members (``gpufence up`` detects
        it; None runs jobs unconfined). Ignored when ``executor`` is given."""
        check_machine(cluster, discovery)
        if not discovery.fake and any(
            p.sharing is SharingMode.MIG and p.mig is not None and p.mig.dynamic
            for p in cluster.partitions.values()
        ):
            raise ValueError(
                "partitions: dynamic MIG re-partitioning of real GPUs is not supported by the "
                "local executor yet; give the MIG layout the GPUs already have (layout: [...])"
            )
        self.cluster = cluster
        self.config = config
        self.discovery = discovery
        self.data_dir = data_dir
        _private_data_dir(config, data_dir)
        self.store = st.Store(data_dir)
        self.telemetry = Telemetry()
        self.containment = containment if executor is None else None
        self.executor: Executor = executor or LocalExecutor(
            notice_signal=config.notice_signal, containment=containment
        )
        # validation re-checks every invariant after each cycle: cheap at one machine's scale,
        # and a control plane should stop rather than double-book a GPU
        self.scheduler = Scheduler(cluster, SchedulerConfig(validate=validate))
        self.reconciler = Reconciler(
            self.scheduler,
            config,
            self.store,
            self.executor,
            DeviceMap(cluster, discovery),
            data_dir,
            self.telemetry,
        )
        if not discovery.fake and isinstance(self.executor, LocalExecutor):
            self.reconciler.gpu_util = _nvml_utilization()
        self.telemetry.set_live(lambda: self.reconciler.call(views.gauges).result(CALL_TIMEOUT_S))
        self.recovered: dict[str, int] = {}
        # where the spec came from, so advice can name file lines and queues[i] (build_plane)
        self.advice_inputs = LintInputs()
        self.advice_source: str | None = None

    def start(self) -> None:
        log.info("GPUs: %s", self.discovery.source)
        if self.containment is not None:
            log.info("containment: %s", self.containment.describe())
        self.recovered = recover(self.reconciler)
        self.reconciler.start(first_id=self.store.max_seq() + 1)

    def close(self, kill_jobs: bool = False) -> None:
        """Stop the reconciler; jobs keep running unless ``kill_jobs`` (they are adopted at the
        next start)."""
        self.reconciler.shutdown()
        self.executor.close(kill=kill_jobs)
        self.store.close()

    # ------------------------------------------------------------------ writes
    def submit(self, req: SubmitRequest, tenant: str) -> SubmitResult:
        if req.tenant is not None and req.tenant != tenant:
            if tenant != ADMIN:
                raise AccessError("only the admin may submit on behalf of another tenant")
            tenant = req.tenant
        self._check_queue(req, tenant)
        return self.reconciler.submit(req, tenant).result(CALL_TIMEOUT_S)

    def _check_queue(self, req: SubmitRequest, tenant: str) -> None:
        """Queues owned by a configured tenant take that tenant's jobs only (and the admin's)."""
        if not req.queue or tenant == ADMIN:
            return
        q = self.cluster.queues.get(req.queue)
        if q is not None and q.tenant in self.config.tenants and q.tenant != tenant:
            raise AccessError(f"queue '{req.queue}' belongs to tenant '{q.tenant}'")

    def cancel(self, job_id: str, tenant: str) -> str:
        if self.job(job_id, tenant) is None:  # 404 / 403 before anything changes
            raise KeyError(job_id)
        return self.reconciler.cancel(job_id).result(CALL_TIMEOUT_S)

    # ------------------------------------------------------------------ reads
    def job(self, job_id: str, tenant: str) -> st.JobRow | None:
        with self.store.reader() as r:
            row = r.job(job_id)
        if row is not None and tenant != ADMIN and row.tenant != tenant:
            raise AccessError(f"job {job_id} belongs to another tenant")
        return self._shown(row, tenant) if row is not None else None

    def owner(self) -> Owner:
        """Job id -> tenant from the store (memoised: one function per request)."""
        known: dict[str, str | None] = {}

        def owner(job_id: str) -> str | None:
            if job_id not in known:
                with self.store.reader() as r:
                    row = r.job(job_id)
                known[job_id] = row.tenant if row is not None else None
            return known[job_id]

        return owner

    def _shown(self, row: st.JobRow, tenant: str, owner: Owner | None = None) -> st.JobRow:
        if tenant == ADMIN or not row.message:
            return row
        return dataclasses.replace(row, message=redact(row.message, tenant, owner or self.owner()))

    def jobs(
        self,
        tenant: str,
        states: tuple[str, ...] = (),
        partition: str | None = None,
        only_tenant: str | None = None,
        limit: int = 1000,
        after_seq: int = 0,
    ) -> list[st.JobRow]:
        if tenant != ADMIN:
            if only_tenant not in (None, tenant):
                raise AccessError("a tenant lists only its own jobs")
            only_tenant = tenant
        with self.store.reader() as r:
            rows = r.jobs(
                states=states,
                partition=partition,
                tenant=only_tenant,
                limit=limit,
                after_seq=after_seq,
            )
        owner = self.owner()
        return [self._shown(row, tenant, owner) for row in rows]

    def attempts(self, job_id: str) -> list[st.AttemptRow]:
        with self.store.reader() as r:
            return r.attempts(job_id)

    def events(
        self, tenant: str, job_id: str | None = None, after_seq: int = 0, limit: int = 1000
    ) -> list[dict[str, Any]]:
        if job_id is not None:
            self.job(job_id, tenant)
        elif tenant != ADMIN:
            raise AccessError("the cluster-wide decision log is for admins; give a job id")
        with self.store.reader() as r:
            rows = r.events(job_id=job_id, after_seq=after_seq, limit=limit)
        if tenant != ADMIN:
            owner = self.owner()
            for e in rows:
                e["message"] = redact(e.get("message") or "", tenant, owner)
        return rows

    def log_path(self, job_id: str, attempt: int, rank: int = 0, stream: str = "out") -> Path:
        return self.data_dir / "jobs" / job_id / f"attempt-{attempt}" / f"rank-{rank}.{stream}"

    def open_log(
        self, job_id: str, attempt: int, rank: int = 0, stream: str = "out"
    ) -> BinaryIO | None:
        """The log for reading, never through a link (``jobdirs.open_job_file``); None if none."""
        return open_job_file(self.data_dir, job_id, attempt, f"rank-{rank}.{stream}")

    def explain(self, job_id: str, tenant: str = ADMIN) -> dict[str, Any] | None:
        return self.reconciler.call(lambda r: views.explain(r, job_id, tenant)).result(
            CALL_TIMEOUT_S
        )

    def pending_reasons(self, job_ids: list[str], tenant: str = ADMIN) -> dict[str, dict[str, str]]:
        return self.reconciler.call(lambda r: views.pending_reasons(r, job_ids, tenant)).result(
            CALL_TIMEOUT_S
        )

    def nodes(self, tenant: str = ADMIN) -> list[dict[str, Any]]:
        """Every node and GPU; a tenant sees its own job ids and counts of the others'."""
        return self.reconciler.call(lambda r: views.nodes(r, tenant)).result(CALL_TIMEOUT_S)

    def partitions(self) -> list[dict[str, Any]]:
        return self.reconciler.call(views.partitions).result(CALL_TIMEOUT_S)

    def metrics(self) -> bytes:
        return self.telemetry.render()

    def advice(self, tenant: str) -> list[Advice]:
        """Advice from this plane's own history (``gpufence advise``): the admin gets the spec
        rules with the history's numbers and every live rule; a tenant only the job-scoped
        rules, over its own jobs."""
        cfg = self.config.advice
        now = max(time.time(), self.reconciler.clock.last)
        with self.store.reader() as r:
            history = read_history(r, self.cluster, now, cfg.window_s)
        who = None if tenant == ADMIN else tenant
        return advise(self.cluster, history, cfg, self.advice_inputs, tenant=who)

    @staticmethod
    def advice_scope(tenant: str) -> str:
        return "cluster" if tenant == ADMIN else f"jobs of tenant {tenant}"


def _private_data_dir(config: ControlConfig, data_dir: Path) -> None:
    """The data dir as tenant isolation needs it (``privatefs.py``): 0700, or 0711 when jobs run
    as other users, each of whom must be able to reach it; leftovers of an older gpufence that
    others could read are made private first."""
    tighten_existing(data_dir, data_dir / JOBS_DIR)  # before others may pass through
    mode = dir_mode(config.jobs_traversable)  # jobs of other users pass through to theirs
    ensure_dir(data_dir, mode)
    ensure_dir(data_dir / JOBS_DIR, mode)
    users = {**config.run_as, ADMIN: config.default_run_as}
    for tenant, user in sorted((t, u) for t, u in users.items() if u is not None):
        blocked = blocking_dir(data_dir, user)
        if blocked is not None:
            raise ValueError(
                f"jobs of {tenant} run as {user.user!r} (run_as), who cannot pass through "
                f"{blocked} (mode {blocked.stat().st_mode & 0o777:04o}) to reach the data "
                f"dir {data_dir}; give --data a place every run_as user can reach, e.g. "
                "/var/lib/gpufence"
            )


def _nvml_utilization() -> Callable[[int], float | None] | None:
    """NVML's per-GPU utilisation for idle detection; None (CPU figure only) if NVML fails."""
    try:
        return GpuUtilization(PynvmlApi()).of
    except (DiscoveryError, NvmlError) as exc:
        log.warning("idle detection uses CPU time only: NVML utilisation unavailable (%s)", exc)
        return None
