"""A throwaway Kubernetes control plane for tests: etcd + kube-apiserver (+ optionally
kube-scheduler), all on 127.0.0.1 only, from the binaries that ``harness/build.sh`` builds.

No kubelet, no controller-manager: objects (Nodes, Pods) exist only as API objects, which is what a
scheduler front end needs. Certificates come from the ``openssl`` CLI; the HTTP client is the
standard library (``http.client`` with the cluster's CA and a bearer token).

    with KubeCluster(bin_dir, tmp_dir) as kc:
        kc.request("GET", "/api/v1/namespaces")
        kc.kubeconfig            # admin kubeconfig file
        kc.start_scheduler()     # upstream kube-scheduler against it

Runnable by hand too: ``python tests/k8s/cluster.py BIN_DIR`` starts a cluster and prints how to
reach it until Ctrl-C.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"

# Admission plugins switched off: ServiceAccount rejects every pod until the (absent)
# controller-manager has created the namespace's "default" ServiceAccount.
DISABLED_ADMISSION_PLUGINS = ("ServiceAccount",)

# Users in the static token file (token,user,uid,"groups"):
ADMIN_USER = "gpufence-admin"  # system:masters: everything
GPUFENCE_SCHEDULER_USER = "gpufence-scheduler"  # no RBAC grants yet: tests grant what they need
KUBE_SCHEDULER_USER = "system:kube-scheduler"  # the bootstrap RBAC role of the upstream scheduler


class ClusterError(RuntimeError):
    """A component failed to start (the message carries the tail of its log)."""


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1 (the usual small race: a caller retries)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the child gets SIGTERM when the test process dies, even by SIGKILL."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _openssl(args: str, cwd: Path) -> None:
    """Runs ``openssl ARGS`` (split on whitespace: no paths with spaces, all relative to cwd)."""
    argv = ["openssl", *args.split()]
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False, timeout=60)
    if proc.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed:\n{proc.stderr}")


def make_pki(pki: Path) -> None:
    """CA, a serving certificate for 127.0.0.1/localhost signed by it, and an RSA key pair for
    service-account tokens, all under ``pki`` (valid for two days)."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req -x509 -newkey rsa:2048 -nodes -days 2 -keyout ca.key -out ca.crt"
        " -subj /CN=gpufence-test-ca -addext basicConstraints=critical,CA:TRUE"
        " -addext keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        pki,
    )
    _openssl(
        "req -new -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr"
        " -subj /CN=kube-apiserver",
        pki,
    )
    (pki / "apiserver.ext").write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        f"subjectAltName=IP:{LOOPBACK},DNS:localhost\n"
    )
    _openssl(
        "x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2"
        " -extfile apiserver.ext -out apiserver.crt",
        pki,
    )
    _openssl("genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key", pki)
    _openssl("pkey -in sa.key -pubout -out sa.pub", pki)


def _kubeconfig_text(server: str, ca_file: Path, user: str, token: str) -> str:
    # JSON is YAML: client-go, kubectl and every Python client read it
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "gpufence-test",
                    "cluster": {"server": server, "certificate-authority": str(ca_file)},
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [
                {"name": "gpufence-test", "context": {"cluster": "gpufence-test", "user": user}}
            ],
            "current-context": "gpufence-test",
        },
        indent=2,
    )


class _Proc:
    """One component: its process and its log file."""

    def __init__(self, name: str, argv: Sequence[str], log: Path) -> None:
        self.name = name
        self.log = log
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "ETCDCTL_ENDPOINTS")}
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def failure(self, what: str) -> ClusterError:
        state = "running" if self.alive() else f"exited with {self.popen.returncode}"
        return ClusterError(f"{self.name} {what} ({state}); log {self.log}:\n{self.log_tail()}")

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds."""
        if self.popen.poll() is not None:
            return
        self.popen.terminate()
        try:
            self.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=10)


class KubeCluster:
    """etcd + kube-apiserver on 127.0.0.1, from the binaries in ``bin_dir``; files (PKI, tokens,
    kubeconfigs, data, logs) under ``work_dir``. ``start()`` returns once /readyz says ok;
    ``close()`` stops everything it started."""

    def __init__(
        self,
        bin_dir: str | os.PathLike[str],
        work_dir: str | os.PathLike[str],
        *,
        ready_timeout: float = 120.0,
        extra_apiserver_args: Sequence[str] = (),
    ) -> None:
        self.bin_dir = Path(bin_dir)
        self.work_dir = Path(work_dir)
        self.ready_timeout = ready_timeout
        self.extra_apiserver_args = list(extra_apiserver_args)
        self.pki = self.work_dir / "pki"
        self.ca_file = self.pki / "ca.crt"
        self.admin_token = secrets.token_hex(16)
        self.gpufence_scheduler_token = secrets.token_hex(16)
        self.kube_scheduler_token = secrets.token_hex(16)
        self.kubeconfig = self.work_dir / "admin.kubeconfig"
        self.gpufence_scheduler_kubeconfig = self.work_dir / "gpufence-scheduler.kubeconfig"
        self.kube_scheduler_kubeconfig = self.work_dir / "kube-scheduler.kubeconfig"
        self.etcd_url = ""
        self.port = 0
        self.server = ""
        self._procs: list[_Proc] = []
        self._ssl: ssl.SSLContext | None = None

    # ---- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> KubeCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def binary(self, name: str) -> str:
        path = self.bin_dir / name
        if not os.access(path, os.X_OK):
            raise ClusterError(
                f"{path}: missing or not executable (run tests/k8s/harness/build.sh)"
            )
        return str(path)

    def start(self) -> KubeCluster:
        try:
            self.work_dir.mkdir(parents=True, exist_ok=True)
            (self.work_dir / "logs").mkdir(exist_ok=True)
            make_pki(self.pki)
            self._write_tokens()
            self._ssl = ssl.create_default_context(cafile=str(self.ca_file))
            self._start_etcd()
            self._start_apiserver()
            for path, user, token in (
                (self.kubeconfig, ADMIN_USER, self.admin_token),
                (
                    self.gpufence_scheduler_kubeconfig,
                    GPUFENCE_SCHEDULER_USER,
                    self.gpufence_scheduler_token,
                ),
                (self.kube_scheduler_kubeconfig, KUBE_SCHEDULER_USER, self.kube_scheduler_token),
            ):
                path.write_text(_kubeconfig_text(self.server, self.ca_file, user, token))
                path.chmod(0o600)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stops the components, newest first (scheduler, apiserver, etcd)."""
        while self._procs:
            self._procs.pop().stop()

    def _log(self, name: str) -> Path:
        return self.work_dir / "logs" / f"{name}.log"

    def _write_tokens(self) -> None:
        tokens = self.work_dir / "tokens.csv"
        tokens.write_text(
            f'{self.admin_token},{ADMIN_USER},uid-admin,"system:masters"\n'
            f"{self.gpufence_scheduler_token},{GPUFENCE_SCHEDULER_USER},uid-gpufence-scheduler\n"
            f"{self.kube_scheduler_token},{KUBE_SCHEDULER_USER},uid-kube-scheduler\n"
        )
        tokens.chmod(0o600)

    def _start_etcd(self, attempts: int = 3) -> None:
        for attempt in range(attempts):
            client, peer = free_port(), free_port()
            url = f"http://{LOOPBACK}:{client}"
            proc = _Proc(
                "etcd",
                [
                    self.binary("etcd"),
                    f"--data-dir={self.work_dir / 'etcd-data'}",
                    f"--listen-client-urls={url}",
                    f"--advertise-client-urls={url}",
                    f"--listen-peer-urls=http://{LOOPBACK}:{peer}",
                ],
                self._log("etcd"),
            )
            self._procs.append(proc)
            if self._wait(
                proc, lambda u=url: _etcd_healthy(u), 60.0, raise_on_exit=attempt == attempts - 1
            ):
                self.etcd_url = url
                return
            self._procs.remove(proc)  # exited early: most likely a port taken meanwhile
            proc.stop()

    def apiserver_args(self) -> list[str]:
        """The kube-apiserver command line (without the binary)."""
        return [
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={LOOPBACK}",
            f"--advertise-address={LOOPBACK}",
            f"--secure-port={self.port}",
            f"--tls-cert-file={self.pki / 'apiserver.crt'}",
            f"--tls-private-key-file={self.pki / 'apiserver.key'}",
            f"--client-ca-file={self.ca_file}",
            f"--service-account-key-file={self.pki / 'sa.pub'}",
            f"--service-account-signing-key-file={self.pki / 'sa.key'}",
            f"--service-account-issuer=https://{LOOPBACK}:{self.port}",
            f"--token-auth-file={self.work_dir / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            f"--disable-admission-plugins={','.join(DISABLED_ADMISSION_PLUGINS)}",
            # the "kubernetes" Service's endpoints would be 127.0.0.1, which Endpoints validation
            # rejects (loopback): no reconciler, no error loop in the log
            "--endpoint-reconciler-type=none",
            f"--cert-dir={self.pki / 'generated'}",
            "--profiling=false",
            *self.extra_apiserver_args,
        ]

    def _start_apiserver(self, attempts: int = 3) -> None:
        for attempt in range(attempts):
            self.port = free_port()
            self.server = f"https://{LOOPBACK}:{self.port}"
            proc = _Proc(
                "kube-apiserver",
                [self.binary("kube-apiserver"), *self.apiserver_args()],
                self._log("kube-apiserver"),
            )
            self._procs.append(proc)
            if self._wait(
                proc, self._readyz_ok, self.ready_timeout, raise_on_exit=attempt == attempts - 1
            ):
                return
            self._procs.remove(proc)
            proc.stop()

    def restart_apiserver(self, down_s: float = 1.0) -> None:
        """Stop kube-apiserver and start it again on the same port (etcd keeps the data): what
        clients see when the control plane is upgraded or crashes -- every watch breaks."""
        proc = next(p for p in self._procs if p.name == "kube-apiserver")
        proc.stop()
        self._procs.remove(proc)
        time.sleep(down_s)
        fresh = _Proc(
            "kube-apiserver",
            [self.binary("kube-apiserver"), *self.apiserver_args()],
            self._log("kube-apiserver"),
        )
        self._procs.append(fresh)
        self._wait(fresh, self._readyz_ok, self.ready_timeout, raise_on_exit=True)

    def _wait(self, proc: _Proc, probe: Any, timeout: float, *, raise_on_exit: bool) -> bool:
        """Polls ``probe()`` until true. False when the process exits (and ``raise_on_exit`` is
        false); ClusterError on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not proc.alive():
                if raise_on_exit:
                    raise proc.failure("exited before it was ready")
                return False
            if probe():
                return True
            time.sleep(0.25)
        proc.stop()
        raise proc.failure(f"not ready within {timeout:.0f}s")

    def _readyz_ok(self) -> bool:
        try:
            status, body = self.request_raw("GET", "/readyz", timeout=5)
        except (OSError, http.client.HTTPException):
            return False
        return status == 200 and body.strip() == b"ok"

    # ---- kube-scheduler ----------------------------------------------------------------------

    def start_scheduler(
        self, extra_args: Sequence[str] = (), timeout: float = 60.0
    ) -> subprocess.Popen[bytes]:
        """Starts the upstream kube-scheduler (user system:kube-scheduler, leader election off,
        its own HTTPS endpoint on a free 127.0.0.1 port) and waits for its /healthz. It is stopped
        by ``close()`` (or stop the returned process yourself)."""
        port = free_port()
        cfg = str(self.kube_scheduler_kubeconfig)
        proc = _Proc(
            "kube-scheduler",
            [
                self.binary("kube-scheduler"),
                f"--kubeconfig={cfg}",
                f"--authentication-kubeconfig={cfg}",
                f"--authorization-kubeconfig={cfg}",
                "--leader-elect=false",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={port}",
                f"--cert-dir={self.work_dir / 'kube-scheduler-certs'}",
                "--profiling=false",
                *extra_args,
            ],
            self._log("kube-scheduler"),
        )
        self._procs.append(proc)
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # its self-signed serving cert; only /healthz is read

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(
                    f"https://{LOOPBACK}:{port}/healthz", context=insecure, timeout=5
                ) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        self._wait(proc, healthy, timeout, raise_on_exit=True)
        return proc.popen

    def start_controllers(self, timeout: float = 60.0) -> subprocess.Popen[bytes]:
        """Starts the upstream kube-controller-manager (as the admin, leader election off, no
        serving port) so that Deployments make ReplicaSets and pods, Jobs make pods, and the
        garbage collector removes what an owner's deletion leaves. The node lifecycle and taint
        eviction controllers are off: the nodes are fake and no kubelet renews their leases
        (a test says when one fails). Returns once a Deployment's ReplicaSet appears."""
        cfg = str(self.kubeconfig)
        proc = _Proc(
            "kube-controller-manager",
            [
                self.binary("kube-controller-manager"),
                f"--kubeconfig={cfg}",
                "--leader-elect=false",
                f"--bind-address={LOOPBACK}",
                "--secure-port=0",
                f"--service-account-private-key-file={self.pki / 'sa.key'}",
                f"--root-ca-file={self.ca_file}",
                "--use-service-account-credentials=false",
                "--controllers=*,-node-lifecycle-controller,-taint-eviction-controller,"
                "-node-ipam-controller,-device-taint-eviction-controller",
                "--profiling=false",
            ],
            self._log("kube-controller-manager"),
        )
        self._procs.append(proc)

        def syncing() -> bool:
            status, _ = self.request("GET", "/apis/apps/v1/deployments")
            text = proc.log.read_text(errors="replace") if proc.log.exists() else ""
            return (
                status == 200 and 'controller="deployment"' in text and "Caches are synced" in text
            )

        self._wait(proc, syncing, timeout, raise_on_exit=True)
        return proc.popen

    # ---- HTTP --------------------------------------------------------------------------------

    def request_raw(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        token: str | None = None,
        content_type: str = "application/json",
        timeout: float = 30,
    ) -> tuple[int, bytes]:
        """One HTTPS request to the API server (CA-verified, bearer ``token``, default admin)."""
        assert self._ssl is not None, "cluster not started"
        conn = http.client.HTTPSConnection(LOOPBACK, self.port, context=self._ssl, timeout=timeout)
        try:
            headers = {
                "Authorization": f"Bearer {token or self.admin_token}",
                "Accept": "application/json",
            }
            if body is not None:
                headers["Content-Type"] = content_type
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def request(
        self,
        method: str,
        path: str,
        obj: Any = None,
        *,
        token: str | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        """``request_raw`` with a JSON body and a decoded JSON answer."""
        body = None if obj is None else json.dumps(obj).encode()
        status, raw = self.request_raw(method, path, body, token=token, content_type=content_type)
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")


def _etcd_healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
            return bool(json.loads(r.read()).get("health") == "true")
    except (OSError, ValueError):
        return False


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: cluster.py BIN_DIR  (see tests/k8s/harness/build.sh)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="gpufence-k8s-"))
    gang_api = [
        "--runtime-config=scheduling.k8s.io/v1beta1=true",
        "--feature-gates=GenericWorkload=true",
    ]
    try:
        with KubeCluster(argv[0], work, extra_apiserver_args=gang_api) as kc:
            kc.start_controllers()
            print(f"API server {kc.server} (with kube-controller-manager)")
            print(f"export KUBECONFIG={kc.kubeconfig} PATH={kc.bin_dir}:$PATH")
            print(f"logs in {work / 'logs'}; Ctrl-C stops it")
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
