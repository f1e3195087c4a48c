"""Restart time of a real `gpufence up` with a full queue (issue 30, case 7).

Two data directories, each served by `gpufence up --fake-gpus 1` as its own process over HTTP
on 127.0.0.1: one GPU held by a long job, then

* plain: `--plain` (default 10,000) one-GPU jobs submitted, all queued behind it;
* arrays: `--arrays` (default 3) submits of `array: 0-<--tasks - 1>` (default 10,000 tasks each).

Each server is stopped (SIGTERM: its running job keeps running, to be adopted) and started
again on the same directory; "ready" is the time from the new process's start until
`/readyz` answers 200 (recovery done, the reconciler running). Prints, last:
`ready_plain_s=A ready_arrays_s=B`; exits 1 when either is over `--target-s` (default 10).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpufence.control.http.client import Client
from gpufence.testing.crashrun import kill_leftovers


def _start(data: Path) -> tuple[subprocess.Popen[bytes], float]:
    cmd = [sys.executable, "-m", "gpufence", "up", "--fake-gpus", "1", "--data", str(data)]
    log = (data.parent / f"{data.name}.log").open("ab")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [*cmd, "--port", "0", "--no-context", "--log-level", "warning"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return proc, t0


def _ready(data: Path, proc: subprocess.Popen[bytes], t0: float, limit_s: float = 600) -> float:
    """Seconds from ``t0`` until the server at ``data`` answers /readyz 200."""
    while time.monotonic() - t0 < limit_s:
        if proc.poll() is not None:
            raise SystemExit(f"gpufence up exited: see {data.parent / (data.name + '.log')}")
        try:
            url = json.loads((data / "server.json").read_text())["url"]
            with urllib.request.urlopen(url + "/readyz", timeout=5) as resp:
                if resp.status == 200:
                    return time.monotonic() - t0
        except (OSError, ValueError, KeyError, urllib.error.URLError):
            pass
        time.sleep(0.05)
    raise SystemExit(f"not ready after {limit_s} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(120)


def _fill(data: Path, bodies: list[dict[str, object]], clients: int = 8) -> None:
    c = Client(data_dir=data)
    c.submit({"command": ["sleep", "3600"], "gpus": 1})  # holds the GPU: the rest queue
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(lambda b: Client(data_dir=data).submit(b), bodies))


def _measure(data: Path, bodies: list[dict[str, object]]) -> float:
    try:
        proc, t0 = _start(data)
        _ready(data, proc, t0)
        try:
            _fill(data, bodies)
        finally:
            _stop(proc)
        proc, t0 = _start(data)
        try:
            return _ready(data, proc, t0)
        finally:
            _stop(proc)
    finally:
        kill_leftovers(data)  # the GPU holder, left running by the stop


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plain", type=int, default=10_000)
    ap.add_argument("--arrays", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--target-s", type=float, default=10.0)
    ap.add_argument("--keep", action="store_true", help="keep the data directories")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gpufence-restart-"))
    try:
        plain = [{"command": ["true"], "gpus": 1}] * a.plain
        arrays = [{"command": ["true"], "gpus": 1, "array": f"0-{a.tasks - 1}"}] * a.arrays
        ready_plain = _measure(root / "plain", plain)
        ready_arrays = _measure(root / "arrays", arrays)
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({"plain_jobs": a.plain, "array_tasks": a.arrays * a.tasks}))
    print(f"ready_plain_s={ready_plain:.2f} ready_arrays_s={ready_arrays:.2f}")
    return 0 if max(ready_plain, ready_arrays) <= a.target_s else 1


if __name__ == "__main__":
    sys.exit(main())
