"""Containment on real cgroups: each member in its own cgroup, over only when it is empty.

Runs the LocalExecutor with each cgroup mode this machine has (v1 hierarchies; the v2 tree,
where it has no controllers, for tracking, kill and BPF device isolation) and with and without
pre-started members. Jobs escape as jobs do (``setsid``, a double fork, ``nohup``); device nodes
are ``mknod`` character devices standing in for ``/dev/nvidiaN``.
"""

from __future__ import annotations

import errno
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from containment_helpers import (
    MODES,
    alive,
    executor,
    launcher_born,
    mknod,
    uptime_ticks,
    wait_for_removal,
    wait_spares,
)
from executor_helpers import Recorder, make_launch

from gpufence.control.base.executor import AttemptExit, Launch, Limits, Member
from gpufence.control.base.member_records import exit_file
from gpufence.control.containment.cgroup import CgroupDriver, ContainmentError
from gpufence.control.containment.members import cgroup_name
from gpufence.control.executors.processes import LAUNCHER
from gpufence.testing.waiting import file_appears

Cgroups = Callable[[str, tuple[str, ...]], CgroupDriver]

ESCAPES = """
    ck=$GPUFENCE_CHECKPOINT_DIR
    setsid sleep 300 & echo $! > "$ck/setsid"
    ( sleep 301 & echo $! > "$ck/double-fork" )
    nohup sleep 302 > /dev/null 2>&1 & echo $! > "$ck/nohup"
    exit 0
"""


class AtExit(Recorder):
    """Also records, at the moment the exit is reported (when the control plane frees the
    GPUs), which of the job's escaped processes were still alive."""

    def __init__(self, pid_files: list[Path]) -> None:
        super().__init__()
        self.pid_files = pid_files
        self.alive_at_exit: list[int] = []

    def on_exit(self, ev: AttemptExit) -> None:
        pids = [int(p.read_text()) for p in self.pid_files if p.exists()]
        self.alive_at_exit = [p for p in pids if alive(p)]
        super().on_exit(ev)


@pytest.mark.parametrize("prestarted", [0, 2])
def test_escaped_processes_are_killed_before_the_exit_is_reported(
    tmp_path: Path, driver: CgroupDriver, prestarted: int
) -> None:
    launch = make_launch(tmp_path, command=("sh", "-c", textwrap.dedent(ESCAPES)))
    files = [launch.checkpoint_dir / n for n in ("setsid", "double-fork", "nohup")]
    rec = AtExit(files)
    with executor(driver, prestarted=prestarted) as ex:
        ex.set_callbacks(rec.on_exit, rec.on_ack)
        spares = prestarted if driver.renames else 0  # v2 cannot rename: no pre-started ones
        wait_spares(driver, spares)
        before = uptime_ticks()
        ex.start(launch)
        _, ev = rec.exit(timeout=10)
        pids = [int(f.read_text()) for f in files]
        assert (launcher_born(launch.attempt_dir) < before) == bool(
            spares
        )  # the launcher was pre-started (or not)
        assert ev == AttemptExit("job-1", 1, True, (0,), False, strays_killed=3, stop_reached=False)
        assert rec.alive_at_exit == []  # none ran on when the GPUs were given back
        assert not any(alive(p) for p in pids)
        wait_for_removal(driver, cgroup_name(launch, 0))


def test_stop_kills_processes_that_left_the_process_group(
    tmp_path: Path, driver: CgroupDriver
) -> None:
    script = """
        import os, signal, subprocess, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        # a daemon in its own session that ignores SIGTERM too: only the cgroup still holds it
        child = subprocess.Popen(["sleep", "300"], start_new_session=True)
        ready = os.path.join(os.environ["GPUFENCE_CHECKPOINT_DIR"], "ready")
        with open(ready + ".tmp", "w") as fh:
            fh.write(str(child.pid))
        os.replace(ready + ".tmp", ready)
        time.sleep(300)
    """
    rec = Recorder()
    launch = make_launch(tmp_path, script)
    with executor(driver) as ex:
        ex.set_callbacks(rec.on_exit, rec.on_ack)
        ex.start(launch)
        file_appears(launch.checkpoint_dir / "ready")
        daemon = int((launch.checkpoint_dir / "ready").read_text())
        t0 = time.monotonic()
        ex.stop("job-1", 1, grace_s=0.3)
        _, ev = rec.exit(timeout=10)
        assert 0.3 <= time.monotonic() - t0 < 3.0
        assert ev.codes == (-signal.SIGKILL,) and ev.stopped
        assert not alive(daemon)


OPENS = """
    import errno, json, os, sys
    out = {}
    for path in sys.argv[1:]:
        try:
            os.close(os.open(path, os.O_RDONLY))
            out[path] = "ok"
        except OSError as exc:
            out[path] = errno.errorcode[exc.errno]
    print(json.dumps(out))
"""


@pytest.mark.parametrize("prestarted", [0, 2])
def test_a_member_opens_only_its_own_gpus_device_nodes(
    tmp_path: Path, driver: CgroupDriver, prestarted: int
) -> None:
    if driver.device_isolation == "off":
        pytest.skip(f"device isolation is off in this mode: {driver.describe()}")
    # /dev/full and /dev/random's numbers: a real driver answers, so "allowed" means opened
    gpu0, gpu1 = mknod(tmp_path / "fake0", 1, 7), mknod(tmp_path / "fake1", 1, 8)
    own = tmp_path / "mine"  # a node the job could make for itself: refused all the same
    mknod(own, 1, 7)
    member = Member(0, "n", ("1",), device_nodes=(str(gpu1),))
    cmd = (sys.executable, "-c", textwrap.dedent(OPENS), str(gpu0), str(gpu1), str(own))
    launch = make_launch(tmp_path, command=(*cmd, "/dev/null"), members=(member,))
    rec = Recorder()
    with executor(driver, gpu_nodes=(str(gpu0), str(gpu1)), prestarted=prestarted) as ex:
        ex.set_callbacks(rec.on_exit, rec.on_ack)
        wait_spares(driver, prestarted if driver.renames else 0)
        ex.start(launch)
        assert rec.exit(timeout=10)[1].succeeded
    seen = (launch.attempt_dir / "rank-0.out").read_text()
    assert f'"{gpu1}": "ok"' in seen
    assert f'"{gpu0}": "{errno.errorcode[errno.EPERM]}"' in seen
    assert f'"{own}": "{errno.errorcode[errno.EPERM]}"' in seen
    assert '"/dev/null": "ok"' in seen  # shared devices stay as they were


@pytest.mark.parametrize("mode", MODES)
def test_over_its_memory_limit_a_member_is_oom_killed_and_reported(
    tmp_path: Path, cgroups: Cgroups, mode: str
) -> None:
    d = cgroups(mode, ("memory",))
    script = """
        hog = bytearray(512 << 20)  # touches every page: 512 MiB against a 64 MiB limit
        print("survived", len(hog), flush=True)
    """
    launch = make_launch(tmp_path, script, limits=Limits(mem_bytes=64 << 20))
    ev = _run(d, launch, timeout=20)
    assert ev.oom and not ev.succeeded
    assert ev.codes == (-signal.SIGKILL,)
    assert "survived" not in (launch.attempt_dir / "rank-0.out").read_text()


BUSY = """
    import os, sys, time
    n = int(sys.argv[1])
    for _ in range(n - 1):
        if os.fork() == 0:
            break
    t0, c0 = time.monotonic(), time.process_time()
    while time.monotonic() - t0 < 1.5:
        pass
    print(f"{(time.process_time() - c0) / (time.monotonic() - t0):.3f}", flush=True)
"""


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("cpus", "procs", "most"), [(0.5, 1, 0.65), (1.0, 2, 1.2)])
def test_a_cpu_limit_caps_busy_loops(
    tmp_path: Path, cgroups: Cgroups, mode: str, cpus: float, procs: int, most: float
) -> None:
    d = cgroups(mode, ("cpu",))
    cmd = (sys.executable, "-c", textwrap.dedent(BUSY), str(procs))
    launch = make_launch(tmp_path, command=cmd, limits=Limits(cpus=cpus))
    assert _run(d, launch, timeout=20).succeeded
    shares = [float(x) for x in (launch.attempt_dir / "rank-0.out").read_text().split()]
    assert len(shares) == procs
    assert sum(shares) <= most, f"{procs} busy loop(s) under cpus={cpus} used {shares} of a core"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("prestarted", [0, 2])
def test_a_pids_limit_stops_a_fork_bomb(
    tmp_path: Path, cgroups: Cgroups, mode: str, prestarted: int
) -> None:
    d = cgroups(mode, ("pids",))
    script = """
        import subprocess
        started, refused = [], 0
        for _ in range(40):
            try:
                started.append(subprocess.Popen(["sleep", "5"]))
            except OSError:
                refused += 1
        print(len(started), refused, flush=True)
        for p in started:
            p.kill()
    """
    launch = make_launch(tmp_path, script, limits=Limits(pids=16))
    _run(d, launch, timeout=20, prestarted=prestarted)
    started, refused = map(int, (launch.attempt_dir / "rank-0.out").read_text().split())
    assert started < 16 and refused > 0


def test_the_default_pids_max_applies_when_the_job_sets_none(
    tmp_path: Path, v1: CgroupDriver
) -> None:
    script = """
        for line in open("/proc/self/cgroup"):
            _, ctrl, path = line.strip().split(":", 2)
            if ctrl == "pids":
                print(open(f"/sys/fs/cgroup/pids{path}/pids.max").read().strip())
    """
    launch = make_launch(tmp_path, script)
    assert _run(v1, launch, pids_max=77).succeeded
    assert (launch.attempt_dir / "rank-0.out").read_text().split() == ["77"]


def test_a_job_whose_cgroup_cannot_be_joined_never_runs(tmp_path: Path) -> None:
    adir = tmp_path / "attempt-1"
    adir.mkdir()
    marker = tmp_path / "ran"
    gone = tmp_path / "no-such-cgroup"
    cmd = [sys.executable, "-I", "-S", str(LAUNCHER), str(adir), "--rank", "0"]
    cmd += ["--cgroup", str(gone), "--", "touch", str(marker)]
    assert subprocess.run(cmd, timeout=30).returncode == 125
    assert not marker.exists()
    assert f"cannot join cgroup {gone}" in (adir / "rank-0.err").read_text()
    assert '"code": 125' in exit_file(adir, 0).read_text()


def _run(
    driver: CgroupDriver,
    launch: Launch,
    timeout: float = 10.0,
    pids_max: int | None = None,
    prestarted: int = 0,
) -> AttemptExit:
    rec = Recorder()
    with executor(driver, pids_max=pids_max, prestarted=prestarted) as ex:
        ex.set_callbacks(rec.on_exit, rec.on_ack)
        wait_spares(driver, prestarted if driver.renames else 0)
        ex.start(launch)
        return rec.exit(timeout=timeout)[1]


def test_a_claim_takes_over_an_empty_leftover_of_its_name_but_not_a_populated_one(
    v1: CgroupDriver,
) -> None:
    """A member cgroup name comes back when a job id is used again (a data directory deleted
    and recreated): an empty leftover is replaced; one that still holds processes is refused,
    never joined."""
    leftover = v1.create("j1.a1.r0.000000000000", Limits(), ())
    member = v1.claim(v1.create("spare-1-1", Limits(), ()), leftover.name, Limits(), ())
    assert member.name == leftover.name and member.empty()
    v1.finish(member)
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        for d in member.join_dirs:  # as the launcher joins: every hierarchy
            (Path(d) / "cgroup.procs").write_text(str(sleeper.pid))
        with pytest.raises(ContainmentError, match="already holds processes"):
            v1.claim(v1.create("spare-1-2", Limits(), ()), member.name, Limits(), ())
    finally:
        sleeper.kill()
        sleeper.wait()
