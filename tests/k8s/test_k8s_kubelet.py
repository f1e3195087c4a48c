"""The fake kubelet (kubelet.py) against the real kube-apiserver: nodes and leases, pods Running
then Succeeded/Failed, deleted pods finalized, NotReady/Ready, and a pod watch that survives
410 Gone."""

from __future__ import annotations

import base64
import json
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import ClusterError, KubeCluster
from fake_objects import EXIT_CODE, GPU, NOT_READY_TAINT, RUN_S, FakeNode
from kubelet import FakeKubelet


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _ok(kc: KubeCluster, method: str, path: str, obj: Any = None, *, expect: int = 200) -> Any:
    status, body = kc.request(
        method,
        path,
        obj,
        content_type="application/merge-patch+json" if method == "PATCH" else "application/json",
    )
    assert status == expect, f"{method} {path}: {status} {body}"
    return body


def _until(what: str, probe: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.1)


@pytest.fixture()
def kubelet(k8s_cluster: KubeCluster) -> Iterator[FakeKubelet]:
    with FakeKubelet(k8s_cluster.kubeconfig, lease_interval_s=0.5) as kl:
        yield kl


@pytest.fixture()
def ns(k8s_cluster: KubeCluster) -> str:
    name = _name("kubelet")
    _ok(k8s_cluster, "POST", "/api/v1/namespaces", {"metadata": {"name": name}}, expect=201)
    return name


def _pod(kc: KubeCluster, ns: str, node: str, annotations: dict[str, str] | None = None) -> str:
    """A pod bound to ``node`` at creation (as if a scheduler had bound it)."""
    name = _name("pod")
    spec = {
        "nodeName": node,
        "containers": [
            {"name": "main", "image": "fake", "resources": {"limits": {GPU: "1"}}},
            {"name": "side", "image": "fake"},
        ],
    }
    meta = {"name": name, "annotations": annotations or {}}
    _ok(kc, "POST", f"/api/v1/namespaces/{ns}/pods", {"metadata": meta, "spec": spec}, expect=201)
    return name


def _get(kc: KubeCluster, ns: str, pod: str) -> dict[str, Any] | None:
    status, body = kc.request("GET", f"/api/v1/namespaces/{ns}/pods/{pod}")
    if status == 404:
        return None
    assert status == 200, body
    return dict(body)


def _phase(kc: KubeCluster, ns: str, pod: str) -> str | None:
    got = _get(kc, ns, pod)
    return None if got is None else got["status"].get("phase")


def _conditions(pod: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}


def _lease_renewed(kc: KubeCluster, node: str) -> str:
    path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}"
    return str(_ok(kc, "GET", path)["spec"]["renewTime"])


def test_k8s_kubelet_registers_ready_gpu_nodes_with_leases(
    k8s_cluster: KubeCluster, kubelet: FakeKubelet
) -> None:
    kc = k8s_cluster
    a, b = _name("gpu"), _name("mig")
    kubelet.add_nodes(
        [
            FakeNode(
                a,
                gpus=4,
                product="NVIDIA-A100-SXM4-80GB",
                gpu_memory_mib=81920,
                labels={"gpufence.io/rack": "r7"},
            ),
            FakeNode(b, gpus=1, mig={"1g.10gb": 7}, cpu="32", memory="256Gi"),
        ]
    )
    node = _ok(kc, "GET", f"/api/v1/nodes/{a}")
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert labels["nvidia.com/gpu.memory"] == "81920"
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["gpufence.io/rack"] == "r7"
    assert labels["kubernetes.io/hostname"] == a
    assert node["status"]["allocatable"][GPU] == "4"
    assert _conditions(node) == {"Ready": "True"}
    # the not-ready taint the API server put on the new Node is gone, as once a node is Ready
    assert not node["spec"].get("taints")
    mig = _ok(kc, "GET", f"/api/v1/nodes/{b}")["status"]["allocatable"]
    assert mig["nvidia.com/mig-1g.10gb"] == "7"
    assert (mig["cpu"], mig["memory"]) == ("32", "256Gi")
    first = _lease_renewed(kc, a)
    _until("the lease renewed", lambda: _lease_renewed(kc, a) != first, timeout=10)


def test_k8s_kubelet_runs_pods_then_succeeds_or_fails(
    k8s_cluster: KubeCluster, kubelet: FakeKubelet, ns: str
) -> None:
    kc = k8s_cluster
    node = _name("gpu")
    kubelet.add_nodes([FakeNode(node)])
    ok = _pod(kc, ns, node, {RUN_S: "1.5"})
    bad = _pod(kc, ns, node, {RUN_S: "1.5", EXIT_CODE: "3"})
    forever = _pod(kc, ns, node)
    _until("pods Running", lambda: all(_phase(kc, ns, p) == "Running" for p in (ok, bad, forever)))
    running = _get(kc, ns, ok)
    assert running is not None
    assert _conditions(running) == {
        "PodScheduled": "True",
        "Initialized": "True",
        "ContainersReady": "True",
        "Ready": "True",
    }
    assert running["status"]["startTime"]
    assert {c["name"] for c in running["status"]["containerStatuses"]} == {"main", "side"}
    assert all("running" in c["state"] for c in running["status"]["containerStatuses"])
    _until("ok Succeeded", lambda: _phase(kc, ns, ok) == "Succeeded")
    _until("bad Failed", lambda: _phase(kc, ns, bad) == "Failed")
    failed = _get(kc, ns, bad)
    assert failed is not None
    codes = {c["state"]["terminated"]["exitCode"] for c in failed["status"]["containerStatuses"]}
    assert codes == {3}
    assert _conditions(failed)["Ready"] == "False"
    time.sleep(1)
    assert _phase(kc, ns, forever) == "Running"  # no run-s: runs until deleted


def test_k8s_kubelet_ignores_pods_of_other_nodes(
    k8s_cluster: KubeCluster, kubelet: FakeKubelet, ns: str
) -> None:
    kc = k8s_cluster
    mine, theirs = _name("gpu"), _name("other")
    kubelet.add_nodes([FakeNode(mine)])
    _ok(kc, "POST", "/api/v1/nodes", {"metadata": {"name": theirs}}, expect=201)
    other = _pod(kc, ns, theirs, {RUN_S: "0"})
    own = _pod(kc, ns, mine)
    _until("own pod Running", lambda: _phase(kc, ns, own) == "Running")
    assert _phase(kc, ns, other) == "Pending"


def test_k8s_kubelet_finalizes_deleted_pods_after_their_grace(
    k8s_cluster: KubeCluster, kubelet: FakeKubelet, ns: str
) -> None:
    kc = k8s_cluster
    node = _name("gpu")
    kubelet.add_nodes([FakeNode(node)])
    running = _pod(kc, ns, node)
    _until("Running", lambda: _phase(kc, ns, running) == "Running")
    t0 = time.monotonic()
    _ok(kc, "DELETE", f"/api/v1/namespaces/{ns}/pods/{running}?gracePeriodSeconds=2")
    # the API server alone never removes a running pod bound to a node: the kubelet must,
    # once the grace has passed (read at once: a read after a fixed sleep could come past the
    # 2 s on a loaded machine; the removal not coming early is the >= 1.5 s check below)
    terminating = _get(kc, ns, running)
    assert terminating is not None and terminating["metadata"]["deletionTimestamp"]
    _until("running pod removed", lambda: _get(kc, ns, running) is None, timeout=10)
    assert time.monotonic() - t0 >= 1.5  # it waited for (most of) the 2 s grace
    _until("counted", lambda: kubelet.stats.finalized >= 1)
    assert kubelet.stats.errors == 0


def test_k8s_kubelet_not_ready_freezes_node_until_ready(
    k8s_cluster: KubeCluster, kubelet: FakeKubelet, ns: str
) -> None:
    kc = k8s_cluster
    node = _name("gpu")
    kubelet.add_nodes([FakeNode(node)])
    kubelet.set_ready(node, False)
    got = _ok(kc, "GET", f"/api/v1/nodes/{node}")
    assert _conditions(got) == {"Ready": "False"}
    assert [(t["key"], t["effect"]) for t in got["spec"]["taints"]] == [
        (NOT_READY_TAINT, "NoSchedule")
    ]
    renewed = _lease_renewed(kc, node)
    pod = _pod(kc, ns, node, {RUN_S: "0.5"})
    time.sleep(1.5)
    assert _phase(kc, ns, pod) == "Pending"  # a dead kubelet starts nothing
    assert _lease_renewed(kc, node) == renewed  # nor renews its lease
    kubelet.set_ready(node, True)
    got = _ok(kc, "GET", f"/api/v1/nodes/{node}")
    assert _conditions(got) == {"Ready": "True"}
    assert not got["spec"].get("taints")
    _until("the parked pod runs and ends", lambda: _phase(kc, ns, pod) == "Succeeded")
    _until("lease renewed again", lambda: _lease_renewed(kc, node) != renewed, timeout=10)


def _etcd(kc: KubeCluster, path: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        f"{kc.etcd_url}{path}", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return dict(json.loads(r.read()))


def _compact_etcd(kc: KubeCluster) -> None:
    """Compacts etcd at its current revision: every older resourceVersion is gone (410)."""
    key = base64.b64encode(b"/").decode()
    rev = int(_etcd(kc, "/v3/kv/range", {"key": key, "limit": 1})["header"]["revision"])
    _etcd(kc, "/v3/kv/compaction", {"revision": rev, "physical": True})


@pytest.fixture(scope="module")
def uncached_cluster(
    k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeCluster]:
    """An API server without its watch cache: a watch from a compacted resourceVersion gets
    410 Gone straight from etcd, as any watch does after a long enough disconnect."""
    cluster = KubeCluster(
        k8s_bin_dir,
        tmp_path_factory.mktemp("k8s-nocache"),
        extra_apiserver_args=["--watch-cache=false"],
    )
    try:
        cluster.start()
    except ClusterError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.mark.slow
def test_k8s_kubelet_watch_survives_410_gone(uncached_cluster: KubeCluster) -> None:
    kc = uncached_cluster
    ns = _name("gone")
    _ok(kc, "POST", "/api/v1/namespaces", {"metadata": {"name": ns}}, expect=201)
    with FakeKubelet(kc.kubeconfig) as kubelet:
        node = _name("gpu")
        kubelet.add_nodes([FakeNode(node)])
        before = _pod(kc, ns, node)
        _until("Running", lambda: _phase(kc, ns, before) == "Running")
        kubelet.pause_watch()  # a partition: what happens now is only seen through a re-list
        _ok(kc, "DELETE", f"/api/v1/namespaces/{ns}/pods/{before}?gracePeriodSeconds=1")
        during = _pod(kc, ns, node, {RUN_S: "0.5"})
        _compact_etcd(kc)
        kubelet.resume_watch()
        _until("re-listed after 410", lambda: kubelet.stats.relists >= 1)
        _until("the pod created meanwhile ran", lambda: _phase(kc, ns, during) == "Succeeded")
        _until("the pod deleted meanwhile finalized", lambda: _get(kc, ns, before) is None)
