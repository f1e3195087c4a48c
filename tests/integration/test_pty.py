"""Interactive work (issue 32): ``gpufence run --pty`` and ``gpufence attach``, real CLI processes
against a real server on 127.0.0.1 whose jobs are real processes on pseudo-terminals.

Each client is a ``python -m gpufence`` subprocess whose stdin is a pipe: the piped-input path of
``pty_session.py`` (what ``echo ... | gpufence run --pty -- bash`` uses), the terminal on the
job's side is a real one all the same.
"""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
from api_helpers import ADMIN, CONFIG, TOKEN_A, TOKEN_B, Server, call, run_server, wait_state

from gpufence.cli.terminal_link import LinkRefused, TerminalLink
from gpufence.control.base.config import load_config
from gpufence.control.base.jobspec import SubmitRequest
from gpufence.control.gpus.discovery import fake_gpus
from gpufence.control.gpus.nodespec import host_resources
from gpufence.control.http import slow_clients
from gpufence.control.plane import ControlPlane
from gpufence.control.reconciler.inbox import InvalidField
from gpufence.testing.fake_executor import FakeExecutor
from gpufence.testing.waiting import until

ALL_GPUS = 8  # api_helpers' one node


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from run_server(tmp_path_factory.mktemp("pty"))


class Client:
    """A ``gpufence`` CLI process whose output is collected as it comes."""

    def __init__(self, srv: Server, args: list[str], token: str = TOKEN_A) -> None:
        env = {**os.environ, "GPUFENCE_URL": srv.url, "GPUFENCE_TOKEN": token}
        env.pop("GPUFENCE_DATA", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpufence", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        self.out = bytearray()
        self.err = bytearray()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.collectors = [
            threading.Thread(target=_collect, args=(stream, buf), daemon=True)
            for stream, buf in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
        ]
        for t in self.collectors:
            t.start()

    def type(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def sees(self, text: str, limit_s: float = 30.0, stream: str = "out") -> None:
        buf = self.out if stream == "out" else self.err
        until(lambda: text.encode() in buf, limit_s, f"{text!r} on the client's std{stream}")

    def ended(self, limit_s: float = 60.0) -> int:
        try:
            code = self.proc.wait(limit_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"client still running:\n{self.transcript()}") from None
        for t in self.collectors:  # what it wrote last may still be in the pipes
            t.join(10)
        return code

    def transcript(self) -> str:
        return f"stdout: {bytes(self.out)!r}\nstderr: {bytes(self.err)!r}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _collect(stream: IO[bytes], buf: bytearray) -> None:
    while chunk := stream.read1(65536):  # type: ignore[attr-defined]
        buf += chunk


def _job_of(client: Client) -> str:
    """The job id the client's first line names (``jN: ...``)."""
    client.sees(": ", stream="err")
    return bytes(client.err).split(b":", 1)[0].decode().strip()


def _lines(data: bytearray) -> list[str]:
    return [line.strip() for line in bytes(data).decode(errors="replace").splitlines()]


def _all_gpus_run(srv: Server) -> None:
    """Every GPU of the node can be given to a new job: nothing holds one any more."""
    status, job, _ = call(srv, "POST", "/v1/jobs", body={"command": ["true"], "gpus": ALL_GPUS})
    assert status == 201, job
    wait_state(srv, job["id"], ("done",), timeout=60)


def test_run_pty_prints_and_exits_with_its_code_then_frees_the_gpus(srv: Server) -> None:
    c = Client(srv, ["run", "--pty", "--gpus", str(ALL_GPUS), "--", "bash", "--norc"])
    try:
        c.type('echo "hi-$((6*7))"; echo "devices=$CUDA_VISIBLE_DEVICES"; exit 3\n')
        c.proc.stdin.close()  # type: ignore[union-attr]
        assert c.ended() == 3, c.transcript()
    finally:
        c.close()
    lines = _lines(c.out)
    assert "hi-42" in lines, c.transcript()  # the job's output, not the echo of the input
    assert "devices=0,1,2,3,4,5,6,7" in lines, c.transcript()
    jid = _job_of(c)
    job = wait_state(srv, jid, ("failed",))
    assert job["exit_code"] == 3 and job["spec"]["pty"] is True
    _all_gpus_run(srv)


def test_a_lost_client_frees_the_gpus_after_the_grace(srv: Server) -> None:
    c = Client(srv, ["run", "--pty", "--gpus", str(ALL_GPUS), "--grace", "3", "--", "bash"])
    try:
        c.type("echo ready-$((2+3))\n")
        c.sees("ready-5")
        jid = _job_of(c)
        c.proc.send_signal(signal.SIGKILL)  # the laptop closed: no goodbye
        c.ended()
        killed = time.monotonic()
        time.sleep(1.5)
        assert call(srv, "GET", f"/v1/jobs/{jid}")[1]["state"] == "running", "ended before grace"
        job = wait_state(srv, jid, ("failed",), timeout=30)
    finally:
        c.close()
    assert time.monotonic() - killed >= 3.0
    assert job["exit_code"] == 128 + signal.SIGHUP
    status, err, _ = call(srv, "GET", f"/v1/jobs/{jid}/logs?stream=err")
    assert status == 200 and "no terminal attached for 3 s" in err, err
    _all_gpus_run(srv)


def test_attach_from_a_second_client_shares_the_terminal(srv: Server) -> None:
    first = Client(srv, ["run", "--pty", "--gpus", "1", "--", "bash", "--norc"])
    second: Client | None = None
    try:
        first.type("echo one-$((6*7))\n")
        first.sees("one-42")
        jid = _job_of(first)
        second = Client(srv, ["attach", jid])
        second.sees("one-42")  # what was written before it came (the scrollback)
        second.type("echo two-$((7*8))\n")
        first.sees("two-56")  # input of one client, output to both
        second.sees("two-56")
        first.type("exit 4\n")
        assert first.ended() == 4, first.transcript()
        assert second.ended() == 4, second.transcript()
    finally:
        first.close()
        if second is not None:
            second.close()


def test_only_the_owner_or_the_admin_attaches(srv: Server) -> None:
    c = Client(srv, ["run", "--pty", "--gpus", "1", "--", "bash", "--norc"])
    try:
        c.type("echo up-$((1+1))\n")
        c.sees("up-2")
        jid = _job_of(c)
        for token, expected in ((TOKEN_B, 403), ("wrong-token-0123456789", 401)):
            with pytest.raises(LinkRefused) as refused:
                TerminalLink.open(srv.url, token, jid)
            assert refused.value.status == expected
        with pytest.raises(LinkRefused) as refused:
            TerminalLink.open(srv.url, TOKEN_A, "j999999")
        assert refused.value.status == 404
        foreign = Client(srv, ["attach", jid], token=TOKEN_B)
        assert foreign.ended() != 0 and b"another tenant" in foreign.err, foreign.transcript()
        TerminalLink.open(srv.url, ADMIN, jid).close()  # the admin may
        c.type("exit 0\n")
        assert c.ended() == 0, c.transcript()
    finally:
        c.close()


def test_a_job_without_a_terminal_is_refused(srv: Server) -> None:
    status, job, _ = call(srv, "POST", "/v1/jobs", body={"command": ["sleep", "30"], "gpus": 1})
    assert status == 201
    try:
        wait_state(srv, job["id"], ("running",))
        with pytest.raises(LinkRefused) as refused:
            TerminalLink.open(srv.url, ADMIN, job["id"])
        assert refused.value.status == 409 and "not a pty job" in str(refused.value)
    finally:
        call(srv, "POST", f"/v1/jobs/{job['id']}/cancel")


def test_a_waiting_pty_job_says_why_then_runs(srv: Server, tmp_path: Path) -> None:
    body = {"command": ["sleep", "60"], "gpus": ALL_GPUS, "class": "training"}
    status, blocker, _ = call(srv, "POST", "/v1/jobs", body=body)
    assert status == 201
    c = Client(srv, ["run", "--pty", "--gpus", "1", "--", "bash", "--norc"])
    try:
        wait_state(srv, blocker["id"], ("running",))
        c.sees("pending (no-fit", stream="err")
        assert c.proc.poll() is None
        call(srv, "POST", f"/v1/jobs/{blocker['id']}/cancel")
        c.sees("running", stream="err")
        c.type("echo after-wait\nexit 0\n")
        assert c.ended() == 0, c.transcript()
        assert "after-wait" in _lines(c.out)
    finally:
        c.close()
        call(srv, "POST", f"/v1/jobs/{blocker['id']}/cancel")


def test_a_pty_job_needs_the_local_executor(tmp_path: Path) -> None:
    """Elsewhere (Ray) the terminal would be on a node the server cannot reach: 422 at submit,
    naming the field, rather than a session nobody can join, hung up after its grace."""
    (tmp_path / "c.yaml").write_text(CONFIG)
    cluster, config = load_config(tmp_path / "c.yaml", tmp_path / "data", host_resources())
    plane = ControlPlane(cluster, config, fake_gpus(8), tmp_path / "data", executor=FakeExecutor())
    try:
        req = SubmitRequest.model_validate({"command": ["bash"], "pty": True})
        with pytest.raises(InvalidField) as refused:
            plane.submit_future(req, "team-a")
        assert refused.value.loc == ("body", "pty")
    finally:
        plane.close()


FENCED = CONFIG.replace(
    """partitions:
  shared:
    nodes: [h100]
    admits: [serving, training, interactive, batch]
    sharing: exclusive""",
    """partitions:
  train:
    gpus: ["h100[0]:0-5"]
    admits: [training, batch]
    sharing: exclusive
  notebooks:
    gpus: ["h100[0]:6-7"]
    admits: [interactive]
    sharing: exclusive
    reclaim: {idle_threshold: 0.05, idle_after_s: 2, warning_s: 2}""",
)


def test_a_pty_session_is_a_notebook_of_the_interactive_fence(tmp_path: Path) -> None:
    """``run --pty`` submits class interactive: it runs in the notebooks' fence, on its GPUs,
    and is reclaimed there when idle like any notebook session, the client told why."""
    assert "notebooks" in FENCED
    for srv in run_server(tmp_path, FENCED):
        c = Client(srv, ["run", "--pty", "--gpus", "1", "--", "bash", "--norc"])
        try:
            # $((1+1)): the output's line, not the terminal's echo of the typed one
            c.type('echo "dev-$((1+1))=$CUDA_VISIBLE_DEVICES"\n')
            c.sees("dev-2=")
            jid = _job_of(c)
            job = call(srv, "GET", f"/v1/jobs/{jid}")[1]
            assert job["partition"] == "notebooks"
            assert any(line in ("dev-2=6", "dev-2=7") for line in _lines(c.out)), c.transcript()
            c.sees("[gpufence: this session has been idle: its GPUs are reclaimed in ")
            assert c.ended(60) == 3, c.transcript()  # idle: warned, then reclaimed
        finally:
            c.close()
        assert b"reclaimed" in c.err, c.transcript()
        assert call(srv, "GET", f"/v1/jobs/{jid}")[1]["state"] == "reclaimed"


def test_the_readme_recipe_piped_into_run_pty(srv: Server) -> None:
    """README, 'Interactive work': ``echo 'echo hi; exit 3' | gpufence run --pty -- bash``
    prints hi and exits 3, through a shell as a user types it."""
    env = {**os.environ, "GPUFENCE_URL": srv.url, "GPUFENCE_TOKEN": TOKEN_A}
    env.pop("GPUFENCE_DATA", None)
    gpufence = f"{sys.executable} -m gpufence"
    done = subprocess.run(
        ["sh", "-c", f"echo 'echo hi; exit 3' | {gpufence} run --pty -- bash"],
        capture_output=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 3, done
    assert "hi" in _lines(bytearray(done.stdout)), done


def test_cancel_ends_the_session_though_the_shell_ignores_sigterm(srv: Server) -> None:
    """The stop reaches the launcher's group; the shell is in the terminal's own session and
    ignores SIGTERM (interactive bash): the host hangs it up, the client is told and exits 3."""
    c = Client(srv, ["run", "--pty", "--gpus", str(ALL_GPUS), "--", "bash", "--norc", "-i"])
    try:
        c.type("trap '' TERM; echo armed-$((3*3))\n")
        c.sees("armed-9")
        jid = _job_of(c)
        status, _, _ = call(srv, "POST", f"/v1/jobs/{jid}/cancel")
        assert status == 200
        assert c.ended(30) == 3, c.transcript()
    finally:
        c.close()
    assert b"cancelled" in c.err, c.transcript()
    # hung up by its host (129), not killed with the host at the end of the stop's grace
    job = wait_state(srv, jid, ("cancelled",))
    assert job["attempts"][-1]["exit_codes"] == [128 + signal.SIGHUP], job["attempts"]
    _all_gpus_run(srv)


def _winsize(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def test_on_a_terminal_keys_go_raw_the_size_follows_and_the_terminal_is_restored(
    srv: Server,
) -> None:
    """The client on a real terminal (its controlling one): the job's terminal takes the
    client's size and its changes (SIGWINCH), Ctrl-C reaches the job's command instead of
    ending the client, and the client's terminal is back in cooked mode after the exit."""
    master, slave = os.openpty()
    _winsize(slave, 33, 99)
    env = {**os.environ, "GPUFENCE_URL": srv.url, "GPUFENCE_TOKEN": TOKEN_A}
    env.pop("GPUFENCE_DATA", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufence", "run", "--pty", "--gpus", "1", "--", "bash", "--norc"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        start_new_session=True,
        # its controlling terminal, as a login shell has: SIGWINCH comes from there
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
    )
    seen = bytearray()
    threading.Thread(target=_collect_fd, args=(master, seen), daemon=True).start()
    try:

        def sees(text: str) -> None:
            until(lambda: text.encode() in seen, 30, f"{text!r} on the client's terminal")

        sees("running")
        os.write(master, b"stty size\r")
        sees("33 99")
        _winsize(master, 44, 111)  # the kernel sends the client SIGWINCH
        time.sleep(0.5)
        os.write(master, b"stty size\r")
        sees("44 111")
        os.write(master, b"sleep 100; echo slept-$((5*5))\r")
        time.sleep(1.0)
        os.write(master, b"\x03")  # Ctrl-C: the job's sleep, not the client
        os.write(master, b"echo alive-$((4*4))\r")
        sees("alive-16")
        assert b"slept-25" not in seen
        os.write(master, b"exit 7\r")
        assert proc.wait(60) == 7, bytes(seen)
        assert termios.tcgetattr(slave)[3] & termios.ECHO, "the client left its terminal raw"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(slave)
        os.close(master)


def _collect_fd(fd: int, buf: bytearray) -> None:
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            return
        if not chunk:
            return
        buf += chunk


def test_an_idle_terminal_link_is_no_slow_client(
    srv: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slow-client guard cuts HTTP connections without a request in flight; an upgraded
    one is a terminal, idle as long as its user thinks, and must stay."""
    monkeypatch.setattr(slow_clients, "HEAD_TIMEOUT_S", 0.5)
    monkeypatch.setattr(slow_clients, "CHECK_S", 0.1)
    c = Client(srv, ["run", "--pty", "--gpus", "1", "--", "bash", "--norc"])
    try:
        c.type("echo a-$((2*2))\n")
        c.sees("a-4")
        time.sleep(2.0)  # four head timeouts without a byte
        c.type("echo b-$((3*3))\n")
        c.sees("b-9")
        c.type("exit 0\n")
        assert c.ended() == 0, c.transcript()
    finally:
        c.close()
