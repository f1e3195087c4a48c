"""``bench/device_check.py`` without a GPU: its self-check on the fake NVML passes, says that it
is a self-check, and ends with one line of figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a control plane and real processes (~5 s)

SCRIPT = Path(__file__).parents[2] / "bench" / "device_check.py"


def test_the_self_check_passes_and_says_so() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--self-check"], capture_output=True, text=True, timeout=120
    )
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "running the self-check on the fake NVML" in done.stdout
    assert not [line for line in lines if line.startswith("FAIL")]
    last = dict(kv.split("=", 1) for kv in lines[-1].split())
    assert last["mode"] == "self-check" and last["failures"] == "0"
