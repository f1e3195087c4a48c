"""Issue 30 case 4: one tenant's job cannot stop everyone's submits and cancels by filling the
data directory's disk.

Real mechanisms only: the data directory is a small tmpfs. A job of team-a prints as fast as it
can, far past its log cap, while the disk is filled to ENOSPC around it. Its logs stay near the
cap (its launcher cuts them), and the store keeps working from its own reserve (free pages
inside the database file, ``store/reserve.py``): team-b's submits are accepted, the jobs that
exit are recorded promptly, and the offender's cancel lands. Its tenant sees why in the job's
events (``log-limit``). Once the reserve runs low, new jobs get 507 naming the disk while
cancels still land.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_helpers import CONFIG, TOKEN_A, TOKEN_B, Server, call, run_server, submit
from disks import SmallDisk, require_root, small_disk

from gpufence.control.base.member_records import out_file
from gpufence.testing.waiting import until

LOG_LIMIT = 1 << 20
RESERVE_MIB = 8


def config(reserve_mib: int) -> str:
    out = CONFIG.replace(
        "    sharing: exclusive\n", "    sharing: exclusive\n    log_limit_mib: 1\n"
    )
    return out.replace(
        "  stop_grace_s: 2\n", f"  stop_grace_s: 2\n  store_reserve_mib: {reserve_mib}\n"
    )


# writes 64 KiB chunks forever, whatever the disk says (ENOSPC included)
FLOOD = [
    sys.executable,
    "-c",
    "import os\n"
    "chunk = b'y' * 65535 + b'\\n'\n"
    "while True:\n"
    "    try:\n"
    "        os.write(1, chunk)\n"
    "    except OSError:\n"
    "        pass\n",
]
SHORT = {"command": ["sleep", "2"], "gpus": 1}  # prints nothing: a full disk cannot fail it


@pytest.fixture
def disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SmallDisk]:
    require_root()
    monkeypatch.setenv("GPUFENCE_EXIT_SPOOL", str(tmp_path / "spool"))
    with small_disk(tmp_path / "disk", "96m") as d:
        yield d


def state(srv: Server, jid: str, token: str) -> str:
    status, job, _ = call(srv, "GET", f"/v1/jobs/{jid}", token)
    assert status == 200, job
    return str(job["state"])


def events(srv: Server, jid: str, token: str) -> list[dict[str, object]]:
    status, out, _ = call(srv, "GET", f"/v1/events?job={jid}", token)
    assert status == 200, out
    return list(out["events"])


def test_a_flooding_job_on_a_full_disk_stops_nobody(disk: SmallDisk) -> None:
    srv = run_server(disk.path, config(RESERVE_MIB))
    server = next(srv)
    try:
        status, flood = submit(server, {"command": FLOOD, "gpus": 1}, TOKEN_A)
        assert status == 201, flood
        short = [submit(server, SHORT, TOKEN_B)[1]["id"] for _ in range(3)]
        jobs = [flood["id"], *short]
        until(
            lambda: all(
                state(server, j, TOKEN_A if j == flood["id"] else TOKEN_B) == "running"
                for j in jobs
            ),
            20,
            "all running",
        )
        disk.fill()  # what the flood has not taken already
        log = out_file(server.data / "jobs" / flood["id"] / "attempt-1", 0)
        # the jobs that exit are recorded promptly (they end 2 s after they started)
        t0 = time.monotonic()
        until(lambda: all(state(server, j, TOKEN_B) == "done" for j in short), 10, "exits")
        assert time.monotonic() - t0 < 10
        # another tenant's submits are accepted, from the store's reserve
        for _ in range(5):
            status, out = submit(server, {"command": ["true"], "hold": True}, TOKEN_B)
            assert status == 201, out
        assert log.stat().st_size <= LOG_LIMIT + (16 << 20), log.stat().st_size
        # the offender's cancel lands
        status, out, _ = call(server, "POST", f"/v1/jobs/{flood['id']}/cancel", TOKEN_A)
        assert status == 200, out
        until(lambda: state(server, flood["id"], TOKEN_A) == "cancelled", 15, "cancelled")
        assert log.stat().st_size <= LOG_LIMIT, log.stat().st_size
        said = [e for e in events(server, flood["id"], TOKEN_A) if e["kind"] == "log-limit"]
        assert said and "log limit of 1048576 bytes" in str(said[0]["message"]), said
        assert b"[gpufence] log limit of 1048576 bytes reached" in log.read_bytes()
    finally:
        disk.free()
        next(srv, None)


def test_new_jobs_are_refused_before_the_reserve_is_gone(disk: SmallDisk) -> None:
    srv = run_server(disk.path, config(1))
    server = next(srv)
    try:
        status, sleeper = submit(server, {"command": ["sleep", "60"], "gpus": 1}, TOKEN_A)
        assert status == 201, sleeper
        until(lambda: state(server, sleeper["id"], TOKEN_A) == "running", 20, "running")
        disk.fill()
        big = {"command": ["true"], "hold": True, "env": {"PAD": "p" * 60_000}}
        refused = None
        for _ in range(64):  # each takes ~60 KiB of the 1 MiB reserve
            status, out = submit(server, big, TOKEN_B)
            if status != 201:
                refused = (status, out)
                break
        assert refused is not None and refused[0] == 507, refused
        detail = refused[1]["detail"]
        assert "is full" in detail and str(server.data) in detail, detail
        assert refused[1]["type"] == "urn:gpufence:problem:disk-full"
        # what is left of the reserve is for cancels and exits
        status, out, _ = call(server, "POST", f"/v1/jobs/{sleeper['id']}/cancel", TOKEN_A)
        assert status == 200, out
        until(lambda: state(server, sleeper["id"], TOKEN_A) == "cancelled", 15, "cancelled")
        disk.free()
        status, out = submit(server, {"command": ["true"]}, TOKEN_B)
        assert status == 201, out
    finally:
        disk.free()
        next(srv, None)
