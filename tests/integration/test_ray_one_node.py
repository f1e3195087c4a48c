"""The README's one-machine Ray recipe, run as a user runs it (issue 32, case 1).

One ``ray start --head --block --num-gpus 8`` node on 127.0.0.1, on its own port and temp dir;
``gpufence up --executor ray --ray-address 127.0.0.1:PORT`` on it (real CLI, real server); a
2-member gang submitted with ``--wait`` runs with the GPUs gpufence chose; then ``gpufence up``
is stopped, and that Ray alone is stopped by signalling its ``ray start --block`` process (no
``ray stop``, which stops every Ray on the machine). Skipped only when ``ray`` is not installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufence.testing.waiting import until

pytest.importorskip("ray", reason="ray is not installed (pip install 'gpufence[ray]')")

pytestmark = pytest.mark.slow  # a Ray node start (~10 s) and its drain at stop (up to 30 s)

ROOT = Path(__file__).resolve().parents[2]
GPUFENCE = [sys.executable, "-m", "gpufence"]
RAY = [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.exit(main())"]
EXPORT = re.compile(r"export GPUFENCE_URL=(\S+) GPUFENCE_DATA=(\S+)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ours(temp_dir: Path) -> list[int]:
    """Pids of the processes of the Ray whose temp dir is ``temp_dir`` (they name it)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if str(temp_dir).encode() in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
    return pids


@pytest.fixture
def one_ray_node() -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """The README's `ray start --head --block ...` (its own port, temp dir, loopback only)."""
    # short: Ray's unix sockets live under it (a socket path has at most 107 bytes)
    temp_dir = Path(tempfile.mkdtemp(prefix="gf-ray-", dir="/tmp"))
    port = _free_port()
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = [
        *RAY,
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--port={port}",
        f"--temp-dir={temp_dir}",
        "--num-gpus=8",
        "--num-cpus=2",
        "--resources",
        json.dumps({"rack:rack-a": 1}),
        "--include-dashboard=false",
        # the ports Ray otherwise takes at fixed numbers: another Ray on this machine (another
        # test run) must not collide with this one
        f"--dashboard-agent-listen-port={_free_port()}",
    ]
    log = open(temp_dir / "ray-start.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        until(
            lambda: (
                b"block forever" in (temp_dir / "ray-start.log").read_bytes()
                or proc.poll() is not None
            ),
            120,
            "ray start",
        )
        assert proc.poll() is None, (temp_dir / "ray-start.log").read_text(errors="replace")
        yield f"127.0.0.1:{port}", proc, temp_dir
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(60)
        for pid in _ours(temp_dir):  # whatever a failed stop left: only this Ray's
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_readme_one_machine_ray_recipe(
    one_ray_node: tuple[str, subprocess.Popen[bytes], Path], tmp_path: Path
) -> None:
    address, ray_proc, temp_dir = one_ray_node
    data = tmp_path / "gf-ray"
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("GPUFENCE_URL", None)
    out = open(tmp_path / "up.log", "wb")  # noqa: SIM115
    cmd = [*GPUFENCE, "up", "--executor", "ray", "--ray-address", address, "--port", "0"]
    up = subprocess.Popen(
        [*cmd, "--data", str(data)],
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env,
    )

    def up_log() -> str:
        return (tmp_path / "up.log").read_text(errors="replace")

    try:
        until(lambda: EXPORT.search(up_log()) or up.poll() is not None, 120, "gpufence up")
        assert up.poll() is None, up_log()
        assert "Traceback" not in up_log(), up_log()
        assert "1 node(s), 8 GPUs" in up_log(), up_log()
        cli_env = {**env, "GPUFENCE_DATA": str(data)}  # the recipe's `export GPUFENCE_DATA`
        job = "import os; print(os.environ['RANK'], os.environ['CUDA_VISIBLE_DEVICES'])"
        submit = [*GPUFENCE, "submit", "--gpus", "2", "--replicas", "2", "--wait"]
        sub = subprocess.run(
            [*submit, "--", sys.executable, "-c", job],
            capture_output=True,
            text=True,
            env=cli_env,
            timeout=180,
        )
        assert sub.returncode == 0, (sub.stdout, sub.stderr, up_log())
        jid = sub.stdout.split()[0]
        seen = []
        for rank in (0, 1):
            logs = subprocess.run(
                [*GPUFENCE, "logs", jid, "--rank", str(rank)],
                capture_output=True,
                text=True,
                env=cli_env,
                timeout=60,
            )
            assert logs.returncode == 0, logs.stderr
            seen.append(logs.stdout.split())
        # each rank saw its RANK and two GPU indices, and no GPU is shared between them
        assert [s[0] for s in seen] == ["0", "1"], seen
        devices = [d for s in seen for d in s[1].split(",")]
        assert len(devices) == 4 and len(set(devices)) == 4, seen
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            up.wait(60)
        out.close()
    # stop this Ray alone: its `ray start --block` process takes the rest with it
    ray_proc.send_signal(signal.SIGTERM)
    ray_proc.wait(90)
    until(lambda: not _ours(temp_dir), 30, "this Ray's processes gone")


def test_readme_recipe_stops_only_its_own_ray() -> None:
    """The recipe's block in the README: its own port and temp dir, stopped by its job, never
    a bare `ray stop` (which stops every Ray on the machine)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Run on a Ray cluster", 1)[1].split("\n## ", 1)[0]
    assert "ray start --head --block" in section
    assert "--temp-dir" in section and "--ray-address 127.0.0.1:" in section
    assert not re.search(r"(^|[;&|]\s*)ray stop\b", section, re.M), section
    assert "'.[ray]'" not in section or "server" in section
