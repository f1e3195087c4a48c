"""``Containment``: what an executor holds to put each gang member in its own cgroup.

It names a member's cgroup from its launch (``JOB.aATTEMPT.rRANK.HASH``, the hash of the attempt
directory: unique per data directory, and the same after a restart, so adoption finds it again
without trusting anything the job could have written), creates it with the member's limits (the
default ``pids_max`` where the job gave none) and device rules (every GPU device node of this
machine except the member's own, ``Member.device_nodes``), and re-opens it on adoption. The
launcher's child joins it before exec (``launcher_args``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from gpufence.control.base.containment_settings import ContainmentSettings
from gpufence.control.base.executor import Launch, Limits, Member, RunAs
from gpufence.control.containment.cgroup import CgroupDriver, ContainmentError, MemberCgroup
from gpufence.control.containment.detect import detect
from gpufence.control.containment.devicerules import denied, missing

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
SPARE_PREFIX = "spare-"
"""Spare cgroups: ``spare-PID-N`` (PID: the control plane that made it)."""


def cgroup_name(launch: Launch, rank: int) -> str:
    return member_cgroup_name(launch.job_id, launch.attempt, launch.attempt_dir, rank)


def member_cgroup_name(job_id: str, attempt: int, attempt_dir: Path, rank: int) -> str:
    """``JOB.aATTEMPT.rRANK.HASH``, HASH from the attempt directory's absolute path."""
    digest = hashlib.sha256(str(attempt_dir.absolute()).encode()).hexdigest()[:12]
    job = _UNSAFE.sub("_", job_id)[:48]
    return f"{job}.a{attempt}.r{rank}.{digest}"


def _owner_gone(name: str) -> bool:
    """``spare-PID-N``: the control plane PID is no more."""
    owner = name[len(SPARE_PREFIX) :].split("-")[0]
    return owner.isdigit() and not os.path.exists(f"/proc/{owner}")


def launcher_args(
    cgroup: MemberCgroup | None, run_as: RunAs | None, cwd: Path | str | None = None
) -> list[str]:
    """The launcher options that confine the job: its cgroup directories, its user, then the
    working directory it enters as that user."""
    out: list[str] = []
    for d in cgroup.join_dirs if cgroup is not None else ():
        out += ["--cgroup", d]
    if run_as is not None:
        out += ["--uid", str(run_as.uid), "--gid", str(run_as.gid)]
        out += ["--groups", ",".join(str(g) for g in run_as.groups)]
    if cwd is not None:
        out += ["--cwd", str(cwd)]
    return out


class Containment:
    """The cgroups of this machine's members (see the module docstring)."""

    def __init__(
        self,
        driver: CgroupDriver,
        settings: ContainmentSettings | None = None,
        gpu_nodes: Sequence[str] = (),
    ) -> None:
        self.driver = driver
        self.settings = settings or ContainmentSettings()
        self.gpu_nodes = tuple(gpu_nodes)
        """Every GPU device node of this machine (whole GPUs and MIG capabilities)."""
        self._spares = 0

    @classmethod
    def detect(
        cls, settings: ContainmentSettings | None = None, gpu_nodes: Sequence[str] = ()
    ) -> Containment:
        """The containment this machine offers; ``ContainmentError`` (with the fix) if none."""
        s = settings or ContainmentSettings()
        return cls(detect(s), s, gpu_nodes)

    def describe(self) -> str:
        text = self.driver.describe()
        if self.driver.device_isolation != "off":
            gone = missing(self.gpu_nodes)
            if not self.gpu_nodes:
                text += " (no GPU device nodes known: nothing to isolate)"
            elif gone:
                text += f" (not device nodes, so not isolated: {', '.join(gone)})"
            else:
                text += f" over {len(self.gpu_nodes)} GPU device node(s)"
        if self.settings.pids_max is not None:
            text += f"; pids.max {self.settings.pids_max} per member unless the job sets one"
        return text

    def limits(self, launch: Launch | None) -> Limits:
        """The member's limits: its launch's, with the default ``pids_max`` where it has none."""
        lim = launch.limits if launch is not None else Limits()
        if lim.pids is None and self.settings.pids_max is not None:
            lim = replace(lim, pids=self.settings.pids_max)
        return lim

    def create(self, launch: Launch, member: Member) -> MemberCgroup:
        deny = denied(self.gpu_nodes, member.device_nodes) if self.gpu_nodes else ()
        return self.driver.create(cgroup_name(launch, member.rank), self.limits(launch), deny)

    def open(self, launch: Launch, rank: int) -> MemberCgroup | None:
        return self.driver.open(cgroup_name(launch, rank))

    def path_of(self, launch: Launch, rank: int) -> str:
        """The member's cgroup as ``/proc/PID/cgroup`` names it: what attributes a process on a
        GPU to its job (``gpus.runtime.GpuRuntime.member_cgroup``), whatever it did to leave
        the member's session or process group."""
        return self.driver.path_of(cgroup_name(launch, rank))

    # ------------------------------------------------------------------ spares
    def spare(self) -> MemberCgroup:
        """A new spare cgroup for a pre-started member (``prestart.py``), named for this
        process, so that only a later control plane clears it once this one is gone. It has the
        default limits and every GPU denied already: a typical start writes only the allow
        line for its own GPUs."""
        self._spares += 1
        name = f"{SPARE_PREFIX}{os.getpid()}-{self._spares}"
        deny = denied(self.gpu_nodes, ()) if self.gpu_nodes else ()
        return self.driver.create(name, self.limits(None), deny)

    def claim(self, spare: MemberCgroup, launch: Launch, member: Member) -> MemberCgroup:
        deny = denied(self.gpu_nodes, member.device_nodes) if self.gpu_nodes else ()
        name = cgroup_name(launch, member.rank)
        return self.driver.claim(spare, name, self.limits(launch), deny)

    def finish(self, cgroup: MemberCgroup) -> None:
        """What a claim left for after the start (``CgroupDriver.finish``)."""
        self.driver.finish(cgroup)

    def sweep(self) -> int:
        """Kill and remove spare cgroups left by control planes that are gone (a ``kill -9``);
        how many."""
        n = 0
        self.driver.tidy(SPARE_PREFIX, _owner_gone)
        for name in self.driver.names():
            if not name.startswith(SPARE_PREFIX) or not _owner_gone(name):
                continue
            cg = self.driver.open(name)
            if cg is None:
                continue
            with contextlib.suppress(ContainmentError):
                cg.kill()
            for _ in range(100):
                if cg.empty():
                    break
                time.sleep(0.005)
            n += cg.remove()
        return n

    def release(self) -> None:
        self.driver.release()
