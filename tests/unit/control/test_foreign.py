"""Matching GPU processes to jobs ("pid -> (job, attempt) or None") and foreign-process incidents.

The matcher finds a member's processes by its launcher's session or process group (real
processes here), or by the member's cgroup where it has one (the containment hook); gpufence's
MPS daemons and their children are its own. An incident is counted once while it lasts, leaves
the board when the process is gone, and the kill policy never kills a reused pid.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

import gpufence.control.gpus.foreign as foreign
from gpufence.control.gpus.board import GpuBoard
from gpufence.control.gpus.foreign import (
    ForeignCheck,
    MemberMatcher,
    MemberRef,
    ProcFacts,
    proc_facts,
)
from gpufence.control.metrics import Telemetry
from gpufence.testing.fake_nvml import FakeProc
from gpufence.testing.waiting import until_value


def facts(pid: int, sid: int, pgid: int | None = None, cg: str = "/", ppid: int = 1) -> ProcFacts:
    return ProcFacts(pid, 1000 + pid, ppid, pgid or sid, sid, 0, f"cmd-{pid}", (cg,))


TABLE = {
    10: facts(10, sid=100),  # in the launcher's session
    11: facts(11, sid=5, pgid=100),  # left the session, still in its process group
    12: facts(12, sid=7, cg="/gpufence/j2/rank-0/worker"),  # escaped both, not its cgroup
    13: facts(13, sid=900, ppid=900),  # the MPS server under gpufence's daemon
    14: facts(14, sid=14),  # nobody's
}
MEMBERS = [
    MemberRef("j1", 1, 0, 100, frozenset({0})),
    MemberRef("j2", 3, 0, 200, frozenset({1}), cgroup="/gpufence/j2/rank-0"),
]


def _matcher() -> MemberMatcher:
    return MemberMatcher(MEMBERS, system={900}, facts=TABLE.get)


@pytest.mark.parametrize(
    ("pid", "owner"), [(10, ("j1", 1)), (11, ("j1", 1)), (12, ("j2", 3)), (14, None), (99, None)]
)
def test_owner_by_session_group_or_cgroup(pid: int, owner: tuple[str, int] | None) -> None:
    assert _matcher().owner(pid) == owner


def test_gpufence_own_processes_are_system() -> None:
    m = _matcher()
    assert m.is_system(TABLE[13]) and not m.is_system(TABLE[14])
    assert m.holders(0) == {("j1", 1)} and m.holders(1) == {("j2", 3)}


@pytest.fixture
def session_leader() -> Iterator[subprocess.Popen[bytes]]:
    # a launcher-like leader of a new session with a child in it
    proc = subprocess.Popen(
        [sys.executable, "-c", "import subprocess; subprocess.run(['sleep', '30'])"],
        start_new_session=True,
    )
    yield proc
    os.killpg(proc.pid, 9)
    proc.wait()


def _child(pid: int) -> int | None:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            f = proc_facts(int(entry))
            if f is not None and f.ppid == pid:
                return f.pid
    return None


def test_real_processes_match_by_the_launchers_session(
    session_leader: subprocess.Popen[bytes],
) -> None:
    child = until_value(lambda: _child(session_leader.pid), bool, 5, "the child to start")
    assert child is not None
    m = MemberMatcher([MemberRef("j9", 2, 0, session_leader.pid, frozenset({0}))])
    assert m.owner(child) == ("j9", 2)
    assert m.owner(os.getpid()) is None
    me = proc_facts(os.getpid())
    assert me is not None and me.user and "pytest" in me.command


def test_an_incident_is_counted_once_and_leaves_when_the_process_is_gone() -> None:
    board, tel = GpuBoard(), Telemetry()
    table = dict(TABLE)
    check = ForeignCheck(board, tel, "report", facts=table.get)
    procs = [FakeProc(10), FakeProc(12), FakeProc(13), FakeProc(14)]
    new = check.check(0, 0, procs, _matcher())
    # GPU 0 is j1's: 10 is its own, 13 gpufence's; 12 is j2's (which holds GPU 1), 14 nobody's
    assert [(i.pid, i.owner) for i in new] == [(12, ("j2", 3)), (14, None)]
    assert [f["pid"] for f in board.gpu(0)["foreign"]] == [12, 14]
    assert check.check(0, 0, procs, _matcher()) == []  # still there: no new incident
    assert b'gpufence_foreign_gpu_process_incidents_total{gpu="0"} 2.0' in tel.render()
    del table[14]  # it exited
    check.check(0, 0, procs, _matcher())
    assert [f["pid"] for f in board.gpu(0)["foreign"]] == [12]
    check.check(0, 0, [], _matcher())
    assert "foreign" not in board.gpu(0)


def test_kill_never_hits_a_reused_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    killed: list[int] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append(pid))
    board = GpuBoard()
    # /proc says pid 14 started at another time than the facts seen: a different process now
    monkeypatch.setattr(foreign, "proc_stat_fields", lambda pid: ["S"] + ["0"] * 18 + ["1"])
    check = ForeignCheck(board, None, "kill", facts=TABLE.get)
    (inc,) = check.check(0, 0, [FakeProc(14)], _matcher())
    assert inc.action == "gone" and killed == []
