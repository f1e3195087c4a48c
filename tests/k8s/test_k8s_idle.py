"""Idle reclaim of notebooks on Kubernetes, through the real API server: a pod's GPU activity
comes from its ``gpufence.io/gpu-activity`` annotation (a sidecar's) and from NVIDIA's DCGM
exporter read through a real Prometheus; the core decides (warn after ``idle_after_s``, release
after ``warning_s``), the front end writes the warning (the ``gpufence.io/notice`` annotation and
a Notice Event) and the release (a Preempted Event and a ``policy/v1`` eviction).

The API server writes an audit log; the scheduler runs as deploy/'s ServiceAccount (its token
from the TokenRequest API, its grants deploy/'s RBAC alone), so its writes are read back from the
log in the order the API server took them. deploy/07-notice-policy.yaml is in force: the
scheduler's notices pass it, a tenant's forged or removed notice does not.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kapply
import kobjects as k
import pytest
from cluster import KubeCluster, _kubeconfig_text, free_port
from fake_objects import FakeNode
from kenv import Env
from kubelet import FakeKubelet
from scheduler_proc import SchedulerProc

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SA = "system:serviceaccount:gpufence-system:gpufence-scheduler"
NOTICE, ACTIVITY = "gpufence.io/notice", "gpufence.io/gpu-activity"
IDLE_AFTER, WARNING = 4, 4
AUDIT_POLICY = f"""
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Request
    users: ["{SA}"]
    verbs: [create, patch, update, delete]
  - level: None
"""
FENCES = """
name: k8s-idle
kubernetes: {{scheduler_name: {sched}}}
partitions:
  notebooks:
    node_selector: {{test.gpufence.io/run: {run}, gpufence.io/fence: notebooks}}
    admits: [interactive]
    reclaim: {{idle_threshold: 0.2, idle_after_s: {idle}, warning_s: {warning}}}
  open:
    node_selector: {{test.gpufence.io/run: {run}, gpufence.io/fence: open}}
    admits: [interactive]
queues:
  - {{name: nb, partition: notebooks, tenant: ns-{run}}}
  - {{name: open, partition: open, tenant: ns-{run}}}
"""
NOTEBOOK = {"gpufence.io/class": "interactive", "gpufence.io/queue": "nb"}
OPEN = {"gpufence.io/class": "interactive", "gpufence.io/queue": "open"}


@pytest.fixture(scope="module")
def audited(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    """An API server of this module's own that logs the scheduler's writes, with deploy/
    applied (its RBAC for the scheduler's ServiceAccount, its admission policies)."""
    work = tmp_path_factory.mktemp("k8s-idle")
    (work / "audit-policy.yaml").write_text(AUDIT_POLICY)
    kc = KubeCluster(
        k8s_bin_dir,
        work,
        extra_apiserver_args=[
            f"--audit-policy-file={work / 'audit-policy.yaml'}",
            f"--audit-log-path={work / 'audit.log'}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
        ],
    )
    kc.start()
    try:
        kapply.apply_all(kc, kapply.documents(DEPLOY))
        yield kc
    finally:
        kc.close()


def sa_kubeconfig(kc: KubeCluster, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig with a ServiceAccount's token (TokenRequest: what a pod of it mounts)."""
    req = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
    got = k.ok(
        kc, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", req, 201
    )
    path.write_text(_kubeconfig_text(kc.server, kc.ca_file, account, got["status"]["token"]))
    path.chmod(0o600)
    return path


class Idle:
    """A notebooks fence (reclaim on) and an open fence (no reclaim), a node each, and the
    scheduler as deploy/'s ServiceAccount."""

    def __init__(self, kc: KubeCluster, kubelet: FakeKubelet, tmp: Path) -> None:
        run = f"r{secrets.token_hex(3)}"
        sched = f"gpufence-{run}"
        config = tmp / "cluster.yaml"
        config.write_text(FENCES.format(run=run, sched=sched, idle=IDLE_AFTER, warning=WARNING))
        self.env = Env(kc, k.namespace(kc, f"ns-{run}"), run, sched, config, tmp, [])
        self.kc, self.ns = kc, self.env.ns
        for fence in ("notebooks", "open"):
            labels = {"test.gpufence.io/run": run, "gpufence.io/fence": fence}
            kubelet.add_nodes([FakeNode(f"{run}-{fence}", gpus=2, labels=labels)])
            k.ok(
                kc,
                "PATCH",
                f"/api/v1/nodes/{run}-{fence}",
                {"spec": {"taints": None}},
                content_type=k.MERGE,
            )
        self.kubeconfig = sa_kubeconfig(kc, "gpufence-system", "gpufence-scheduler", tmp / "sa")

    def start(self, extra: list[str] | None = None) -> SchedulerProc:
        p = SchedulerProc(self.kubeconfig, self.env.config, self.env.tmp / "sched.log", extra=extra)
        self.env.procs.append(p)
        p.wait_ready()
        return p

    def notebook(self, name: str, labels: dict[str, str] = NOTEBOOK) -> str:
        return self.env.pod(name, gpus=1, labels=labels, grace_s=2)

    def running(self, pod: str) -> float:
        """Waits until the pod runs; returns when it was bound (its placement note)."""
        self.env.bound(pod)
        k.wait(f"{pod} Running", lambda: self.pod(pod)["status"].get("phase") == "Running")
        return float(self.annotation(pod, "gpufence.io/bound-at"))

    def pod(self, pod: str) -> dict[str, Any]:
        return k.get_pod(self.kc, self.ns, pod)

    def annotation(self, pod: str, key: str) -> str:
        got = k.get_pod_or_none(self.kc, self.ns, pod) or {}
        return str((got.get("metadata") or {}).get("annotations", {}).get(key, ""))

    def evicted(self, pod: str) -> bool:
        got = k.get_pod_or_none(self.kc, self.ns, pod)
        conds = (got or {}).get("status", {}).get("conditions") or ()
        return got is None or any(c.get("type") == "DisruptionTarget" for c in conds)

    def logged(self, pod: str, n: int) -> list[tuple[str, ...]]:
        """The writes once at least ``n`` are in the log (an audit entry may land a moment
        after the client saw the write's effect)."""
        k.wait(f"{n} writes about {pod} logged", lambda: len(self.writes(pod)) >= n, 10)
        return self.writes(pod)

    def writes(self, pod: str) -> list[tuple[str, ...]]:
        """The scheduler's writes about one pod, in the order the API server logged them."""
        out: list[tuple[str, ...]] = []
        for line in (self.kc.work_dir / "audit.log").read_text().splitlines():
            e = json.loads(line)
            ref, body = e.get("objectRef") or {}, e.get("requestObject") or {}
            if e["stage"] != "ResponseComplete" or ref.get("namespace") != self.ns:
                continue
            if ref.get("resource") == "events":
                if body.get("involvedObject", {}).get("name") == pod:
                    out.append(("event", body["reason"]))
            elif ref.get("name") == pod and ref.get("subresource") != "status":
                # (pods/status: a pending reason written before the bind, not part of this)
                what = ref.get("subresource") or e["verb"]
                if what == "patch":
                    for key, value in body["metadata"]["annotations"].items():
                        out.append(("annotate", key, str(value).split(" ")[0]))
                else:
                    out.append((what, str(e["responseStatus"]["code"])))
        return out


@pytest.fixture
def kubelet(audited: KubeCluster) -> Iterator[FakeKubelet]:
    with FakeKubelet(audited.kubeconfig, lease_interval_s=1.0) as kl:
        yield kl


@pytest.fixture
def idle(audited: KubeCluster, kubelet: FakeKubelet, tmp_path: Path) -> Iterator[Idle]:
    i = Idle(audited, kubelet, tmp_path)
    try:
        yield i
    finally:
        for p in i.env.procs:
            p.stop()


def test_k8s_an_idle_notebook_is_warned_then_released_and_one_without_reclaim_is_not(
    idle: Idle,
) -> None:
    idle.start()
    nb, free = idle.notebook("nb"), idle.notebook("free", OPEN)
    bound_at, _ = idle.running(nb), idle.running(free)
    value = k.wait("the idle warning", lambda: idle.annotation(nb, NOTICE), IDLE_AFTER + 15)
    reason, deadline = value.split(" ")
    assert reason == "idle", value
    # warned once idle for IDLE_AFTER (not before), released WARNING later (a loaded machine
    # may run the cycle late, never early)
    assert -1 <= float(deadline) - (bound_at + IDLE_AFTER + WARNING) < 10, value
    notice = k.wait(
        "the Notice event",
        lambda: [e for e in k.events(idle.kc, idle.ns, nb) if e.get("reason") == "Notice"],
    )
    assert "idle for" in notice[0]["message"], notice
    assert not idle.evicted(nb)  # warned, not yet released
    k.wait("nb released", lambda: idle.evicted(nb), WARNING + 15)
    time.sleep(1)
    assert idle.logged(nb, 5) == [
        ("binding", "201"),
        ("annotate", NOTICE, "idle"),
        ("event", "Notice"),
        ("event", "Preempted"),
        ("eviction", "201"),
    ]
    # the open fence reclaims nothing: the core never warns its notebook, idle as long
    assert idle.logged(free, 1) == [("binding", "201")]
    assert not idle.annotation(free, NOTICE) and not idle.evicted(free)


class Sidecar:
    """What a notebook's sidecar does: refresh ``gpufence.io/gpu-activity`` every second."""

    def __init__(self, idle: Idle, pod: str, util: float) -> None:
        self.idle, self.pod, self.util = idle, pod, util
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sidecar:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)

    def _run(self) -> None:
        while not self.stop.is_set():
            patch = {"metadata": {"annotations": {ACTIVITY: f"{self.util} {time.time():.0f}"}}}
            path = f"/api/v1/namespaces/{self.idle.ns}/pods/{self.pod}"
            self.idle.kc.request("PATCH", path, patch, content_type=k.MERGE)
            self.stop.wait(1.0)


def test_k8s_a_notebook_whose_sidecar_reports_activity_is_not_warned(idle: Idle) -> None:
    idle.start()
    busy, quiet = idle.notebook("busy"), idle.notebook("quiet")
    with Sidecar(idle, busy, 0.9), Sidecar(idle, quiet, 0.05):
        idle.running(busy), idle.running(quiet)
        # the quiet one's figure is under the fence's threshold: the core counts it idle
        k.wait("quiet released", lambda: idle.evicted(quiet), IDLE_AFTER + WARNING + 20)
        time.sleep(2)
        assert not idle.annotation(busy, NOTICE) and not idle.evicted(busy)
    assert idle.logged(busy, 1) == [("binding", "201")]
    assert idle.logged(quiet, 5)[-1] == ("eviction", "201")


def test_k8s_an_idle_warning_is_withdrawn_when_the_notebook_is_active_again(idle: Idle) -> None:
    idle.start()
    nb = idle.notebook("nb")
    idle.running(nb)
    k.wait("the idle warning", lambda: idle.annotation(nb, NOTICE), IDLE_AFTER + 15)
    with Sidecar(idle, nb, 0.9):
        k.wait("the warning withdrawn", lambda: not idle.annotation(nb, NOTICE), WARNING + 5)
        time.sleep(WARNING + 2)
        assert not idle.evicted(nb)
    assert idle.logged(nb, 5) == [
        ("binding", "201"),
        ("annotate", NOTICE, "idle"),
        ("event", "Notice"),
        ("annotate", NOTICE, "None"),
        ("event", "Notice"),
    ]


# -- DCGM through Prometheus ---------------------------------------------------------------


class Exporter:
    """A stand-in for NVIDIA's dcgm-exporter: its metric, with the pod mapping's labels, in
    the Prometheus text format a real Prometheus scrapes."""

    def __init__(self) -> None:
        self.util: dict[tuple[str, str, int], float] = {}  # (namespace, pod, gpu) -> percent
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
                for (ns, pod, gpu), v in sorted(outer.util.items()):
                    labels = f'gpu="{gpu}",modelName="NVIDIA H100",namespace="{ns}",pod="{pod}"'
                    lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {v}")
                body = ("\n".join(lines) + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[Exporter, str]]:
    """A real Prometheus scraping the fake exporter every second."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus not installed (Debian: apt-get install prometheus)")
    exporter = Exporter()
    port = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: dcgm\n"
        "    honor_labels: true\n"  # keep the exporter's namespace/pod labels as they are
        f"    static_configs: [{{targets: ['127.0.0.1:{exporter.port}']}}]\n"
    )
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        k.wait("Prometheus ready", lambda: _get(f"{url}/-/ready") is not None, 60, every=0.5)
        yield exporter, url
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()
        exporter.close()


def _get(url: str) -> bytes | None:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bytes(r.read())
    except OSError:
        return None


def _scraped(url: str, pod: str) -> bool:
    raw = _get(f"{url}/api/v1/query?query=DCGM_FI_DEV_GPU_UTIL")
    return raw is not None and f'"pod":"{pod}"' in raw.decode()


def test_k8s_dcgm_utilisation_through_prometheus_keeps_a_busy_notebook(
    idle: Idle, prometheus: tuple[Exporter, str]
) -> None:
    exporter, url = prometheus
    for pod, util in (("busy", 87.0), ("quiet", 3.0)):
        for gpu in (0, 1):  # the busiest GPU counts: the other one idles
            exporter.util[(idle.ns, pod, gpu)] = util if gpu == 0 else 0.0
    k.wait("the series in Prometheus", lambda: _scraped(url, "quiet"), 30)
    idle.start(["--prometheus", url, "--activity-interval", "1"])
    busy, quiet = idle.notebook("busy"), idle.notebook("quiet")
    idle.running(busy), idle.running(quiet)
    # 3 % is under the fence's threshold (20 %): the core counts quiet idle and releases it
    k.wait("quiet released", lambda: idle.evicted(quiet), IDLE_AFTER + WARNING + 20)
    time.sleep(2)
    assert not idle.annotation(busy, NOTICE) and not idle.evicted(busy)
    assert idle.logged(busy, 1) == [("binding", "201")]
    assert [w[0] for w in idle.logged(quiet, 5)] == [
        "binding",
        "annotate",
        "event",
        "event",
        "eviction",
    ]


# -- who may write the notice (deploy/07-notice-policy.yaml) ---------------------------------

FORGED = "gpufence.io/notice is set, changed and removed only by the gpufence scheduler"


def tenant_token(kc: KubeCluster, ns: str) -> str:
    """A tenant's identity: a ServiceAccount of its namespace that may create and patch pods
    there (what a notebook's pod runs as), its token from the TokenRequest API."""
    k.ok(kc, "POST", f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": "nb"}}, 201)
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "create", "patch"]}]
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
    k.ok(kc, "POST", f"{rbac}/roles", {"metadata": {"name": "nb"}, "rules": rules}, 201)
    binding = {
        "metadata": {"name": "nb"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "nb"},
        "subjects": [{"kind": "ServiceAccount", "name": "nb", "namespace": ns}],
    }
    k.ok(kc, "POST", f"{rbac}/rolebindings", binding, 201)
    req = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
    got = k.ok(kc, "POST", f"/api/v1/namespaces/{ns}/serviceaccounts/nb/token", req, 201)
    return str(got["status"]["token"])


def _create_noticed(idle: Idle, token: str) -> tuple[int, Any]:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": k.name("probe"), "annotations": {NOTICE: "idle 1"}},
        "spec": {"schedulerName": "nobody", "containers": [{"name": "m", "image": "busybox"}]},
    }
    return idle.kc.request("POST", f"/api/v1/namespaces/{idle.ns}/pods", body, token=token)


def test_k8s_a_tenant_cannot_forge_or_remove_a_notice_the_scheduler_writes(idle: Idle) -> None:
    token = tenant_token(idle.kc, idle.ns)
    # the policy is in force once the API server has loaded it
    status, body = k.wait(
        "the policy in force",
        lambda: (r := _create_noticed(idle, token))[0] != 201 and r,
        30,
        every=0.5,
    )
    assert status == 403 and FORGED in json.dumps(body), body
    idle.start()
    nb = idle.notebook("nb")
    idle.running(nb)

    def patch(annotations: dict[str, str | None]) -> tuple[int, Any]:
        path = f"/api/v1/namespaces/{idle.ns}/pods/{nb}"
        body = {"metadata": {"annotations": annotations}}
        return idle.kc.request("PATCH", path, body, token=token, content_type=k.MERGE)

    status, body = patch({NOTICE: "incident-preemption 1"})  # a forged notice
    assert status == 403 and FORGED in body["message"], body
    assert not idle.annotation(nb, NOTICE)
    # the scheduler's own notice passes the same policy
    value = k.wait("the idle warning", lambda: idle.annotation(nb, NOTICE), IDLE_AFTER + 15)
    assert value.startswith("idle "), value
    for forged in (None, "idle 99999999999"):  # removed, or its deadline moved
        status, body = patch({NOTICE: forged})
        assert status == 403 and FORGED in body["message"], (forged, body)
        assert idle.annotation(nb, NOTICE) == value
    # what the tenant answers with stays its own to write
    assert patch({"gpufence.io/checkpointed": value})[0] == 200
    assert patch({ACTIVITY: f"0.9 {time.time():.0f}"})[0] == 200
    k.wait("the warning withdrawn", lambda: not idle.annotation(nb, NOTICE), WARNING + 5)
    assert not idle.evicted(nb)
    assert idle.logged(nb, 5)[1:] == [
        ("annotate", NOTICE, "idle"),
        ("event", "Notice"),
        ("annotate", NOTICE, "None"),
        ("event", "Notice"),
    ]
