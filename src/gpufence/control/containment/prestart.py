"""Pre-started members: a launcher and its job's first process, forked (and put in a cgroup)
before the job exists.

Moving a process into a cgroup costs one RCU grace period (the kernel's global
``cgroup_threadgroup_rwsem``: 5-20 ms, most of a GPU hand-off), however little else it does. So
the fork server keeps a few members ready: a launcher ``L`` (its own process group, outside
the cgroups) whose child ``C`` has already joined a spare cgroup and waits. To start a job the
executor renames the spare cgroup to the member's name (cgroup v1 allows a rename with the
processes inside; the limits and device rules are written then), and sends ``L`` the member's
launcher arguments and environment; ``L`` runs ``launcher.main`` with a spawner that hands ``C``
the command, environment, log descriptors (``SCM_RIGHTS``), working directory and user. ``C``
switches user, restores default signal dispositions and execs, exactly as a freshly forked child
would. If the executor goes away first, ``L`` sees EOF on its activation pipe, kills ``C`` and
exits.

This module runs in the fork server's children, with the standard library and the launcher only.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
from typing import Any, NoReturn

from gpufence.control.executors import launcher

HEADER = struct.Struct(">I")


def read_frame(fd: int) -> dict[str, Any] | None:
    """One length-prefixed JSON message from a pipe; None on EOF."""

    def exact(n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    head = exact(HEADER.size)
    body = exact(HEADER.unpack(head)[0]) if head is not None else None
    if body is None:
        return None
    msg = json.loads(body)
    return msg if isinstance(msg, dict) else None


def frame(msg: dict[str, Any]) -> bytes:
    data = json.dumps(msg).encode()
    return HEADER.pack(len(data)) + data


def run_launcher(activation: int, join_dirs: list[str]) -> NoReturn:  # pragma: no cover
    """``L``: fork ``C`` into the spare cgroup, wait to be activated, then be the launcher."""
    code = launcher.EXIT_NOT_EXECUTABLE
    try:
        os.setpgid(0, 0)  # (the fork server does it too)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        report_r, report_w = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(activation)
            ours.close()
            os.close(report_r)
            _run_child(theirs, report_w, join_dirs)
        theirs.close()
        os.close(report_w)
        msg = read_frame(activation)
        if msg is None:  # never used: the executor went away
            with contextlib.suppress(OSError):
                os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            os._exit(0)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        err = os.open(msg["err"], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.dup2(err, 2)
        if msg.get("cwd"):
            os.chdir(msg["cwd"])
        spawn = _HandOver(child, ours, report_r)
        code = launcher.main(
            [str(a) for a in msg["argv"]],
            dict(msg["env"]),
            spawn=spawn,
            keep_fds=(ours.fileno(), report_r),
        )
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.write(2, f"gpufence launcher: {exc!r}\n".encode())
    finally:
        os._exit(code & 0xFF)


class _HandOver:
    """``L``'s spawner: give the command to the waiting ``C`` instead of forking one."""

    def __init__(self, child: int, ctl: socket.socket, report: int) -> None:
        self.child, self.ctl, self.report = child, ctl, report

    def __call__(
        self,
        command: list[str],
        env: dict[str, str],
        out_fd: int,
        err_fd: int,
        confine: launcher.Confine,
    ) -> int:
        data = frame(
            {
                "command": command,
                "env": env,
                "cwd": os.getcwd(),
                "uid": confine.uid,
                "gid": confine.gid,
                "groups": confine.groups,
            }
        )
        try:
            sent = socket.send_fds(self.ctl, [data], [out_fd, err_fd])
            if sent < len(data):
                self.ctl.sendall(data[sent:])
        except OSError as exc:
            os.close(self.report)
            raise launcher.SpawnFailure(
                launcher.EXIT_NOT_CONTAINED, f"the pre-started member is gone ({exc.strerror})"
            ) from exc
        finally:
            self.ctl.close()
        return launcher.await_exec(self.child, self.report, command)


def _run_child(  # pragma: no cover
    ctl: socket.socket, report: int, join_dirs: list[str]
) -> NoReturn:
    """``C``: join the spare cgroup now (the slow part), then wait for the command."""
    failed = None
    me = str(os.getpid()).encode()
    for d in join_dirs:
        try:
            fd = os.open(os.path.join(d, "cgroup.procs"), os.O_WRONLY)
            try:
                os.write(fd, me)
            finally:
                os.close(fd)
        except OSError as exc:
            failed = f"cannot join cgroup {d}: {exc.strerror}"
            break
    try:
        head, fds, _flags, _addr = socket.recv_fds(ctl, HEADER.size, 2)
        if len(head) < HEADER.size or len(fds) != 2:
            os._exit(0)  # never used (or a broken hand-over): nothing ran
        for fd in fds:  # the job gets them as its stdout/stderr only
            os.set_inheritable(fd, False)
        size = HEADER.unpack(head)[0]
        body = b""
        while len(body) < size:
            chunk = ctl.recv(size - len(body))
            if not chunk:
                os._exit(0)
            body += chunk
        msg = json.loads(body)
        ctl.close()
        if failed is not None:
            os.write(report, f"c{failed}".encode())
            os._exit(launcher.EXIT_NOT_CONTAINED)
        os.chdir(msg["cwd"])
        confine = launcher.Confine()
        confine.uid, confine.gid = msg["uid"], msg["gid"]
        confine.groups = [int(g) for g in msg["groups"]]
        launcher.exec_child(
            [str(a) for a in msg["command"]], dict(msg["env"]), fds[0], fds[1], confine, report
        )
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.write(report, f"x{exc!r}".encode())
    os._exit(launcher.EXIT_NOT_EXECUTABLE)
