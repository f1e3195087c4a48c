"""Pre-started members: a launcher and its job's first process, forked (and put in a cgroup)
before the job exists.

Moving a process into a cgroup costs one RCU grace period (the kernel's global
``cgroup_threadgroup_rwsem``: 5-20 ms, most of a GPU hand-off), however little else it does. So
the fork server keeps a few members ready: a launcher ``L`` (its own process group, outside
the cgroups) whose child ``C`` has already joined a spare cgroup and waits. To start a job the
executor renames the spare cgroup to the member's name (cgroup v1 allows a rename with the
processes inside; the limits and device rules are written then) and writes to both at once:
``L`` gets the member's launcher arguments and runs ``launcher.main`` (pid record, logs, the exit
record later) with a spawner that only waits for ``C``'s exec; ``C`` gets the command, its
environment, working directory, log paths and user, opens its logs (``member_records.open_log``),
switches user, enters the working directory as that user, restores default signal dispositions
and execs, exactly as a freshly forked child would. Waking both
together keeps the hand-off to one process wake-up. If the executor goes away first, ``L`` and
``C`` see EOF on their pipes and exit (``L`` kills ``C`` to be sure).

This module runs in the fork server's children, with the standard library and the launcher only.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
from typing import Any, NoReturn

from gpufence.control.base import launcher, member_records, supervisor

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


def run_launcher(activation: int, command: int, join_dirs: list[str]) -> NoReturn:
    """``L``: fork ``C`` (which reads ``command``) into the spare cgroup, wait to be activated,
    then be the launcher."""  # pragma: no cover - runs in the fork server's child
    code = launcher.EXIT_NOT_EXECUTABLE
    try:
        os.setpgid(0, 0)  # (the fork server does it too)
        # the member's supervisor stays here, above L, before C exists (supervisor.py): C's
        # exit is recorded even if L is killed, and the split costs the hand-off nothing
        link = supervisor.split()
        report_r, report_w = os.pipe()
        # the job's stdout and stderr, if its logs are capped (a pump copies them, logcap.py)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        child = os.fork()
        if child == 0:
            for fd in (activation, report_r, out_r, err_r, *(link.fds() if link else ())):
                os.close(fd)
            _run_child(command, report_w, join_dirs, (out_w, err_w))
        for fd in (command, report_w, out_w, err_w):
            os.close(fd)
        msg = read_frame(activation)
        if msg is None:  # never used: the executor went away
            with contextlib.suppress(OSError):
                os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            os._exit(0)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        err = member_records.open_log(msg["err"])  # in the job's directory: no link followed
        os.dup2(err, 2)

        def spawn(
            cmd: list[str], _env: dict[str, str], _out: int, _err: int, _c: launcher.Confine
        ) -> int:
            return launcher.await_exec(child, report_r, cmd)  # C has its command already

        argv = [str(a) for a in msg["argv"]]
        pipes = (out_r, err_r) if launcher.log_limit_of(argv) is not None else None
        if pipes is None:
            os.close(out_r)
            os.close(err_r)
        code = launcher.main(
            argv,
            dict(msg["env"]),
            spawn=spawn,
            keep_fds=(report_r,),
            link=link,
            split_here=False,
            job_pipes=pipes,
        )
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.write(2, f"gpufence launcher: {exc!r}\n".encode())
    finally:
        os._exit(code & 0xFF)


def _run_child(
    command: int, report: int, join_dirs: list[str], pipes: tuple[int, int]
) -> NoReturn:  # pragma: no cover
    """``C``: join the spare cgroup now (the slow part), then wait for the command. Its output
    goes into ``pipes`` when the message says so (a capped log: ``L`` pumps them), else into
    its logs, opened here."""
    failed = None
    for d in join_dirs:
        try:
            launcher.join_cgroup(d)
        except OSError as exc:
            failed = f"cannot join cgroup {d}: {exc.strerror}"
            break
    try:
        msg = read_frame(command)
        if msg is None:  # never used: nothing ran. If L was woken meanwhile (the executor
            # died between its two writes) it reads this and records the member as lost: an
            # exit 0 here would look like a job that ran and succeeded
            with contextlib.suppress(OSError):
                os.write(report, b"lthe command never reached it (its executor went away)")
            os._exit(launcher.EXIT_NOT_EXECUTABLE)
        os.close(command)
        if failed is not None:
            os.write(report, f"c{failed}".encode())
            os._exit(launcher.EXIT_NOT_CONTAINED)
        if msg.get("pipe"):
            out, err = pipes
        else:
            os.close(pipes[0])
            os.close(pipes[1])
            out, err = member_records.open_log(msg["out"]), member_records.open_log(msg["err"])
        confine = launcher.Confine()
        confine.uid, confine.gid = msg["uid"], msg["gid"]
        confine.groups = [int(g) for g in msg["groups"]]
        confine.cwd = msg.get("cwd")  # entered as the job's user, after the switch
        if msg.get("pty"):  # a pty job's: C is its terminal host (ptyhost.py)
            confine.terminal = (str(msg["pty"][0]), float(msg["pty"][1]))
        launcher.exec_child(
            [str(a) for a in msg["command"]], dict(msg["env"]), out, err, confine, report
        )
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.write(report, f"x{exc!r}".encode())
    os._exit(launcher.EXIT_NOT_EXECUTABLE)
