"""The README's "On Kubernetes" walk-through, step by step, as a newcomer runs it on the harness:
a real kube-apiserver with kube-controller-manager (so the serving Deployment makes its own
pods), the harness-built kubectl, deploy/ applied, gpufence k8s run, the examples applied. It
checks what the README promises: the gang bound whole, the serving pods inside their fence, a
pending reason in ``kubectl describe``, and ``gpufence k8s status``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import kobjects as k
import pytest
from cluster import KubeCluster
from scheduler_proc import SchedulerProc

from conftest import GANG_API

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def walk_cluster(k8s_bin_dir: Path, tmp_path: Path) -> Iterator[KubeCluster]:
    kc = KubeCluster(k8s_bin_dir, tmp_path / "k8s", extra_apiserver_args=GANG_API)
    kc.start()
    try:
        kc.start_controllers()
        yield kc
    finally:
        kc.close()


def test_k8s_readme_walk_gang_serving_and_a_pending_reason(
    walk_cluster: KubeCluster, k8s_bin_dir: Path, tmp_path: Path
) -> None:
    kc = walk_cluster
    env = {
        **os.environ,
        "KUBECONFIG": str(kc.kubeconfig),
        "PATH": f"{k8s_bin_dir}:{os.environ['PATH']}",
    }

    def sh(*argv: str) -> str:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    sh("kubectl", "apply", "-f", "deploy/")
    py = sys.executable
    sh(
        py,
        "tests/k8s/play.py",
        "nodes",
        "serving-0=serving:2",
        "training-0=training:4",
        "training-1=training:4",
    )
    config = tmp_path / "cluster.yaml"
    config.write_text(
        sh(
            "kubectl",
            "-n",
            "gpufence-system",
            "get",
            "configmap",
            "gpufence-cluster",
            "-o",
            r"jsonpath={.data.cluster\.yaml}",
        )
    )
    sched = SchedulerProc(kc.kubeconfig, config, tmp_path / "gpufence.log")
    try:
        sched.wait_ready(60)
        sh(
            "kubectl",
            "apply",
            "-f",
            "src/gpufence/examples/k8s/gang.yaml",
            "-f",
            "src/gpufence/examples/k8s/serving.yaml",
        )
        # the gang: all four bound, over the two training nodes
        gang = [f"resnet-{i}" for i in range(4)]
        nodes = [k.wait(f"{p} bound", lambda p=p: k.node_of(kc, "vision", p), 60) for p in gang]
        assert set(nodes) == {"training-0", "training-1"}

        # the serving Deployment's own pods (its ReplicaSet made them) on the serving node
        def llm_nodes() -> list[str]:
            return [p["spec"].get("nodeName", "") for p in k.pods(kc, "online")]

        assert k.wait("llm pods bound", lambda: (n := llm_nodes()) and all(n) and n, 60) == [
            "serving-0",
            "serving-0",
        ]
        # a third replica: the serving fence (2 GPUs) is full, the reason is on the pod
        sh("kubectl", "-n", "online", "scale", "deployment", "llm", "--replicas", "3")
        pending = k.wait(
            "the third pod",
            lambda: [
                p["metadata"]["name"] for p in k.pods(kc, "online") if not p["spec"].get("nodeName")
            ],
            60,
        )[0]
        described = k.wait(
            "a pending reason in kubectl describe",
            lambda: (
                (out := sh("kubectl", "-n", "online", "describe", "pod", pending))
                and "FailedScheduling" in out
                and out
            ),
            60,
        )
        # the Event's message is the core's reason with its numbers
        assert "gpufence-scheduler" in described
        assert "needs 1 free GPU, partition serving has 0 free" in described
        condition = k.scheduled_condition(k.get_pod(kc, "online", pending))
        assert condition is not None and condition["reason"] == "Unschedulable"
        status = sh(py, "-m", "gpufence", "k8s", "status", "--url", sched.url)
        assert "serving" in status and "training" in status
        wide = sh("kubectl", "get", "pods", "-A", "-o", "wide")
        assert "resnet-0" in wide and "serving-0" in wide
        fences = k.wait(
            "kubectl get fences",
            lambda: (o := sh("kubectl", "get", "fences")) and "training" in o and o,
            30,
        )
        assert "CAPACITY" in fences
    finally:
        sched.stop()
