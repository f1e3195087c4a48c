"""A tiny directory container image for the container tests: a few of this machine's binaries and
the shared libraries ``ldd`` says they need, copied to the same paths under a new root, plus a
marker file that exists only in the image. No ``/usr/bin/python3``, nothing else of the host."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

TOOLS = ("sh", "cat", "id", "ls", "sleep", "echo", "test")
MARKER = Path("/etc/gpufence-image")
_LIB = re.compile(r"(/\S+) \(0x")


def _copy(src: str, root: Path, at: str | None = None) -> None:
    dest = root / (at or src).lstrip("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(os.path.realpath(src), dest)
    dest.chmod(0o755)


def build_rootfs(root: Path, marker: str) -> Path:
    """Make ``root`` a root file system (world-readable: any job user may run it)."""
    root.mkdir(mode=0o755)
    libs: set[str] = set()
    for tool in TOOLS:
        path = shutil.which(tool) or f"/bin/{tool}"
        _copy(path, root, f"/bin/{tool}")
        out = subprocess.run(["ldd", path], capture_output=True, text=True, check=False).stdout
        libs.update(_LIB.findall(out))
    for lib in libs:
        _copy(lib, root)
    (root / MARKER.relative_to("/")).parent.mkdir(parents=True, exist_ok=True)
    (root / MARKER.relative_to("/")).write_text(marker + "\n")
    for d in root.rglob("*"):
        if d.is_dir():
            d.chmod(0o755)
        else:
            d.chmod(d.stat().st_mode | 0o444)
    return root
