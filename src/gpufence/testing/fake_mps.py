"""A stand-in ``nvidia-cuda-mps-control`` for tests and the no-GPU device check: a real
executable, put on PATH by the caller.

``-f`` runs a "daemon" in the foreground: it notes ``start <pid> <CUDA_VISIBLE_DEVICES>`` in
``<pipe dir>/../fake-mps.log``, makes the named pipe ``<pipe dir>/control`` and serves commands
written to it until ``quit`` (noted as ``quit <pid>``). Without ``-f`` it is the client: it
writes its stdin into the daemon's pipe (exit 1 when no daemon listens). A file ``fail`` next to
the pipe dir makes the daemon exit 3 at start, as a broken driver would.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

SCRIPT = """
import os, sys
pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
ctl = os.path.join(pipe, "control")
root = os.path.dirname(os.path.abspath(pipe))


def note(what):
    with open(os.path.join(root, "fake-mps.log"), "a") as f:
        f.write(what + "\\n")


if "-f" in sys.argv:
    if os.path.exists(os.path.join(root, "fail")):
        print("fake mps: no GPU here", flush=True)
        sys.exit(3)
    note("start %d %s" % (os.getpid(), os.environ.get("CUDA_VISIBLE_DEVICES", "")))
    if not os.path.exists(ctl):
        os.mkfifo(ctl)
    while True:
        with open(ctl) as f:
            cmds = f.read().split()
        if "quit" in cmds:
            note("quit %d" % os.getpid())
            os.unlink(ctl)
            sys.exit(0)
else:
    data = sys.stdin.read()
    try:
        fd = os.open(ctl, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        sys.exit(1)
    os.write(fd, data.encode())
    os.close(fd)
"""


def install(bin_dir: Path) -> Path:
    """Write the fake as ``bin_dir/nvidia-cuda-mps-control`` (executable) and return it."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "nvidia-cuda-mps-control"
    exe.write_text(f"#!{sys.executable}\n{SCRIPT}", encoding="utf-8")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return exe


def log_lines(gpu_root: Path) -> list[str]:
    """What the fake daemons of one GPU noted (``DATA/mps/gpu-N``)."""
    path = gpu_root / "fake-mps.log"
    return path.read_text().splitlines() if path.exists() else []


def path_with(bin_dir: Path) -> str:
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
