"""The store's file lock: a second holder is refused with the message, and nothing else."""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Any

import pytest

from gpufence.control.store.errors import StoreError
from gpufence.control.store.ownership import FileLock


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
