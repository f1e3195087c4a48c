"""A ``Reconciler`` on a real SQLite store and a ``FakeExecutor``, driven one cycle at a time.

The control plane's reconciler normally runs on its own thread, waiting on its inbox. A unit
test wants to decide when a cycle runs and what time it is, so the rig runs no thread: it reads
the reconciler's inbox itself (the one place it reaches into the reconciler) and calls
``Reconciler.cycle`` with what it found, on a clock the test moves. Everything else is the real
thing: the scheduler, the SQLite file in ``data_dir``, recovery.

    rig = ReconcilerRig.make(tmp_path, cluster_spec)
    jid = rig.submit(command=["train"], gpus=2).job_id   # submitted and bound in one cycle
    rig.ex.exit(jid, 1, (0,))                            # the process ends
    rig.cycle()
    assert rig.job(jid).state == "done"

``restart()`` is a crash and a restart on the same data directory: a new store handle,
scheduler, executor (with the adopt results the test gives) and reconciler, then recovery.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufence.control.base.config import ADMIN, ControlConfig, cluster_from_spec_dict
from gpufence.control.base.jobspec import SubmitRequest
from gpufence.control.base.tokens import TokenTable, digest
from gpufence.control.gpus.devices import DeviceMap
from gpufence.control.gpus.discovery import Discovery, fake_gpus
from gpufence.control.gpus.mig_manager import MigManager
from gpufence.control.gpus.nvml import GpuApi
from gpufence.control.metrics import Telemetry
from gpufence.control.reconciler import Reconciler
from gpufence.control.reconciler.inbox import Clock, Item, SubmitResult
from gpufence.control.recovery.recovery import recover
from gpufence.control.store import database as st
from gpufence.model.cluster import Cluster
from gpufence.sched.scheduler import Scheduler, SchedulerConfig
from gpufence.testing.fake_executor import AdoptResult, FakeExecutor, Key

START_S = 1_000_000.0
RIG_ADMIN_TOKEN = "rig-admin-token"
"""The rig's clock starts here (any fixed time: the scheduler only needs it not to go back)."""


@dataclass
class ManualTime:
    """The time source of the rig's reconciler clock: it moves only when the test says so."""

    now: float = START_S

    def __call__(self) -> float:
        return self.now


@dataclass
class ReconcilerRig:
    rec: Reconciler
    ex: FakeExecutor
    store: st.Store
    cluster: Cluster
    discovery: Discovery
    config: ControlConfig
    data_dir: Path
    time: ManualTime

    @property
    def now(self) -> float:
        return self.time.now

    @classmethod
    def make(
        cls,
        data_dir: Path,
        spec: dict[str, Any],
        discovery: Discovery | None = None,
        executor: FakeExecutor | None = None,
        stop_grace_s: float = 5.0,
        now: float = START_S,
        nvml: GpuApi | None = None,
    ) -> ReconcilerRig:
        """A fresh (or, on an existing ``data_dir``, a restarted) rig for the cluster ``spec``;
        ``discovery`` defaults to as many fake GPUs as the spec's first node group has. With
        ``nvml`` (e.g. a ``FakeNvml``) MIG re-partitions are carried out through it, inline in
        the cycle that finds them due (``MigManager(threaded=False)``)."""
        cluster = cluster_from_spec_dict(spec)
        if discovery is None:
            discovery = fake_gpus(int(spec["node_groups"][0]["gpus_per_node"]))
        config = ControlConfig(
            tokens=TokenTable({digest(RIG_ADMIN_TOKEN): ADMIN}), stop_grace_s=stop_grace_s
        )
        ex = executor or FakeExecutor()
        store = st.Store(data_dir)
        time = ManualTime(now)
        devices = DeviceMap(cluster, discovery)
        telemetry = Telemetry()
        mig = MigManager(cluster, devices, nvml, telemetry=telemetry, threaded=False)
        rec = Reconciler(
            Scheduler(cluster, SchedulerConfig(validate=True)),
            config,
            store,
            ex,
            devices,
            data_dir,
            telemetry,
            clock=Clock(source=time),
            mig=mig,
        )
        rec.gpu_board = mig.board
        telemetry.clock = rec.clock  # outcomes and time in state, as ControlPlane wires them
        store.observers.append(telemetry.state_changes)
        telemetry.prime(cluster)
        return cls(rec, ex, store, cluster, discovery, config, data_dir, time)

    # ------------------------------------------------------------------ driving
    def items(self) -> list[Item]:
        """Everything waiting in the reconciler's inbox (what its thread would take)."""
        out: list[Item] = []
        while True:
            try:
                out.append(self.rec._inbox.get_nowait())
            except queue.Empty:
                return out

    def cycle(self) -> None:
        """One reconciler cycle over what is in its inbox now (possibly nothing: timers only)."""
        self.rec.cycle(self.items())

    def advance(self, seconds: float) -> None:
        """Move the clock; the next ``cycle()`` sees the new time."""
        self.time.now += seconds

    def submit(self, tenant: str = ADMIN, **fields: Any) -> SubmitResult:
        """Submit a job (``SubmitRequest`` fields) and run the cycle that takes it."""
        fut = self.rec.submit(SubmitRequest.model_validate(fields), tenant)
        self.cycle()
        return fut.result(timeout=0)

    def cancel(self, job_id: str) -> str:
        """Cancel a job and run the cycle that takes it; the state the API would answer."""
        fut = self.rec.cancel(job_id)
        self.cycle()
        return fut.result(timeout=0)

    # ------------------------------------------------------------------ what the store says
    def job(self, job_id: str) -> st.JobRow:
        """The job as a reader (an API thread) sees it: only what was committed."""
        with self.store.reader() as r:
            row = r.job(job_id)
        assert row is not None, f"job {job_id} is not in the store"
        return row

    def attempt(self, job_id: str, attempt: int) -> st.AttemptRow | None:
        with self.store.reader() as r:
            return r.attempt(job_id, attempt)

    def event_kinds(self, job_id: str) -> list[str]:
        with self.store.reader() as r:
            return [e["kind"] for e in r.events(job_id=job_id)]

    def preemptions(self, job_id: str) -> int:
        """The job's ``preemptions`` in accounting (``gpufence history``)."""
        with self.store.reader() as r:
            rows = [h for h in r.history(now=self.now) if h["id"] == job_id]
        assert rows, f"job {job_id} is not in the history"
        count: int = rows[0]["preemptions"]
        return count

    # ------------------------------------------------------------------ crash and restart
    def restart(
        self,
        spec: dict[str, Any],
        adopt: dict[Key, AdoptResult] | None = None,
        stop_reached: dict[Key, bool] | None = None,
        nvml: GpuApi | None = None,
    ) -> tuple[ReconcilerRig, dict[str, int]]:
        """The control plane dies (nothing is cleaned up) and starts again on the same data
        directory: a new rig whose executor finds ``adopt`` (see ``FakeExecutor``; with
        ``stop_reached`` what the launchers of an attempt that ended recorded of a stop),
        recovered from the store. With ``nvml`` (the same ``FakeNvml``: the GPUs outlive the
        plane) the MIG layouts are read from it first, as ``ControlPlane.start`` does. Returns
        the new rig and recovery's counts; its first ``cycle()`` applies what recovery
        found."""
        ex = FakeExecutor(adopt_results=dict(adopt or {}), adopt_stop_reached=stop_reached or {})
        self.store.close()
        new = ReconcilerRig.make(
            self.data_dir,
            spec,
            discovery=self.discovery,
            executor=ex,
            stop_grace_s=self.config.stop_grace_s,
            now=self.now,
            nvml=nvml,
        )
        new.rec.boot(new.rec.mig.startup(), [])  # (nothing on fake GPUs)
        counts = recover(new.rec, new.store)
        return new, counts
