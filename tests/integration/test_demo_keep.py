"""``gpufence demo --keep``: after the demo, act 2's control plane and its web dashboard stay up
(a real ``gpufence demo`` process on 8 fake GPUs) until Ctrl-C, which stops them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

LAST = re.compile(
    r"dashboard: (http://127\.0\.0\.1:\d+/) \(sign in with the admin token in (\S+)\); "
    r"act 2's control plane stays up: Ctrl-C to stop"
)


@pytest.mark.slow  # the whole live demo (~1 min), then the kept plane
def test_keep_serves_the_dashboard_until_ctrl_c() -> None:
    env = {**os.environ, "COLUMNS": "300"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufence", "demo", "--keep", "--fake-gpus", "8", "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 240
        found = None
        while found is None:
            assert proc.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "".join(lines)
            found = next((m for ln in list(lines) if (m := LAST.search(ln))), None)
            time.sleep(0.2)
        url, token_file = found.group(1), Path(found.group(2))
        with urllib.request.urlopen(url, timeout=10) as resp:  # the page
            assert b"/ui/app.js" in resp.read()
        token = token_file.read_text().strip()
        req = urllib.request.Request(
            url + "v1/series", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:  # act 2's history, still served
            marks = {m["kind"] for m in json.loads(resp.read())["marks"]}
        assert {"preemption", "reclaim"} <= marks
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(60)
        reader.join(10)
    assert rc == 0, "".join(lines)
    assert "stopping the demo's control plane" in "".join(lines)
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=5)
