"""The MIG manager: carries out the core's ``MigReconfigure`` decisions on the GPUs.

On real GPUs (an NVML ``GpuApi``) a decision becomes NVML calls on a worker thread
(``mig_device.apply_layout``: destroy the idle instances the new layout drops, create the new
ones with their placements), so the reconciler never waits on the driver. When it is done the
reconciler is woken; its next cycle takes the result (``ready``):

* success: the MIG UUIDs just created go into the ``DeviceMap`` (what jobs then get in
  ``CUDA_VISIBLE_DEVICES``), with their GPU / compute instance IDs, which name the capability
  devices a job on the instance may open (those of destroyed instances go), and the core hears
  ``MigReconfigured``;
* failure: the GPU's instances are read again and the core hears ``MigLayoutRead`` with what the
  GPU really has, so the job the re-partition was for is placed again; the failure is counted
  (``/metrics``, ``nodes``) and the next try on that GPU waits (5 s, doubling to 5 min).

``startup`` runs before recovery and before anything is placed: it checks each GPU's MIG mode
against its partition (a mismatch, or a mode change waiting for a reset, is reported and the GPU
refused -- gpufence never changes MIG mode), reads the instances each MIG GPU has, and reconciles
them with the attempts the store says run there.

On fake GPUs (no NVML) a re-partition just waits out the decision's ``ready_after_s``.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpufence.control.gpus.board import GpuBoard
from gpufence.control.gpus.devices import DeviceMap
from gpufence.control.gpus.mig_device import (
    DeviceInstance,
    MigApplyError,
    apply_layout,
    ids_of,
    layout_of,
    read_instances,
    uuids_of,
)
from gpufence.control.gpus.nvml import NVML_DEVICE_MIG_ENABLE, GpuApi, NvmlError, maybe
from gpufence.control.metrics import Telemetry
from gpufence.model import mig as migmod
from gpufence.model.cluster import Cluster
from gpufence.model.decisions import MigReconfigure
from gpufence.model.events import Event, MigLayoutRead, MigReconfigured
from gpufence.model.partition import SharingMode

log = logging.getLogger("gpufence.mig")

RETRY_FIRST_S = 5.0
RETRY_MAX_S = 300.0


@dataclass(frozen=True)
class Claim:
    """A MIG instance the store says a live attempt runs on."""

    gpu: int  # global GPU id
    profile: str
    start: int
    uuid: str
    job_id: str
    attempt: int


@dataclass(frozen=True)
class _Job:
    gpu: int
    index: int
    target: tuple[migmod.MigInstance, ...]


@dataclass(frozen=True)
class _Result:
    gpu: int
    index: int
    ok: bool
    layout: tuple[str, ...]
    uuids: dict[tuple[str, int], str] = field(default_factory=dict)
    ids: dict[tuple[str, int], tuple[int, int | None]] = field(default_factory=dict)
    error: str = ""
    usable: bool = True


def _entry(i: migmod.MigInstance) -> str:
    return f"{i.profile}@{i.start}"


class MigManager:
    """See the module docstring. ``reconfigure``, ``next_due`` and ``ready`` are called on the
    reconciler thread; ``threaded=False`` runs the NVML work inline in ``ready`` (tests)."""

    def __init__(
        self,
        cluster: Cluster,
        devices: DeviceMap,
        api: GpuApi | None = None,
        *,
        board: GpuBoard | None = None,
        telemetry: Telemetry | None = None,
        threaded: bool = True,
    ) -> None:
        self.cluster = cluster
        self.devices = devices
        self.api = api
        self.board = board or GpuBoard()
        self.telemetry = telemetry
        self.threaded = threaded
        self._due: dict[int, tuple[float, _Job | None]] = {}  # gpu -> (when, job; None: timer)
        self._retry_at: dict[int, float] = {}
        self._failures: dict[int, int] = {}
        self._results: queue.SimpleQueue[_Result] = queue.SimpleQueue()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._wake: Callable[[], None] = lambda: None
        self._thread: threading.Thread | None = None
        self.in_flight: set[int] = set()

    def set_wake(self, wake: Callable[[], None]) -> None:
        """How the worker wakes the reconciler when a re-partition is done."""
        self._wake = wake

    def _profiles(self, gid: int) -> dict[str, migmod.MigProfile]:
        model = self.cluster.gpu_type_of(gid).mig_model
        return dict(migmod.profiles_for(model)) if model else {}

    # ------------------------------------------------------------------ start-up
    def startup(self, claims: Sequence[Claim] = ()) -> list[Event]:
        """The events that tell the core what the GPUs really have (see the module docstring);
        empty on fake GPUs. Runs before the reconciler thread starts."""
        api = self.api
        if api is None:
            return []
        events: list[Event] = []
        by_gpu: dict[int, list[Claim]] = {}
        for c in claims:
            by_gpu.setdefault(c.gpu, []).append(c)
        for gpu in self.cluster.gpus:
            if gpu.node != 0:
                continue  # the local machine is the cluster's one node (devices.check_machine)
            try:
                ev = self._startup_gpu(api, gpu.gid, gpu.index, by_gpu.get(gpu.gid, []))
            except NvmlError as exc:
                ev = self._refuse(
                    gpu.gid, f"GPU {gpu.index}: NVML cannot tell its MIG state ({exc})"
                )
            if ev is not None:
                events.append(ev)
        return events

    def _refuse(self, gid: int, why: str, layout: tuple[str, ...] = ()) -> MigLayoutRead:
        log.warning("%s; gpufence does not place work on it", why)
        self.board.set(gid, refused=why)
        return MigLayoutRead(gid, layout, usable=False)

    def _startup_gpu(
        self, api: GpuApi, gid: int, index: int, claims: list[Claim]
    ) -> MigLayoutRead | None:
        handle = api.nvmlDeviceGetHandleByIndex(index)
        gpu = self.cluster.gpus[gid]
        part = self.cluster.partitions.get(gpu.partition)
        want = part is not None and part.sharing is SharingMode.MIG
        mode = maybe(api.nvmlDeviceGetMigMode, handle)
        current = mode is not None and int(mode[0]) == NVML_DEVICE_MIG_ENABLE
        pending = mode is not None and int(mode[1]) == NVML_DEVICE_MIG_ENABLE
        where = f"GPU {index} (partition {gpu.partition}, sharing {part.sharing if part else '-'})"
        if current != pending:
            return self._refuse(
                gid,
                f"{where}: a MIG mode change to {'on' if pending else 'off'} waits for a GPU "
                "reset (nvidia-smi -i N -r), or undo it",
            )
        if want and not current:
            how = "this GPU has no MIG" if mode is None else "MIG mode is off"
            return self._refuse(
                gid,
                f"{where}: {how}; enable it (nvidia-smi -i {index} -mig 1, on an idle GPU) or "
                "put the GPU in a partition that shares whole GPUs",
            )
        if not want and current:
            return self._refuse(
                gid,
                f"{where}: MIG mode is on, so the GPU cannot be handed out whole; disable it "
                f"(nvidia-smi -i {index} -mig 0, on an idle GPU) or put it in a mig partition",
            )
        if not want:
            return None
        instances = read_instances(api, handle, self._profiles(gid))
        for d in instances:
            if not d.complete:
                log.warning(
                    "GPU %d: GPU instance %s (%d compute instances) is not one gpufence uses",
                    index,
                    d.entry,
                    d.compute_instances,
                )
        layout = list(layout_of(instances))
        uuids = uuids_of(instances)
        lost = self._reconcile(index, instances, claims, layout, uuids)
        self.devices.set_mig(index, uuids, ids_of(instances))
        log.info("GPU %d: MIG instances [%s]", index, ", ".join(layout) or "none")
        if lost:
            return self._refuse(gid, f"GPU {index}: {lost}", tuple(layout))
        return MigLayoutRead(gid, tuple(layout))

    def _reconcile(
        self,
        index: int,
        instances: list[DeviceInstance],
        claims: list[Claim],
        layout: list[str],
        uuids: dict[tuple[str, int], str],
    ) -> str:
        """Fold the store's live attempts into the layout; a sentence if one lost its instance.

        An instance a live attempt was given but the GPU no longer has (someone re-partitioned
        it while gpufence was down) stays in the core's layout, so the attempt is taken back
        where the store says it runs and nothing else is placed over it; the GPU is then
        refused, since its layout is not what gpufence thinks."""
        have = {(d.profile, d.start): d.uuid for d in instances if d.complete}
        lost: list[str] = []
        for c in claims:
            uuid = have.get((c.profile, c.start))
            if uuid == c.uuid:
                continue
            what = (
                f"job {c.job_id} attempt {c.attempt} runs on MIG {c.profile}@{c.start} ({c.uuid})"
            )
            if uuid is not None:
                log.warning("GPU %d: %s, which now has UUID %s", index, what, uuid)
                continue
            lost.append(what)
            entry = f"{c.profile}@{c.start}"
            if entry not in layout:
                layout.append(entry)
            uuids[(c.profile, c.start)] = c.uuid
        if not lost:
            return ""
        return "; ".join(lost) + ", an instance this GPU no longer has: fix its MIG layout"

    # ------------------------------------------------------------------ decisions
    def reconfigure(self, d: MigReconfigure, now: float) -> None:
        """Carry out a decision: at once on real GPUs (or after the backoff of a failure on the
        same GPU), after ``ready_after_s`` on fake ones."""
        gid = d.gpu
        self.board.set(gid, mig_status=f"re-partitioning to [{', '.join(d.layout)}]")
        if self.api is None:
            self._due[gid] = (now + d.ready_after_s, None)
            return
        target = tuple(
            migmod.MigInstance(name, int(start))
            for name, _, start in (e.rpartition("@") for e in d.layout)
        )
        job = _Job(gid, self.cluster.gpus[gid].index, target)
        self._due[gid] = (max(now, self._retry_at.get(gid, now)), job)

    def next_due(self) -> float | None:
        """When ``ready`` has something to do without being woken (a timer or a retry)."""
        return min((t for t, _ in self._due.values()), default=None)

    def ready(self, now: float) -> list[Event]:
        """Start what is due; the events of every re-partition that has finished."""
        events: list[Event] = []
        for gid, (due, job) in sorted(self._due.items()):
            if due > now:
                continue
            del self._due[gid]
            if job is None:
                self.board.set(gid, mig_status=None)
                events.append(MigReconfigured(gid))
            else:
                self._submit(job)
        while True:
            try:
                res = self._results.get_nowait()
            except queue.Empty:
                return events
            events.append(self._finished(res, now))

    def _submit(self, job: _Job) -> None:
        self.in_flight.add(job.gpu)
        if not self.threaded:
            self._results.put(self._run(job))
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="gpufence-mig", daemon=True)
            self._thread.start()
        self._jobs.put(job)

    def _finished(self, res: _Result, now: float) -> Event:
        gid = res.gpu
        self.in_flight.discard(gid)
        self.devices.set_mig(res.index, res.uuids, res.ids)
        self.board.set(gid, mig_status=None)
        if res.ok:
            self._failures.pop(gid, None)
            self._retry_at.pop(gid, None)
            self.board.set(gid, mig_error=None)
            if self.telemetry is not None:
                self.telemetry.mig_reconfigured(True)
            log.info("GPU %d re-partitioned: [%s]", res.index, ", ".join(res.layout))
            return MigReconfigured(gid)
        n = self._failures[gid] = self._failures.get(gid, 0) + 1
        backoff = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (n - 1))
        self._retry_at[gid] = now + backoff
        self.board.set(gid, mig_error=res.error)
        self.board.bump(gid, "mig_failures")
        if not res.usable:
            self.board.set(gid, refused=res.error)
        if self.telemetry is not None:
            self.telemetry.mig_reconfigured(False)
        log.warning(
            "GPU %d: re-partition failed (%s); it has [%s]; next try in %g s",
            res.index,
            res.error,
            ", ".join(res.layout),
            backoff,
        )
        return MigLayoutRead(gid, res.layout, usable=res.usable, failed=res.error)

    # ------------------------------------------------------------------ NVML work
    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            self._results.put(self._run(job))
            self._wake()

    def _run(self, job: _Job) -> _Result:
        api = self.api
        assert api is not None
        profiles = self._profiles(job.gpu)
        wanted = sorted(_entry(i) for i in job.target)
        error = ""
        try:
            handle = api.nvmlDeviceGetHandleByIndex(job.index)
            apply_layout(api, handle, profiles, job.target)
        except (MigApplyError, NvmlError) as exc:
            error = str(exc)
        try:
            handle = api.nvmlDeviceGetHandleByIndex(job.index)
            instances = read_instances(api, handle, profiles)
        except NvmlError as exc:
            why = f"{error + '; ' if error else ''}its MIG instances cannot be read ({exc})"
            return _Result(job.gpu, job.index, False, (), error=why, usable=False)
        layout, uuids, ids = layout_of(instances), uuids_of(instances), ids_of(instances)
        if not error and sorted(layout) != wanted:
            error = f"NVML reported success, but the GPU has [{', '.join(layout)}]"
        if error:
            return _Result(job.gpu, job.index, False, layout, uuids, ids, error)
        order = {e: k for k, e in enumerate(_entry(i) for i in job.target)}
        layout = tuple(sorted(layout, key=order.__getitem__))
        return _Result(job.gpu, job.index, True, layout, uuids, ids)

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(10.0)
            self._thread = None


def store_line(ev: Event) -> tuple[str, str] | None:
    """(kind, message) for the decision log of a MIG event worth keeping there, else None."""
    if not isinstance(ev, MigLayoutRead):
        return None
    have = f"it has [{', '.join(ev.layout)}]"
    if ev.failed:
        return "mig-failed", f"GPU {ev.gpu}: re-partition failed: {ev.failed}; {have}"
    if not ev.usable:
        return "gpu-refused", f"GPU {ev.gpu}: not used ({have}); see `gpufence nodes`"
    return None
