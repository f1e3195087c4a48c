"""A clumsy operator's arguments get one line saying what is wrong, never a traceback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest


def _gpufence(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufence", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_up_on_a_data_dir_that_is_a_file(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "data"
    not_a_dir.write_text("x")
    out = _gpufence("up", "--fake-gpus", "1", "--port", "0", "--data", str(not_a_dir))
    assert out.returncode == 2, out
    assert f"error: {not_a_dir} is not a directory" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize("verb", ["events", "queue", "history"])
def test_a_limit_past_any_list_is_a_usage_error(verb: str, tmp_path: Path) -> None:
    out = _gpufence(verb, "--limit", str(10**20), "--data", str(tmp_path))
    assert out.returncode == 2, out
    assert "Invalid value for '--limit'" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr, out.stderr


def test_a_url_without_a_scheme_is_named_with_the_fix(tmp_path: Path) -> None:
    out = _gpufence("queue", "--url", "127.0.0.1:7878", "--token", "t")
    assert out.returncode == 2, out
    assert "must start with http:// or https://" in out.stderr, out.stderr
    assert "http://127.0.0.1:7878" in out.stderr and "Traceback" not in out.stderr


def test_a_server_that_is_not_gpufence_is_named_as_such(tmp_path: Path) -> None:
    """A 404 page of another web server is no gpufence answer (it said 'File not found')."""
    srv = subprocess.Popen(
        [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert srv.stdout is not None
        line = srv.stdout.readline()  # "Serving HTTP on 127.0.0.1 port N (http://...)"
        port = line.split(" port ")[1].split()[0]
        out = _gpufence("queue", "--url", f"http://127.0.0.1:{port}", "--token", "t")
    finally:
        srv.kill()
        srv.wait()
    assert out.returncode != 0, out
    assert "without a gpufence error: is it a gpufence server" in out.stderr, out.stderr


def test_a_data_dir_without_its_server_file_says_so(tmp_path: Path) -> None:
    """The operator deleted DATA/server.json (or the server stopped): the default URL is tried,
    and the error says why that one, instead of only 'no server at 127.0.0.1:7878'."""
    (tmp_path / "admin.token").write_text("t\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFENCE_")}
    out = _gpufence("queue", "--data", str(tmp_path), env=env)
    assert out.returncode == 1, out
    assert f"{tmp_path / 'server.json'} is missing" in out.stderr, out.stderr


def test_fake_gpus_past_one_machine_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    data = tmp_path / "data"
    out = _gpufence("up", "--fake-gpus", "100000", "--port", "0", "--data", str(data))
    assert out.returncode == 2, out
    assert "--fake-gpus needs a number of GPUs from 1 to 256" in out.stderr, out.stderr
    assert not data.exists()


def test_a_port_in_use_stops_up_before_it_makes_a_data_directory(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        data = tmp_path / "data"
        out = _gpufence("up", "--fake-gpus", "1", "--port", str(port), "--data", str(data))
    assert out.returncode == 2, out
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr, out.stderr
    assert not data.exists()


def test_a_config_with_more_gpus_than_fake_gpus_is_refused(tmp_path: Path) -> None:
    """It ran the config's 4 GPUs while the log said 2 fake ones."""
    config = tmp_path / "c.yaml"
    config.write_text(
        "name: t\nnode_groups:\n  - {name: a, count: 1, gpus_per_node: 4, gpu_type: H100-80GB}\n"
        "partitions:\n  p: {nodes: [a], admits: [training]}\n"
    )
    out = _gpufence(
        "up", "--config", str(config), "--fake-gpus", "2", "--port", "0", "--data",
        str(tmp_path / "data"),
    )  # fmt: skip
    assert out.returncode == 2, out
    assert "give --fake-gpus 4" in out.stderr, out.stderr


def test_a_data_dirs_server_that_is_down_is_to_be_started_on_that_dir(tmp_path: Path) -> None:
    """Its server.json names a port nothing listens on (it was kill -9ed): the hint is to start
    it on that data dir; a bare `gpufence up` would start a second plane on ~/.gpufence."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "admin.token").write_text("t\n")
    (tmp_path / "server.json").write_text(json.dumps({"url": f"http://127.0.0.1:{port}"}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFENCE_")}
    out = _gpufence("queue", "--data", str(tmp_path), env=env)
    assert out.returncode == 1, out
    assert f"start it with `gpufence up --data {tmp_path}`" in out.stderr, out.stderr
