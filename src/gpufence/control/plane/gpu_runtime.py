"""The real-GPU side of the control plane: MIG manager, MPS daemons, the GPU sampler.

``GpuRuntime`` is what ``ControlPlane`` holds for this machine's GPUs. On real GPUs (an NVML
``GpuApi``) it

* at start-up, before recovery: starts (or adopts) one MPS control daemon per GPU of a
  fractional partition and hands the reconciler the MIG manager's start-up events (MIG mode
  checks, the instances each GPU has, reconciled with the store's live attempts);
* every ``control.gpu_sample_interval_s`` on its own thread: restarts MPS daemons that died,
  reads each GPU's processes from NVML and reports (or kills) foreign ones, and reads the GPU
  counters (utilisation, memory, PCIe and NVLink throughput: ``gpu_counters.py``) onto the
  board;
* marks every partition enforced or not, with a sentence saying how (``nodes``, ``partitions``,
  ``/metrics``).

On fake GPUs it holds only the MIG manager in timer mode, and says that nothing is enforced;
given a ``counters`` NVML (the fake one: ``gpufence.testing.fake_nvml``, as the demo does), it
samples that NVML's counters and nothing else. The same thread samples this machine's NICs and
the data dir's disk (``observe/hoststats.py``) on real and fake GPUs alike.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from gpufence.control.base.config import ControlConfig
from gpufence.control.base.executor import Launch
from gpufence.control.base.jobdirs import JOBS_DIR
from gpufence.control.gpus.board import GpuBoard
from gpufence.control.gpus.devices import DeviceMap, assignment_from_json
from gpufence.control.gpus.discovery import Discovery
from gpufence.control.gpus.foreign import ForeignCheck, MemberMatcher, MemberRef, launcher_pid
from gpufence.control.gpus.gpu_counters import CountedGpu, GpuCounters
from gpufence.control.gpus.mig_manager import Claim, MigManager
from gpufence.control.gpus.mps import MpsDaemons, MpsGpu
from gpufence.control.gpus.nvml import GpuApi, NvmlError, PynvmlApi
from gpufence.control.gpus.records import DiscoveryError
from gpufence.control.metrics import Telemetry
from gpufence.control.observe.hoststats import HostStats
from gpufence.control.store import database as st
from gpufence.model.cluster import Cluster
from gpufence.model.events import Event
from gpufence.model.partition import SharingMode

log = logging.getLogger("gpufence.gpus")

Holders = list[tuple[str, int, Launch]]
"""(job id, attempt, launch) of every attempt the reconciler has running."""

MemberCgroup = Callable[[Launch, int], str | None]
"""The cgroup of a gang member (launch, rank), where containment gives it one."""


def open_gpu_api(discovery: Discovery, nvml: GpuApi | None = None) -> GpuApi | None:
    """NVML for the control plane's GPU work (None on fake GPUs or when NVML will not start)."""
    if discovery.fake:
        return None
    try:
        api: GpuApi = nvml if nvml is not None else PynvmlApi()
        api.nvmlInit()
    except (DiscoveryError, NvmlError) as exc:
        log.error("NVML unavailable: no MIG management, MPS or foreign-process checks (%s)", exc)
        return None
    return api


class GpuRuntime:
    """See the module docstring."""

    def __init__(
        self,
        cluster: Cluster,
        config: ControlConfig,
        discovery: Discovery,
        data_dir: Path,
        devices: DeviceMap,
        telemetry: Telemetry,
        api: GpuApi | None,
        *,
        threaded: bool = True,
        counters: GpuApi | None = None,
    ) -> None:
        """``counters``: on fake GPUs, an NVML to read GPU counters from (nothing else); on
        real GPUs the counters come from ``api``."""
        self.cluster = cluster
        self.config = config
        self.discovery = discovery
        self.data_dir = data_dir
        self.devices = devices
        self.api = api
        self.board = GpuBoard()
        self.mig = MigManager(
            cluster, devices, api, board=self.board, telemetry=telemetry, threaded=threaded
        )
        self.foreign = ForeignCheck(self.board, telemetry, config.foreign_gpu_processes)
        self.member_cgroup: MemberCgroup = lambda _launch, _rank: None
        """The member's cgroup path (as /proc/PID/cgroup shows it), matched before its session;
        the control plane sets it to ``Containment.path_of`` when containment is on."""
        # this machine is node 0 of the cluster (devices.check_machine)
        self.local = [g for g in cluster.gpus if g.node == 0]
        uuid = {g.index: g.uuid for g in discovery.gpus}
        fractional = [
            MpsGpu(g.gid, g.index, uuid[g.index])
            for g in self.local
            if _sharing(cluster, g.partition) is SharingMode.FRACTIONAL and g.index in uuid
        ]
        self.mps = (
            MpsDaemons(data_dir, fractional, self.board, telemetry)
            if api is not None and fractional
            else None
        )
        for g in self.local:
            if g.index in uuid:
                self.board.set(g.gid, uuid=uuid[g.index])
        nvlink = {g.gid: cluster.gpu_type_of(g.gid).nvlink_gbps for g in self.local}
        counted = [CountedGpu(g.gid, g.index, nvlink[g.gid]) for g in self.local]
        source = api if api is not None else counters
        self.counters = GpuCounters(source, counted) if source is not None else None
        self.host = HostStats(data_dir, config.telemetry.net_devices)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mark_partitions()

    # ------------------------------------------------------------------ start-up
    def startup_events(self, store: st.Store) -> list[Event]:
        """Start MPS, then what the core must hear before anything is placed (MIG)."""
        if self.mps is not None:
            self.mps.start_all()
            self._sync_mps()
            why = self.mps.unavailable
            if why is not None:
                log.warning(
                    "MPS is not available (%s): fractional shares are NOT enforced (a share can "
                    "use its whole GPU's memory and compute)",
                    why,
                )
        self._mark_partitions()
        return self.mig.startup(self._claims(store))

    def _claims(self, store: st.Store) -> list[Claim]:
        """The MIG instances the store's live attempts run on (by their launchers' pid files)."""
        out: list[Claim] = []
        with store.reader() as r:
            rows = r.jobs(states=st.ACTIVE, limit=10**9)
            attempts = [(row, r.attempt(row.id, row.attempt)) for row in rows]
        for row, att in attempts:
            if att is None:
                continue
            adir = self.data_dir / JOBS_DIR / row.id / f"attempt-{att.attempt}"
            if not any(launcher_pid(adir, k) for k in range(len(att.assignments))):
                continue  # ended while the plane was down: recovery settles it
            for a_json, devs in zip(att.assignments, att.devices, strict=False):
                a = assignment_from_json(a_json)
                if a.mig_profile is None or not devs:
                    continue
                out.append(
                    Claim(a.gpus[0], a.mig_profile, a.mig_start or 0, devs[0], row.id, att.attempt)
                )
        return out

    def _sync_mps(self) -> None:
        if self.mps is None:
            return
        for gid in self.mps.gpus():
            self.devices.set_mps(gid, self.mps.pipe_dir(gid))

    def _mark_partitions(self) -> None:
        """Whether each partition's sharing is enforced on the device, and how (for nodes)."""
        fake = self.discovery.fake or self.api is None
        for name, part in self.cluster.partitions.items():
            enforced, how = _enforcement(part.sharing, fake)
            if fake and not self.discovery.fake:
                how = "NVML unavailable: nothing is enforced or checked on the device"
            if part.sharing is SharingMode.FRACTIONAL and not fake:
                gids = set(self.cluster.partition_gpus[name])
                bad = [] if self.mps is None else [g for g in gids if self.mps.pipe_dir(g) is None]
                if self.mps is None or bad:
                    why = self.mps.unavailable if self.mps is not None else None
                    shown = ", ".join(str(self.cluster.gpus[g].index) for g in sorted(bad))
                    enforced = False
                    how = (
                        f"NOT enforced: MPS unavailable ({why})"
                        if why
                        else f"NOT enforced on GPU {shown}: its MPS daemon is not running"
                    ) + "; a share can use more than its GPU memory and compute"
            self.board.set_partition(name, enforced=enforced, enforcement=how)

    # ------------------------------------------------------------------ sampling
    def sample_once(self, holders: Holders) -> None:
        """One sample: MPS daemons and every GPU's processes (real GPUs), the GPU counters,
        this machine's NICs and disk."""
        if self.mps is not None and self.mps.check():
            self._sync_mps()
            self._mark_partitions()
        if self.api is not None:
            self._processes(self.api, holders)
        self._counters_and_host()

    def _counters_and_host(self) -> None:
        if self.counters is not None:
            for s in self.counters.sample():
                self.board.set(s.gid, **s.board_fields())
        self.host.sample()

    def _processes(self, api: GpuApi, holders: Holders) -> None:
        members = [
            MemberRef(
                jid,
                attempt,
                m.rank,
                launcher_pid(launch.attempt_dir, m.rank),
                frozenset(i for d in m.devices if (i := self.devices.gpu_of(d)) is not None),
                self.member_cgroup(launch, m.rank),
            )
            for jid, attempt, launch in holders
            for m in launch.members
        ]
        system = self.mps.system_pids() if self.mps is not None else set()
        matcher = MemberMatcher(members, system)
        for g in self.local:
            try:
                handle = api.nvmlDeviceGetHandleByIndex(g.index)
                procs = api.nvmlDeviceGetComputeRunningProcesses(handle)
            except NvmlError as exc:
                log.debug("GPU %d: no process list from NVML (%s)", g.index, exc)
                continue
            self.foreign.check(g.gid, g.index, procs, matcher)

    def start_watch(self, holders: Callable[[], Holders]) -> None:
        """The sampler thread (the process lists only where there is an NVML)."""
        if self._thread is not None:
            return

        def run() -> None:
            try:  # counters are rates between two readings: take the first one now
                self._counters_and_host()
            except Exception:
                log.exception("first GPU sample failed")
            while not self._stop.wait(self.config.gpu_sample_interval_s):
                try:
                    self.sample_once(holders() if self.api is not None else [])
                except Exception:  # a sampling bug must not end the sampling
                    log.exception("GPU sample failed")

        self._thread = threading.Thread(target=run, name="gpufence-gpu-watch", daemon=True)
        self._thread.start()

    def stop_watch(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10.0)
            self._thread = None

    def close(self, kill_jobs: bool, live: Sequence[Launch]) -> None:
        """Stop the sampler and the MIG worker; stop the MPS daemons no live job uses (all of
        them when the jobs were killed: left running, they are adopted at the next start)."""
        self.stop_watch()
        self.mig.close()
        if self.mps is None:
            return
        busy = {
            i
            for launch in live
            for m in launch.members
            for d in m.devices
            if (i := self.devices.gpu_of(d)) is not None
        }
        idle = [g.gid for g in self.local if g.gid in self.mps.gpus() and g.index not in busy]
        self.mps.stop(None if kill_jobs else idle)


def _sharing(cluster: Cluster, partition: str) -> SharingMode | None:
    part = cluster.partitions.get(partition)
    return None if part is None else part.sharing


def _enforcement(sharing: SharingMode, fake: bool) -> tuple[bool, str]:
    if fake:
        return False, "fake GPUs: sharing is bookkeeping only, nothing runs on a device"
    if sharing is SharingMode.EXCLUSIVE:
        return (
            True,
            "whole GPUs: a job sees only its GPUs (CUDA_VISIBLE_DEVICES); foreign processes "
            "are checked",
        )
    if sharing is SharingMode.MIG:
        return True, "MIG: hardware-isolated instances created by gpufence, one per job"
    if sharing is SharingMode.FRACTIONAL:
        return True, "MPS: each share's compute (active thread %) and pinned GPU memory are capped"
    return (
        False,
        "time-slicing: jobs share the GPU's memory and faults; only their number is capped",
    )
