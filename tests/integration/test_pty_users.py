"""``run --pty`` / ``attach`` on the secure default: each tenant's jobs run as an unprivileged Unix
user of its own (real throw-away users, ``useradd``), who cannot read the server's interpreter
(here under a 0700 ``/root``): the terminal host runs as the server's user, the shell as the
tenant's.

Real CLI processes (``test_pty.Client``) against a real server on 127.0.0.1 whose data directory
the users can pass through (pytest's tmp dirs are 0700: a 0711 directory of its own).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_helpers import ADMIN, NODES, TOKEN_A, TOKEN_B, Server, call, run_server, wait_state
from test_pty import ALL_GPUS, Client, _all_gpus_run, _job_of, _lines

from gpufence.cli.terminal_link import LinkRefused, TerminalLink
from gpufence.control.base.member_records import pty_socket
from unix_users import User, unix_users

CONFIG = """
name: pty-users
{nodes}
partitions:
  shared:
    nodes: [h100]
    admits: [serving, training, interactive, batch]
    sharing: exclusive
control:
  auth:
    admin_token: "{admin}"
    tenants:
      team-a: {{token: "{a}"}}
      team-b: {{token: "{b}"}}
  run_as: {user_a}
  tenants:
    team-a: {{run_as: {user_a}}}
    team-b: {{run_as: {user_b}}}
  stop_grace_s: 2
  containment: {{prestarted: {prestarted}}}
"""


@pytest.fixture(scope="module")
def users() -> Iterator[list[User]]:
    with unix_users("a", "b") as made:
        yield made


@pytest.fixture(scope="module", params=[8, 0], ids=["prestarted", "forked"])
def srv(users: list[User], request: pytest.FixtureRequest) -> Iterator[Server]:
    """A server whose members are pre-started ones (the host is the spare's child ``C``), or
    forked at the launch (the host is the launcher's new child): both paths start the host."""
    root = Path(tempfile.mkdtemp(prefix="gpufence-ptyusers-"))
    root.chmod(0o711)  # the run_as users pass through to their jobs' directories below it
    config = CONFIG.format(
        nodes=NODES,
        admin=ADMIN,
        a=TOKEN_A,
        b=TOKEN_B,
        user_a=users[0].name,
        user_b=users[1].name,
        prestarted=request.param,
    )
    try:
        yield from run_server(root, config)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _connect_as(user: User, path: Path) -> int:
    """errno of connecting to the Unix socket ``path`` as ``user`` (0: connected): a forked
    child that switches to the user first, as another process of that tenant would."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: ends in _exit
        code = 255
        try:
            os.setgroups([])
            os.setgid(user.gid)
            os.setuid(user.uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(str(path))
            code = 0
        except OSError as exc:
            code = exc.errno or 254
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_the_shell_runs_as_the_tenants_user_and_cannot_touch_its_host(
    srv: Server, users: list[User]
) -> None:
    c = Client(srv, ["run", "--pty", "--gpus", str(ALL_GPUS), "--", "bash", "--norc"])
    try:
        c.type(
            'echo "uid=$(id -u) gid=$(id -g)"; echo "hi-$((6*7))"; '
            'echo "devices=$CUDA_VISIBLE_DEVICES"; '
            'kill -0 "$PPID" 2>/dev/null && echo host=signalled || echo host=untouchable; '
            'echo "cgroup=$(grep :pids: /proc/self/cgroup)"; '
            "exit 3\n"
        )
        c.proc.stdin.close()  # type: ignore[union-attr]
        assert c.ended() == 3, c.transcript()
    finally:
        c.close()
    lines = _lines(c.out)
    assert f"uid={users[0].uid} gid={users[0].gid}" in lines, c.transcript()
    assert "hi-42" in lines and "devices=0,1,2,3,4,5,6,7" in lines, c.transcript()
    # its parent is the terminal host: the server's user, which the job may not signal
    assert "host=untouchable" in lines, c.transcript()
    jid = _job_of(c)
    # in a member's cgroup (joined by the host before the shell existed; a pre-started
    # member's keeps its spare's name here), not the server's
    ours = next(x for x in Path("/proc/self/cgroup").read_text().splitlines() if ":pids:" in x)
    shell = next(x.removeprefix("cgroup=") for x in lines if x.startswith("cgroup="))
    assert shell != ours and ":pids:/gpufence/" in shell, c.transcript()
    job = wait_state(srv, jid, ("failed",))
    assert job["exit_code"] == 3
    _all_gpus_run(srv)


def test_attach_is_the_owners_and_the_socket_no_tenants(srv: Server, users: list[User]) -> None:
    c = Client(srv, ["run", "--pty", "--gpus", "1", "--", "bash", "--norc"])
    second: Client | None = None
    try:
        c.type('echo "up-$((1+1)) as $(id -u)"\n')
        c.sees(f"up-2 as {users[0].uid}")
        jid = _job_of(c)
        # another tenant: refused by the server, and its user cannot reach the socket either;
        # nor can the job's own user (a job reaching its host's socket could pose as it)
        foreign = Client(srv, ["attach", jid], token=TOKEN_B)
        assert foreign.ended() != 0 and b"another tenant" in foreign.err, foreign.transcript()
        with pytest.raises(LinkRefused) as refused:
            TerminalLink.open(srv.url, TOKEN_B, jid)
        assert refused.value.status == 403
        job = call(srv, "GET", f"/v1/jobs/{jid}")[1]
        sock = pty_socket(srv.data / "jobs" / jid / f"attempt-{job['attempt']}")
        assert sock.exists()
        for user in users:
            assert _connect_as(user, sock) == 13, f"{user.name} reached {sock}"  # EACCES
        # the owner attaches from a second client, and shares the terminal
        second = Client(srv, ["attach", jid])
        second.sees(f"up-2 as {users[0].uid}")
        second.type("echo two-$((7*8))\n")
        c.sees("two-56")
        TerminalLink.open(srv.url, ADMIN, jid).close()  # the admin may
        c.type("exit 4\n")
        assert c.ended() == 4, c.transcript()
        assert second.ended() == 4, second.transcript()
    finally:
        c.close()
        if second is not None:
            second.close()
    assert not sock.exists(), "the host removes its socket when the session ends"


def test_a_command_not_found_or_a_cwd_the_user_may_not_enter_is_refused(
    srv: Server, users: list[User]
) -> None:
    """As for any job (127 not found, 125 not contained), and the directory is entered as the
    tenant's user, not as the host's: one that only root may enter by the time the job starts
    (it passed the submit's check, then became 0700) is refused."""
    c = Client(srv, ["run", "--pty", "--", "/no/such/program"])
    try:
        assert c.ended() == 127, c.transcript()
    finally:
        c.close()
    not_found = wait_state(srv, _job_of(c), ("failed",))
    private = Path(tempfile.mkdtemp(prefix="gpufence-ptyusers-cwd-"))
    try:
        private.chmod(0o711)
        body = {"command": ["bash"], "pty": True, "hold": True, "cwd": str(private)}
        status, held, _ = call(srv, "POST", "/v1/jobs", TOKEN_A, body)
        assert status == 201, held
        private.chmod(0o700)
        assert call(srv, "POST", f"/v1/jobs/{held['id']}/release", TOKEN_A)[0] == 200
        refused = wait_state(srv, held["id"], ("failed",), timeout=30)
    finally:
        private.rmdir()
    cases = (
        (not_found, 127, "/no/such/program"),
        (refused, 125, f"cannot enter the working directory {private} as uid {users[0].uid}"),
    )
    for job, code, why in cases:
        assert job["exit_code"] == code, job
        status, err, _ = call(srv, "GET", f"/v1/jobs/{job['id']}/logs?stream=err")
        assert status == 200 and why in err, err
        sock = pty_socket(srv.data / "jobs" / job["id"] / "attempt-1")
        assert not sock.exists(), "the host removes its socket when the command never ran"
