"""Shared helpers for the LocalExecutor integration tests (real processes in ``tmp_path``)."""

from __future__ import annotations

import json
import os
import queue
import sys
import textwrap
import time
from pathlib import Path

from gpufence.control.base.executor import AttemptExit, Launch, Limits, Member, RunAs
from gpufence.control.base.member_records import records_dir
from gpufence.control.executors.local.local_executor import LocalExecutor
from gpufence.testing.waiting import file_appears

PY = sys.executable


class Recorder:
    """Collects callbacks (they arrive on the executor's watcher thread)."""

    def __init__(self) -> None:
        self.exits: queue.Queue[tuple[float, AttemptExit]] = queue.Queue()
        self.acks: queue.Queue[tuple[float, str, int]] = queue.Queue()

    def on_exit(self, ev: AttemptExit) -> None:
        self.exits.put((time.time(), ev))

    def on_ack(self, job_id: str, attempt: int) -> None:
        self.acks.put((time.time(), job_id, attempt))

    def exit(self, timeout: float = 5.0) -> tuple[float, AttemptExit]:
        return self.exits.get(timeout=timeout)


def make_launch(
    root: Path,
    script: str | None = None,
    *,
    command: tuple[str, ...] | None = None,
    job: str = "job-1",
    attempt: int = 1,
    members: tuple[Member, ...] = (Member(0, "node-a", ("0",)),),
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    limits: Limits | None = None,
    run_as: RunAs | None = None,
) -> Launch:
    if command is None:
        assert script is not None
        command = (PY, "-c", textwrap.dedent(script))
    jdir = root / "jobs" / job
    return Launch(
        job_id=job,
        attempt=attempt,
        command=command,
        env=env or {},
        members=members,
        attempt_dir=jdir / f"attempt-{attempt}",
        checkpoint_dir=jdir / "checkpoints",
        cwd=cwd,
        limits=limits or Limits(),
        run_as=run_as,
    )


def gone(pid: int) -> bool:
    """Not running: no /proc entry, or a zombie waiting for a reaper."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True
    return data[data.rfind(b")") + 2 :].split()[0] in (b"Z", b"X")


def group_alive(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            data = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            out.append(int(name))
    return out


def group_gone(pgid: int, timeout: float = 1.0) -> bool:
    """SIGKILL is delivered asynchronously: give the group's stragglers a moment to die."""
    deadline = time.monotonic() + timeout
    while group_alive(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def recorded(launch: Launch, rank: int, kind: str) -> dict[str, float]:
    """The launcher's ``rank-R.<kind>`` record (pid, started, exit) of ``launch``."""
    path = records_dir(launch.attempt_dir) / f"rank-{rank}.{kind}"
    data: dict[str, float] = json.loads(path.read_text())
    return data


def start_and_abandon(launch: Launch, ready: Path) -> None:
    """Start ``launch``, wait for ``ready``, then close the executor and leave the job running."""
    first = LocalExecutor()
    first.start(launch)
    file_appears(ready)
    first.close(kill=False)  # the control plane goes away; the job keeps running


IGNORES_TERM_WITH_GRANDCHILD = """
    import os, signal, subprocess, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen(["sleep", "30"])  # inherits the ignored SIGTERM
    ready = os.path.join(os.environ["GPUFENCE_CHECKPOINT_DIR"], "ready")
    with open(ready + ".tmp", "w") as fh:
        fh.write(str(child.pid))
    os.replace(ready + ".tmp", ready)
    time.sleep(30)
"""
