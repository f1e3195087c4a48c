"""Real cgroups, device nodes and users for the containment tests (this machine must be root).

Every cgroup parent, device node and user is named for this test process plus a random suffix
(another helper may run the same tests at the same time) and removed afterwards. Where the
machine lacks what a test needs (not root, no v1 hierarchy, a v2 tree without the controller),
the test is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufence.control.base.containment_settings import ContainmentSettings
from gpufence.control.base.executor import RunAs
from gpufence.control.base.member_records import pid_file
from gpufence.control.containment import mounts
from gpufence.control.containment.cgroup import CgroupDriver, ContainmentError, read_pids
from gpufence.control.containment.cgroupv1 import V1Driver
from gpufence.control.containment.cgroupv2 import V2Driver
from gpufence.control.containment.members import Containment
from gpufence.control.executors.local.local_executor import LocalExecutor
from unix_users import unix_users

MODES = ("v1", "v2")


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("containment tests need root (cgroups, mknod, useradd)")


def unique(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{secrets.token_hex(3)}"


def make_driver(mode: str, parent: str, controllers: tuple[str, ...] = ()) -> CgroupDriver:
    """The ``mode`` driver under ``parent``; skips the test with the reason if this machine
    cannot give it (with ``controllers``: v2 must offer them)."""
    need_root()
    m = mounts.current()
    try:
        if mode == "v1":
            return V1Driver.probe(m.v1, parent)
        if m.v2 is None:
            pytest.skip("no cgroup v2 hierarchy mounted on this machine")
        return V2Driver.probe(m.v2, parent, required=controllers)
    except ContainmentError as exc:
        pytest.skip(f"{mode} unavailable here: {exc}")


def clear(driver: CgroupDriver) -> None:
    """Kill and remove everything left under the driver's parent (in every hierarchy: a claim
    interrupted on purpose leaves a spare's name outside the freezer one), then the parent."""
    for name in driver.names():
        cg = driver.open(name)
        if cg is None:
            continue
        with contextlib.suppress(ContainmentError):
            cg.kill()
        deadline = time.monotonic() + 2
        while not cg.empty() and time.monotonic() < deadline:
            time.sleep(0.01)
        cg.remove()
    driver.tidy("", lambda _name: True)
    driver.release()


@contextlib.contextmanager
def executor(
    driver: CgroupDriver | None,
    gpu_nodes: tuple[str, ...] = (),
    prestarted: int = 0,
    pids_max: int | None = None,
    **kw: object,
) -> Iterator[LocalExecutor]:
    settings = ContainmentSettings(pids_max=pids_max, prestarted=prestarted)
    contain = Containment(driver, settings, gpu_nodes) if driver is not None else None
    ex = LocalExecutor(containment=contain, **kw)  # type: ignore[arg-type]
    try:
        yield ex
    finally:
        ex.close(kill=True)


def mknod(path: Path, major: int, minor: int) -> Path:
    """A character device node, the way a GPU's /dev/nvidiaN appears."""
    need_root()
    os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))
    os.chmod(path, 0o666)
    return path


@contextlib.contextmanager
def unix_user() -> Iterator[RunAs]:
    """A throw-away Unix user (``tests/unix_users.py``: named for this process, removed after),
    as the job's ``RunAs`` (its own group its only one)."""
    need_root()
    with unix_users("job") as (user,):
        yield RunAs(user.name, user.uid, user.gid, (user.gid,))


def alive(pid: int) -> bool:
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return data[data.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def wait_spares(driver: CgroupDriver, n: int, limit_s: float = 10.0) -> None:
    """Until ``n`` pre-started members wait in their spare cgroups (their child has joined the
    last hierarchy, as the pool counts them ready)."""
    deadline = time.monotonic() + limit_s
    while True:
        ready = 0
        for name in driver.names():
            cg = driver.open(name) if name.startswith("spare-") else None
            if cg is not None and read_pids(Path(cg.join_dirs[-1]) / "cgroup.procs"):
                ready += 1
        if ready >= n:
            time.sleep(0.05)  # the pool's own look (every 2 ms)
            return
        assert time.monotonic() < deadline, f"only {ready} of {n} pre-started members ready"
        time.sleep(0.01)


def wait_for_removal(driver: CgroupDriver, name: str, limit_s: float = 5.0) -> None:
    """The member's cgroup is removed once empty (after its exit is reported)."""
    deadline = time.monotonic() + limit_s
    while driver.open(name) is not None:
        assert time.monotonic() < deadline, f"cgroup {name} was never removed"
        time.sleep(0.01)


def uptime_ticks() -> int:
    """Now, in the clock ticks since boot that ``/proc/PID/stat`` start times use."""
    return int(float(Path("/proc/uptime").read_text().split()[0]) * os.sysconf("SC_CLK_TCK"))


def launcher_born(attempt_dir: Path, rank: int = 0) -> int:
    """When the member's launcher was forked (its pid record), in clock ticks since boot."""
    return int(json.loads(pid_file(attempt_dir, rank).read_text())["start_time"])
