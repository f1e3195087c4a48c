"""Jobs outlive the control plane, in their cgroups: adoption re-opens a member's cgroup by name.

A restarted executor finds each member's cgroup again (the name comes from the attempt
directory, nothing the job wrote), stops it through it, kills the strays of a job that ended
while nobody watched and the rest of a member whose launcher died. A control plane killed with
SIGKILL takes its fork server with it, not its jobs: the launchers run on and are adopted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from containment_helpers import alive, executor, wait_for_removal
from executor_helpers import Recorder, make_launch, recorded

from gpufence.control.base.containment_settings import ContainmentSettings
from gpufence.control.base.executor import Launch
from gpufence.control.base.member_records import exit_file, started_file
from gpufence.control.containment import mounts
from gpufence.control.containment.cgroup import CgroupDriver
from gpufence.control.containment.members import Containment, cgroup_name
from gpufence.control.executors.local.local_executor import LocalExecutor
from gpufence.testing.waiting import file_appears

DAEMON_THEN_WAIT = """
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    d = subprocess.Popen(["sleep", "300"], start_new_session=True)
    ck = os.environ["GPUFENCE_CHECKPOINT_DIR"]
    with open(os.path.join(ck, "daemon.tmp"), "w") as fh:
        fh.write(str(d.pid))
    os.replace(os.path.join(ck, "daemon.tmp"), os.path.join(ck, "daemon"))
    while not os.path.exists(os.path.join(ck, "go")):
        time.sleep(0.02)
    sys.exit(int(sys.argv[1]))
"""


def _launch(tmp_path: Path, code: int = 0) -> Launch:
    return make_launch(
        tmp_path, command=(sys.executable, "-c", textwrap.dedent(DAEMON_THEN_WAIT), str(code))
    )


def _abandon(driver: CgroupDriver, launch: Launch) -> int:
    """Start ``launch`` under a first executor that then goes away; the daemon's pid."""
    settings = ContainmentSettings(pids_max=None, prestarted=0)
    first = LocalExecutor(containment=Containment(driver, settings))
    first.start(launch)
    file_appears(launch.checkpoint_dir / "daemon", 10)
    first.close(kill=False)
    return int((launch.checkpoint_dir / "daemon").read_text())


def test_an_adopted_member_is_stopped_through_its_cgroup(
    tmp_path: Path, driver: CgroupDriver
) -> None:
    launch = _launch(tmp_path)
    daemon = _abandon(driver, launch)
    rec = Recorder()
    with executor(driver) as second:
        second.set_callbacks(rec.on_exit, rec.on_ack)
        assert second.adopt(launch) is True
        second.stop("job-1", 1, grace_s=0.3)
        _, ev = rec.exit(timeout=10)
        assert ev.stopped and ev.codes == (-signal.SIGKILL,)
        assert not alive(daemon)
        wait_for_removal(driver, cgroup_name(launch, 0))  # removed once empty


def test_strays_of_a_job_that_ended_unwatched_are_killed_on_adoption(
    tmp_path: Path, driver: CgroupDriver
) -> None:
    launch = _launch(tmp_path, code=0)
    daemon = _abandon(driver, launch)
    (launch.checkpoint_dir / "go").touch()  # the job ends while no control plane runs
    file_appears(exit_file(launch.attempt_dir, 0), 10)
    assert alive(daemon)  # nobody there to kill it
    rec = Recorder()
    with executor(driver) as second:
        second.set_callbacks(rec.on_exit, rec.on_ack)
        assert second.adopt(launch) is False
        _, ev = rec.exit(timeout=10)
    assert ev.succeeded and ev.strays_killed == 1
    assert not alive(daemon)


def test_a_member_whose_launcher_died_is_killed_whole_on_adoption(
    tmp_path: Path, driver: CgroupDriver
) -> None:
    launch = _launch(tmp_path)
    daemon = _abandon(driver, launch)
    # both the member's supervisor (the recorded pid) and its launcher: nobody left who could
    # learn how the job ends
    supervisor = int(recorded(launch, 0, "pid")["pid"])
    started = json.loads(started_file(launch.attempt_dir, 0).read_text())
    job = started["pid"]
    for keeper in (supervisor, int(started["launcher"])):
        os.kill(keeper, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while alive(keeper) and time.monotonic() < deadline:
            time.sleep(0.01)
    assert alive(job)  # the job itself runs on, unrecorded
    rec = Recorder()
    with executor(driver) as second:
        second.set_callbacks(rec.on_exit, rec.on_ack)
        assert second.adopt(launch) is False
        # killed whole (the setsid daemon too) and its cgroup removed before adopt returns,
        # so before its exit is reported and the job requeued (issue 11, case 3)
        assert not alive(job) and not alive(daemon)
        assert driver.open(cgroup_name(launch, 0)) is None
        _, ev = rec.exit(timeout=10)
    assert ev.codes == (None,)  # no exit record: the control plane treats it as lost
    assert ev.strays_killed == 2  # the job and its daemon
    assert json.loads(exit_file(launch.attempt_dir, 0).read_text())["code"] is None  # "lost"


RUN_ONE = """
import sys, time
from pathlib import Path
sys.path[:0] = [{tests!r}]
from executor_helpers import make_launch
from gpufence.control.containment.members import Containment
from gpufence.control.containment.cgroupv1 import V1Driver
from gpufence.control.containment import mounts
from gpufence.control.base.containment_settings import ContainmentSettings
from gpufence.control.executors.local.local_executor import LocalExecutor
driver = V1Driver(mounts.current().v1, {parent!r})
ex = LocalExecutor(containment=Containment(driver, ContainmentSettings(prestarted=2)))
time.sleep(0.5)  # the pre-started members are there too when we die
launch = make_launch(Path({root!r}), command=("sh", "-c", "sleep 1.5; exit 7"))
ex.start(launch)
print(ex._forks.pid, flush=True)
time.sleep(300)
"""


def test_after_a_kill_9_the_jobs_run_on_and_are_adopted(
    tmp_path: Path, v1: CgroupDriver, cgroup_parent: str
) -> None:
    here = str(Path(__file__).parent)
    code = RUN_ONE.format(tests=here, parent=cgroup_parent, root=str(tmp_path))
    plane = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert plane.stdout is not None
        forkserver = int(plane.stdout.readline())
        launch = make_launch(tmp_path, command=("sh", "-c", "sleep 1.5; exit 7"))
        file_appears(started_file(launch.attempt_dir, 0), 10)
    finally:
        plane.kill()  # kill -9 of the control plane
        plane.wait()
    deadline = time.monotonic() + 5
    while alive(forkserver) and time.monotonic() < deadline:  # it follows its executor
        time.sleep(0.01)
    assert not alive(forkserver)
    launcher = int(recorded(launch, 0, "pid")["pid"])
    assert alive(launcher)  # the job was not the fork server's to take along
    rec = Recorder()
    with executor(v1, prestarted=2) as second:
        assert not [n for n in v1.names() if n.startswith(f"spare-{plane.pid}-")]  # swept
        second.set_callbacks(rec.on_exit, rec.on_ack)
        assert second.adopt(launch) is True
        _, ev = rec.exit(timeout=10)
    assert ev.codes == (7,)
    # nothing left in any hierarchy: the claim the kill interrupted was found and removed too
    m = mounts.current()
    roots = {c: m.v1[c] / cgroup_parent.strip("/") for c in ("cpu", "memory", "pids", "freezer")}
    left = {
        c: [d.name for d in r.iterdir() if d.is_dir()] if r.exists() else []
        for c, r in roots.items()
    }
    assert left == {c: [] for c in left}
