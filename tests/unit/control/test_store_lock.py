"""The store's file lock: a second holder is refused with the message, and nothing else."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpufence.control.store.errors import StoreError
from gpufence.control.store.ownership import FileLock, Owner


def test_second_lock_is_refused_cleanly_and_released_lock_can_be_taken(tmp_path: Path) -> None:
    db = tmp_path / "gpufence.db"
    unraisable: list[Any] = []
    old_hook = sys.unraisablehook
    sys.unraisablehook = unraisable.append
    try:
        first = FileLock(db)
        with pytest.raises(StoreError, match="another gpufence control plane uses the store"):
            FileLock(db)
        gc.collect()  # the refused lock's __del__ runs here
        first.release()
        again = FileLock(db)  # released: free to take
        again.release()
        gc.collect()
    finally:
        sys.unraisablehook = old_hook
    assert unraisable == [], [u.exc_value for u in unraisable]


def test_a_zombie_owner_is_not_alive() -> None:
    """A killed server nobody reaped is a zombie: its owner row must read as dead."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        me = Owner.me()
        stat = Path(f"/proc/{child.pid}/stat").read_bytes()
        start = int(stat[stat.rfind(b")") + 2 :].split()[19])
        owner = Owner(child.pid, start, me.boot_id, me.host, me.since)
        assert owner.alive()
        os.kill(child.pid, signal.SIGKILL)  # killed, and not reaped until child.wait() below
        deadline = time.monotonic() + 10
        while b") Z" not in Path(f"/proc/{child.pid}/stat").read_bytes():
            assert time.monotonic() < deadline, "the child did not become a zombie"
            time.sleep(0.01)
        assert not owner.alive()
    finally:
        child.kill()
        child.wait()
