"""The package as a user gets it: the wheel built from a copy of the repository, installed in
fresh virtual environments outside it (pip's usual index and cache: the dependencies the test
extra already installed come from the cache).

* ``gpufence[server,sim]``: ``--version``, ``examples list``, a sim on a packaged example, and a
  control plane (``up``) that runs a submitted job to done, found through the client context
  ``up`` wrote;
* ``gpufence`` alone (the client): ``submit --help`` and ``validate`` work, while ``up``, ``sim``
  and ``demo`` say which extra to install, with no traceback.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufence import __version__
from gpufence.testing.waiting import until

pytestmark = pytest.mark.slow  # builds a wheel, makes two venvs, installs (~1-2 min)

ROOT = Path(__file__).resolve().parents[2]
COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".venv", ".ci-venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "out"
)


def _run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 600) -> str:
    r = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{cmd}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def _env(home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GPUFENCE_", "PYTHON", "VIRTUAL_ENV")) and k != "COLUMNS"
    }
    env["XDG_CONFIG_HOME"] = str(home / "xdg")
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip wheel --no-deps`` of a copy of the repository (the work tree stays untouched)."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src-copy"
    shutil.copytree(ROOT, src, symlinks=True, ignore=COPY_IGNORE)
    out = base / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
        _env(base),
        base,
    )
    (whl,) = out.glob("gpufence-*.whl")
    return whl


def _venv(where: Path, wheel: Path, extras: str) -> Path:
    _run([sys.executable, "-m", "venv", str(where)], _env(where.parent), where.parent)
    spec = f"{wheel}[{extras}]" if extras else str(wheel)
    _run([str(where / "bin" / "pip"), "install", "-q", spec], _env(where.parent), where.parent)
    return where / "bin"


def _site_mb(venv: Path) -> float:
    (site,) = (venv.parent / "lib").glob("python3*/site-packages")
    return sum(f.stat().st_size for f in site.rglob("*") if f.is_file()) / 1e6


@pytest.fixture(scope="module")
def full(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield _venv(tmp_path_factory.mktemp("full") / "venv", wheel, "server,sim")


@pytest.fixture(scope="module")
def client_only(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield _venv(tmp_path_factory.mktemp("client") / "venv", wheel, "")


def test_wheel_metadata(wheel: Path, tmp_path: Path) -> None:
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        text = z.read(meta).decode()
    assert f"Version: {__version__}" in text
    assert "License-Expression: Apache-2.0" in text
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "gpufence/examples/mixed-64.yaml" in names
    for asset in ("index.html", "app.js", "joint.js", "base.css"):  # the web dashboard's
        assert f"gpufence/control/http/dashboard/{asset}" in names
    assert "Provides-Extra: server" in text and "Provides-Extra: sim" in text
    requires = [line for line in text.splitlines() if line.startswith("Requires-Dist:")]
    base = [r for r in requires if "extra ==" not in r]
    assert sorted(r.split()[1].split(">")[0].lower() for r in base) == [
        "pydantic",
        "pyyaml",
        "rich",
        "typer",
        "wsproto",  # run --pty / attach, client and server
    ]


def test_full_install_runs_outside_the_repository(full: Path, tmp_path: Path) -> None:
    env = _env(tmp_path)
    gf = str(full / "gpufence")
    assert _run([gf, "--version"], env, tmp_path).strip() == f"gpufence {__version__}"
    listed = json.loads(_run([gf, "examples", "list", "-o", "json"], env, tmp_path))
    assert "mixed-64.yaml" in {e["name"] for e in listed["examples"]}
    assert Path(listed["dir"]).is_relative_to(full.parent)  # from the installed package
    cluster = _run([gf, "examples", "path", "mixed-64.yaml"], env, tmp_path).strip()
    scenario = _run([gf, "examples", "path", "scenario-mixed-64.yaml"], env, tmp_path).strip()
    _run([gf, "sim", cluster, scenario, "-p", "fenced", "--out", "out"], env, tmp_path)
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["policies"]["fenced"]["invariant_violations"] == 0
    data = tmp_path / "gf-data"
    up = subprocess.Popen(
        [gf, "up", "--fake-gpus", "2", "--data", str(data), "--port", "0"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert up.stdout is not None
        line = up.stdout.readline()
        assert re.match(r"export GPUFENCE_URL=http://127\.0\.0\.1:\d+ GPUFENCE_DATA=", line), line
        until((tmp_path / "xdg" / "gpufence" / "config.yaml").exists, 10, "the context")
        url = line.split()[1].split("=", 1)[1]
        with urllib.request.urlopen(url + "/", timeout=10) as resp:  # the packaged dashboard
            assert b'src="/ui/app.js"' in resp.read()
        jid = _run([gf, "submit", "--", "python3", "-c", "print(6 * 7)"], env, tmp_path).strip()

        def state() -> str:
            out = _run([gf, "status", jid, "-o", "json"], env, tmp_path)
            return str(json.loads(out)["state"])

        deadline = time.monotonic() + 60
        while state() not in ("done", "failed") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert state() == "done"
        assert _run([gf, "logs", jid], env, tmp_path).strip() == "42"
    finally:
        up.terminate()
        up.wait(30)
    print(f"install size: server+sim {_site_mb(full):.0f} MB")


def test_client_only_install_says_which_extra(client_only: Path, tmp_path: Path) -> None:
    env = _env(tmp_path)
    gf = str(client_only / "gpufence")
    py = str(client_only / "python")
    for module in ("fastapi", "uvicorn", "numpy", "matplotlib"):
        r = subprocess.run([py, "-c", f"import {module}"], env=env, capture_output=True)
        assert r.returncode != 0, f"{module} is installed without an extra"
    r = subprocess.run([gf, "submit", "--help"], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and "--gpus" in r.stdout
    cluster = _run([gf, "examples", "path", "single-node-8gpu.yaml"], env, tmp_path).strip()
    assert "is valid" in _run([gf, "validate", cluster], env, tmp_path)
    cases = [
        (["up", "--fake-gpus", "2"], "gpufence up needs the server extra", "gpufence[server]"),
        (["demo"], "gpufence demo needs the server extra", "gpufence[server]"),
        (["sim", cluster, cluster, "-p", "fenced"], "gpufence sim needs the sim extra", "[sim]"),
        (["size", cluster, cluster, "--slo-p99-ms", "9"], "gpufence size needs the sim", "[sim]"),
    ]
    for argv, words, install in cases:
        r = subprocess.run([gf, *argv], env=env, cwd=tmp_path, capture_output=True, text=True)
        assert r.returncode == 1, (argv, r.stdout, r.stderr)
        flat = " ".join(r.stderr.split())
        assert words in flat and f"pip install 'gpufence{install[install.index('[') :]}'" in flat
        assert "Traceback" not in r.stderr
    r = subprocess.run(
        [gf, "queue", "--url", "http://127.0.0.1:9", "--token", "t" * 20],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and "no gpufence server at http://127.0.0.1:9" in r.stderr
    print(f"install size: client only {_site_mb(client_only):.0f} MB")
