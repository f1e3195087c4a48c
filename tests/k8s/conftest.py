"""Fixtures for the Kubernetes tests: the binaries (built by ``harness/build.sh`` into a cache
outside the repository, or taken from ``GPUFENCE_K8S_BIN_DIR``) and one etcd + kube-apiserver per
test session.

Without a Go toolchain (and no cached binaries) the tests skip, saying why; with ``CI=true`` they
fail instead: CI must run the Kubernetes tests.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import kobjects as k
import pytest
from cluster import ClusterError, KubeCluster
from kenv import FENCED, Env

HARNESS = Path(__file__).resolve().parent / "harness"
BUILD_SCRIPT = HARNESS / "build.sh"
BINARIES = ("kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl", "etcd")
GANG_API = [
    "--runtime-config=scheduling.k8s.io/v1beta1=true",
    "--feature-gates=GenericWorkload=true",
]
BUILD_TIMEOUT_S = 3600  # a cold kube-apiserver build on 2 cores is ~10-25 minutes


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the Kubernetes tests: {reason}", pytrace=False)
    pytest.skip(reason)


def _have_go() -> bool:
    return bool(
        os.environ.get("GO") or shutil.which("go") or os.access("/usr/local/go/bin/go", os.X_OK)
    )


@pytest.fixture(scope="session")
def k8s_bin_dir(request: pytest.FixtureRequest) -> Path:
    """The directory with kube-apiserver, kube-scheduler and etcd."""
    override = os.environ.get("GPUFENCE_K8S_BIN_DIR")
    if override:
        bin_dir = Path(override)
        missing = [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]
        if missing:
            _unavailable(f"GPUFENCE_K8S_BIN_DIR={override} lacks {', '.join(missing)}")
        return bin_dir
    if shutil.which("bash") is None:
        _unavailable("bash is needed to run tests/k8s/harness/build.sh")
    # build.sh returns at once when the cache is up to date (go not even needed then); a cold
    # build prints its progress to the terminal, not into pytest's capture
    capman = request.config.pluginmanager.getplugin("capturemanager")
    quiet = capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext()
    with quiet:
        try:
            proc = subprocess.run(
                ["bash", str(BUILD_SCRIPT)],
                stdout=subprocess.PIPE,
                text=True,
                timeout=BUILD_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"{BUILD_SCRIPT} took more than {BUILD_TIMEOUT_S}s", pytrace=False)
    if proc.returncode == 3 or (proc.returncode != 0 and not _have_go()):
        _unavailable(
            "no Go toolchain (go on PATH or /usr/local/go/bin/go) to build kube-apiserver/etcd "
            "for the Kubernetes tests, and no cached binaries; install Go >= 1.26 or set "
            "GPUFENCE_K8S_BIN_DIR"
        )
    if proc.returncode != 0:
        pytest.fail(
            f"{BUILD_SCRIPT} failed with exit code {proc.returncode} (its output is above)",
            pytrace=False,
        )
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def k8s_cluster(
    k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeCluster]:
    """etcd + kube-apiserver on 127.0.0.1 for the whole session (no kubelet, no controllers)."""
    if shutil.which("openssl") is None:
        _unavailable("the openssl CLI is needed to make the test cluster's certificates")
    work = tmp_path_factory.mktemp("k8s")
    # Kubernetes' own gang API (PodGroups, beta in 1.37) is served, as a cluster that wants
    # gangs would turn it on; the annotation pair is tested beside it
    cluster = KubeCluster(k8s_bin_dir, work, extra_apiserver_args=GANG_API)
    try:
        cluster.start()
    except ClusterError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def env(k8s_cluster: KubeCluster, tmp_path: Path) -> Iterator[Env]:
    run = f"r{secrets.token_hex(3)}"
    sched = f"gpufence-{run}"
    config = tmp_path / "cluster.yaml"
    config.write_text(FENCED.format(run=run, sched=sched))
    e = Env(k8s_cluster, k.namespace(k8s_cluster, f"ns-{run}"), run, sched, config, tmp_path, [])
    try:
        yield e
    finally:
        for p in e.procs:
            p.stop()
