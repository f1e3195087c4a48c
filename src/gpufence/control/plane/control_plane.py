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
from concurrent.futures import Future
from pathlib import Path
from typing import Any, BinaryIO

from gpufence.advice.advise import advise
from gpufence.advice.inputs import LintInputs
from gpufence.advice.record import Advice
from gpufence.control.base.config import ADMIN, ControlConfig
from gpufence.control.base.containers import container_problem
from gpufence.control.base.datadir import (
    DataDirError,
    check_data_dir,
    check_store_present,
    mark_store,
)
from gpufence.control.base.executor import Executor
from gpufence.control.base.jobdirs import JOBS_DIR, open_job_file
from gpufence.control.base.jobspec import SubmitRequest
from gpufence.control.base.plane_clock import PlaneClock, anchored
from gpufence.control.base.privatefs import dir_mode, ensure_dir, tighten_existing
from gpufence.control.base.runas import blocking_dir, can_enter
from gpufence.control.base.tenantview import Owner, redact
from gpufence.control.containment.members import Containment
from gpufence.control.executors.local.local_executor import LocalExecutor
from gpufence.control.gpus.activity import GpuUtilization
from gpufence.control.gpus.devices import DeviceMap, check_machine
from gpufence.control.gpus.discovery import Discovery
from gpufence.control.gpus.nvml import GpuApi
from gpufence.control.metrics import Telemetry
from gpufence.control.observe import live_view, series_view, views
from gpufence.control.observe.advice_history import read_history
from gpufence.control.observe.dcgm_jobmap import DcgmJobMap
from gpufence.control.observe.latency_book import DeploymentKey
from gpufence.control.observe.observatory import MAX_PUSH, Observatory
from gpufence.control.observe.prom_collectors import LiveCollector
from gpufence.control.observe.series_model import SeriesResponse
from gpufence.control.plane import admin_accounts, maintenance
from gpufence.control.plane.gpu_runtime import GpuRuntime, Holders, open_gpu_api
from gpufence.control.reconciler.inbox import Clock, InvalidField, SubmitResult
from gpufence.control.reconciler.loop import Reconciler
from gpufence.control.recovery.recovery import damaged_hint, prepare_store, recover
from gpufence.control.store import database as st
from gpufence.control.store.errors import unavailable
from gpufence.model.cluster import Cluster
from gpufence.model.job import WorkloadClass
from gpufence.model.partition import QueueSpec
from gpufence.sched.scheduler import Scheduler, SchedulerConfig

__all__ = ["AccessError", "ControlPlane", "InvalidField"]


def serving_gang_problem(req: SubmitRequest) -> None:
    """A serving user's "replicas" are instances that scale one by one, each its own job (the
    deployment's replicas: jobs sharing its name); ``replicas`` is a gang's size (ranks placed
    and stopped together, one job, counted as one serving replica). Refused at submit, naming
    what to use, so a deployment is never a gang by mistake (jobs stored before still load)."""
    if req.workload_class is WorkloadClass.SERVING and req.replicas > 1:
        raise InvalidField(
            ("body", "replicas"),
            f"replicas is a gang's size (ranks placed together as one job), not a serving "
            f"deployment's replicas: submit {req.replicas} jobs with the same name, each a "
            f"replica of its own (gpufence submit --class serving --instances {req.replicas} "
            "--name NAME)",
        )


log = logging.getLogger("gpufence.plane")
CALL_TIMEOUT_S = 30.0


class AccessError(PermissionError):
    """The caller's tenant may not do this (HTTP 403)."""


def open_store(
    config: ControlConfig,
    data_dir: Path,
    check_integrity: bool = True,
    containment: Containment | None = None,
) -> st.Store:
    """The store of ``data_dir`` (made private first: ``_private_data_dir``), refused with what
    to do when it is missing while its jobs run, damaged, or in use by another control plane
    (``StoreError``); a data directory the medium refuses is ``StoreUnavailable``."""
    try:
        try:  # not someone else's directory (issue 30, case 8)
            check_data_dir(data_dir)
        except DataDirError as exc:
            raise st.StoreError(str(exc)) from None
        _private_data_dir(config, data_dir)
        floor = prepare_store(data_dir, containment)
        try:  # nor a store that went away: never silently a new, empty one (case 9)
            check_store_present(data_dir)
        except DataDirError as exc:
            raise st.StoreError(str(exc)) from None
        store = st.Store(
            data_dir,
            check_integrity=check_integrity,
            id_floor=floor,
            reserve_bytes=config.store_reserve_mib << 20,
        )
        mark_store(data_dir)
        return store
    except st.StoreError as exc:
        if "damaged" in str(exc):
            hint = damaged_hint(data_dir, containment, skipped=not check_integrity)
            raise st.StoreError(f"{exc}\n  {hint}") from None
        raise
    except OSError as exc:  # the data directory itself: read-only, full, no permission
        gone = unavailable(exc)
        if gone is None:
            raise
        raise gone from None


class NotServingError(ValueError):
    """Latency pushed for a job that is not a running serving job (HTTP 409)."""


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
        check_integrity: bool = True,
        nvml: GpuApi | None = None,
        clock: PlaneClock | None = None,
    ) -> None:
        """``containment``: the cgroups of the local executor's members (``gpufence up`` detects
        it; None runs jobs unconfined). Ignored when ``executor`` is given. ``nvml``: the NVML
        to manage real GPUs through (default: pynvml; tests give the fake one,
        ``gpufence.testing.fake_nvml``); on fake GPUs, only its counters are read (the demo
        models the devices with one). ``clock``: the plane's "now" for every deadline (default:
        ``plane_clock.anchored``, the monotonic clock resumed from the data dir's anchor)."""
        if executor is None:
            # the local executor runs everything here, so the spec must be this machine; a
            # remote executor's nodes declare their own GPUs (a one-node Ray cluster has one
            # node with GPUs and no local discovery: issue 32, case 1)
            check_machine(cluster, discovery)
        # one directory, one name: attempt paths name the members' cgroups and exit spools, so
        # a restart through a symlink must find the same ones (else it loses their processes)
        data_dir = data_dir.expanduser().resolve()
        self.cluster = cluster
        self.config = config
        self.discovery = discovery
        self.data_dir = data_dir
        self.store = open_store(
            config, data_dir, check_integrity, containment if executor is None else None
        )
        # (after the store: the data dir is the server's and private by now)
        self.clock = clock if clock is not None else anchored(data_dir)
        self.telemetry = Telemetry()
        self.containment = containment if executor is None else None
        self.executor: Executor = executor or LocalExecutor(
            notice_signal=config.notice_signal, containment=containment
        )
        yaml_queues = self._start_scheduler(cluster, config, validate)
        cluster = self.cluster
        self._start_reconciler(discovery, nvml)
        self._observe(cluster, config)
        self._names: dict[str, tuple[str, str, float | None]] = {}  # serving_state's cache
        self.accounts = admin_accounts.AccountsAdmin(
            self.reconciler, self.store, config, yaml_queues, config.accounts.clock
        )
        self._started = False
        self.recovered: dict[str, int] = {}
        # where the spec came from, so advice can name file lines and queues[i] (build_plane)
        self.advice_inputs = LintInputs()
        self.advice_source: str | None = None

    def _start_scheduler(
        self, cluster: Cluster, config: ControlConfig, validate: bool
    ) -> dict[str, QueueSpec]:
        """The scheduler over the spec as the admin's run-time changes left it (``self.cluster``
        becomes the core's); returns the YAML's own queues, which the accounts admin keeps."""
        # validation re-checks every invariant after each cycle: cheap at one machine's scale,
        # and a control plane should stop rather than double-book a GPU
        # (queue labels that are no configured tenant are nobody's: sched/intake.default_queue)
        # the admin's run-time changes kept in the store win over the YAML for what they
        # changed (tenants, tokens, queues' weight and quota: admin_accounts.py)
        yaml_queues = dict(cluster.queues)
        cluster = admin_accounts.load(self.store, cluster, config)
        tenants = frozenset(config.current_tenants())
        self.scheduler = Scheduler(cluster, SchedulerConfig(validate=validate, tenants=tenants))
        # the core's own queue table: what the plane shows follows the admin's changes
        self.cluster = self.scheduler.cluster
        return yaml_queues

    def _start_reconciler(self, discovery: Discovery, nvml: GpuApi | None) -> None:
        """This machine's GPUs (``self.gpus``) and the reconciler that drives the scheduler,
        the store and the executor over them."""
        cluster, config, data_dir = self.cluster, self.config, self.data_dir
        devices = DeviceMap(cluster, discovery)
        # MIG instances, MPS daemons and foreign processes on this machine's real GPUs
        api = open_gpu_api(discovery, nvml)
        counters = nvml if discovery.fake else None
        self.gpus = GpuRuntime(
            cluster, config, discovery, data_dir, devices, self.telemetry, api, counters=counters
        )
        if self.containment is not None:  # a process on a GPU is its member's by its cgroup
            self.gpus.member_cgroup = self.containment.path_of
        self.reconciler = Reconciler(
            self.scheduler,
            config,
            self.store,
            self.executor,
            devices,
            data_dir,
            self.telemetry,
            clock=Clock(source=self.clock),
            mig=self.gpus.mig,
        )
        self.reconciler.gpu_board = self.gpus.board
        if api is not None and isinstance(self.executor, LocalExecutor):
            self.reconciler.gpu_util = GpuUtilization(api).of

    def _observe(self, cluster: Cluster, config: ControlConfig) -> None:
        """What the plane shows and keeps up after each cycle: metrics from every committed
        state change, the observatory, the store's reserve, DCGM's job map."""
        # outcomes and time in state from every committed state change; 0s for quiet queues
        self.telemetry.clock = self.reconciler.clock
        self.store.observers.append(self.telemetry.state_changes)
        self.telemetry.prime(cluster)
        self.observatory = Observatory(
            cluster,
            config.telemetry,
            self.telemetry,
            self.gpus.board,
            self.gpus.host,
            self.reconciler.clock,
        )
        self.telemetry.add_collector(LiveCollector(self._gauges, self.observatory))
        # the store's free-space reserve refilled once the disk has room again (reserve.py)
        self.reconciler.after_cycle.append(lambda _r: self.store.keep_reserve(time.monotonic()))
        if config.telemetry.dcgm_job_mapping_dir:
            jobmap = DcgmJobMap(Path(config.telemetry.dcgm_job_mapping_dir))
            self.reconciler.after_cycle.append(jobmap.update)

    def start(self) -> None:
        log.info("GPUs: %s", self.discovery.source)
        if self.containment is not None:
            log.info("containment: %s", self.containment.describe())
        # what the GPUs really have (MIG), before recovery's restores and any placement
        self.reconciler.boot(self.gpus.startup_events(self.store), [])
        self.recovered = recover(self.reconciler, self.store, self.containment)
        # the operator's drains and maintenance windows, after the restores they may notice
        self.reconciler.boot(maintenance.boot_events(self.store), [])
        self.reconciler.start()
        self._started = True
        self.gpus.start_watch(self._holders)
        self.observatory.start(self.serving_state)

    def _gauges(self) -> dict[str, Any] | None:
        """The live state /metrics reads (None until the reconciler runs: nothing to read)."""
        if not self._started:
            return None
        return self.reconciler.call(live_view.gauges).result(CALL_TIMEOUT_S)

    def serving_state(self) -> live_view.ServingState:
        names = self._names
        return self.reconciler.call(lambda r: live_view.serving_state(r, names)).result(
            CALL_TIMEOUT_S
        )

    def _holders(self) -> Holders:
        """Every running attempt, read on the reconciler thread (for the GPU sampler)."""

        def read(r: Reconciler) -> Holders:
            return [(j, v.attempt, v.launch) for j, v in r.live.items() if not v.orphan]

        return self.reconciler.call(read).result(CALL_TIMEOUT_S)

    def close(self, kill_jobs: bool = False) -> None:
        """Stop the reconciler; jobs keep running unless ``kill_jobs`` (they are adopted at the
        next start)."""
        self.observatory.stop()
        self.gpus.stop_watch()
        self.reconciler.shutdown()
        self.executor.close(kill=kill_jobs)
        self.gpus.close(kill_jobs, [v.launch for v in self.reconciler.live.values()])
        self.store.close()

    # ------------------------------------------------------------------ writes
    def submit(
        self, req: SubmitRequest, tenant: str, idempotency_key: str | None = None
    ) -> SubmitResult:
        """Acknowledged once durable. With ``idempotency_key``, a repeat (the client's 201 was
        lost to a crash or a timeout) returns the job the first one created."""
        return self.submit_future(req, tenant, idempotency_key).result(CALL_TIMEOUT_S)

    def submit_future(
        self, req: SubmitRequest, tenant: str, idempotency_key: str | None = None
    ) -> Future[SubmitResult]:
        """``submit`` without waiting: the checks, then the reconciler's future."""
        if req.tenant is not None and req.tenant != tenant:
            if tenant != ADMIN:
                raise AccessError("only the admin may submit on behalf of another tenant")
            tenant = req.tenant
        self._check_queue(req, tenant)
        self._check_pty(req)
        serving_gang_problem(req)
        req = req.with_cpu_default()
        try:
            self._check_cwd(req, tenant)
        except InvalidField:
            # a retry of a submit that was accepted (its answer lost) gets that job, whatever
            # happened to the directory since: the key is looked up before the machine's state
            if idempotency_key is None:
                raise
            with self.store.reader() as r:
                if not r.idempotency_key_used(tenant, idempotency_key):
                    raise
        return self.reconciler.submit(req, tenant, idempotency_key)

    def _check_cwd(self, req: SubmitRequest, tenant: str) -> None:
        """Jobs run on this machine: a ``cwd`` its user could not enter fails at submit, not at
        launch (Ray runs them elsewhere: checked there). Asked as that user (``can_enter``):
        the same answer for "missing" and "not yours", so a submit cannot probe through the
        server's root which private directories exist. So is a container image."""
        who = self.config.run_as_for(tenant)
        local = isinstance(self.executor, LocalExecutor)
        if req.container is not None:
            problem = container_problem(req.container, req.cwd, who, self.data_dir, local)
            if problem is not None:
                raise InvalidField(("body", problem[0]), problem[1])
        if req.cwd is None or not local:
            return
        if not can_enter(req.cwd, who):
            user = f"the job's user ({who.user})" if who is not None else "the server's user"
            raise InvalidField(("body", "cwd"), f"{req.cwd} is not a directory {user} can enter")

    def _check_pty(self, req: SubmitRequest) -> None:
        """A pty job's terminal is served from its attempt directory on the machine where it
        runs, which the server reaches only when that is this one (the local executor)."""
        if req.pty and not isinstance(self.executor, LocalExecutor):
            raise InvalidField(
                ("body", "pty"),
                "a pty job's terminal is served from this machine, and this server's executor "
                "runs jobs on other nodes: submit it without pty (a batch job)",
            )

    def _check_queue(self, req: SubmitRequest, tenant: str) -> None:
        """Queues owned by a configured tenant take that tenant's jobs only (and the admin's)."""
        if not req.queue or tenant == ADMIN:
            return
        q = self.cluster.queues.get(req.queue)
        if q is not None and q.tenant in self.config.current_tenants() and q.tenant != tenant:
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
        parse_spec: bool = True,
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
                parse_spec=parse_spec,
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

    def now(self) -> float:
        """The plane's "now" (``plane_clock``), the time line of every stored timestamp."""
        return max(self.clock(), self.reconciler.clock.last)

    def partitions(self) -> list[dict[str, Any]]:
        return self.reconciler.call(views.partitions).result(CALL_TIMEOUT_S)

    def metrics(self) -> bytes:
        return self.telemetry.render()

    # ------------------------------------------------------------------ observation
    def series(
        self, tenant: str, since: float | None, until: float | None, step_s: float | None
    ) -> SeriesResponse:
        """The joint view's series (``observe/series_view.py``); SeriesQueryError for a range
        it cannot answer."""
        now = self.now()
        cfg = self.config.telemetry
        until = now if until is None else until
        since = (
            max(until - 900.0, self.observatory.started_at - cfg.series_step_s)
            if since is None
            else since
        )
        step = step_s if step_s is not None else max(cfg.series_step_s, (until - since) / 300)
        with self.store.reader() as r:
            events = r.events_since(since, series_view.MARK_EVENTS)
        return series_view.build(
            self.observatory, events, tenant, self.owner(), since, until, step, now
        )

    def push_latency(self, job_id: str, tenant: str, latencies_ms: list[float]) -> DeploymentKey:
        """Latencies a serving replica measured itself, into its deployment's book."""
        row = self.job(job_id, tenant)  # AccessError (403) for another tenant's job
        if row is None:
            raise KeyError(job_id)
        if row.workload_class != "serving":
            raise NotServingError(
                f"job {job_id} is a {row.workload_class} job; only serving jobs report latency"
            )
        if row.state not in st.ACTIVE:
            raise NotServingError(
                f"job {job_id} is {row.state}; latency is taken from running replicas only"
            )
        if len(latencies_ms) > MAX_PUSH:
            raise ValueError(f"at most {MAX_PUSH} latencies per push")
        key = DeploymentKey(row.tenant, str(row.spec.get("name") or job_id))
        part = self.cluster.partitions.get(row.partition)
        slo_ms = row.spec.get("slo_p99_ms")
        if slo_ms is None and part is not None and part.slo is not None:
            slo_ms = part.slo.p99_ms
        score_s = part.slo.window_s if part is not None and part.slo is not None else None
        self.observatory.push(
            key,
            row.partition,
            None if slo_ms is None else float(slo_ms) / 1000.0,
            score_s,
            [v / 1000.0 for v in latencies_ms],
        )
        return key

    def advice(self, tenant: str) -> list[Advice]:
        """Advice from this plane's own history (``gpufence advise``): the admin gets the spec
        rules with the history's numbers and every live rule; a tenant only the job-scoped
        rules, over its own jobs."""
        cfg = self.config.advice
        now = self.now()
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
