"""Pods other schedulers place on gpufence's nodes, through the real API server (fake kubelets
run and finish them): used capacity that a serving surge never preempts -- its reason names
them -- unless a pod opts in with the label ``gpufence.io/preemptible: "true"``, which makes it
a checkpointable victim: the notice, its ack, its eviction, as for gpufence's own pods."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kobjects as k
import pytest
from cluster import KubeCluster
from fake_objects import FakeNode
from kenv import Env
from kubelet import FakeKubelet
from test_k8s_lending import ACK, MERGE, NOTICE, SERVING, WriteLog

FENCES = """
name: k8s-foreign
kubernetes: {{scheduler_name: {sched}}}
partitions:
  serving:
    node_selector: {{test.gpufence.io/run: {run}, gpufence.io/fence: serving}}
    admits: [serving]
    preemption: {{mode: incident-only, from: [training], budget: 4, window_s: 3600,
                 min_runtime_s: 0, grace_s: {grace}}}
  training:
    node_selector: {{test.gpufence.io/run: {run}, gpufence.io/fence: training}}
    admits: [training, batch]
queues:
  - {{name: online, partition: serving, tenant: ns-{run}}}
  - {{name: research, partition: training, tenant: ns-{run}}}
"""
OPT_IN = {"gpufence.io/preemptible": "true"}


@pytest.fixture
def kubelet(k8s_cluster: KubeCluster) -> Iterator[FakeKubelet]:
    with FakeKubelet(k8s_cluster.kubeconfig, lease_interval_s=1.0) as kl:
        yield kl


class Shared:
    """A serving fence (one 2-GPU node) held by sv0 and a training fence (one 4-GPU node) whose
    GPUs pods of another scheduler hold, bound by the test as that scheduler would."""

    def __init__(self, kc: KubeCluster, kubelet: FakeKubelet, tmp: Path, grace: int) -> None:
        run = f"r{secrets.token_hex(3)}"
        sched = f"gpufence-{run}"
        config = tmp / "cluster.yaml"
        config.write_text(FENCES.format(run=run, sched=sched, grace=grace))
        self.env = Env(kc, k.namespace(kc, f"ns-{run}"), run, sched, config, tmp, [])
        self.kc, self.ns, self.run = kc, self.env.ns, run
        for fence, gpus in (("serving", 2), ("training", 4)):
            labels = {"test.gpufence.io/run": run, "gpufence.io/fence": fence}
            kubelet.add_nodes([FakeNode(f"{run}-{fence}", gpus=gpus, labels=labels)])
            node_path = f"/api/v1/nodes/{run}-{fence}"
            k.ok(kc, "PATCH", node_path, {"spec": {"taints": None}}, content_type=MERGE)
        self.log = WriteLog(kc, self.ns)

    def start(self) -> None:
        self.sched = self.env.start(extra=["--lease-namespace", self.ns])
        self.sched.wait_ready()
        self.sv0 = self.env.pod("sv0", gpus=2, labels=SERVING)
        assert self.env.bound(self.sv0) == f"{self.run}-serving"

    def close(self) -> None:
        self.log.close()
        for p in self.env.procs:
            p.stop()

    def foreign(self, name: str, gpus: int, labels: dict[str, str] | None = None) -> str:
        """A pod of kube-scheduler's (``schedulerName: default-scheduler``), bound to the
        training node through a Binding, as its scheduler would."""
        k.pod(self.kc, self.ns, name, gpus=gpus, labels=labels, scheduler="default-scheduler")
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": f"{self.run}-training"},
        }
        path = f"/api/v1/namespaces/{self.ns}/pods/{name}/binding"
        k.ok(self.kc, "POST", path, binding, 201)
        k.wait(
            f"{name} Running", lambda: self.pod(name).get("status", {}).get("phase") == "Running"
        )
        self.log.mark(name)  # the watch has its bind before a test marks where its writes start
        return name

    def pod(self, name: str) -> dict[str, Any]:
        return k.get_pod_or_none(self.kc, self.ns, name) or {}

    def annotation(self, name: str, key: str) -> str:
        meta = self.pod(name).get("metadata") or {}
        return str((meta.get("annotations") or {}).get(key, ""))

    def reason(self, name: str) -> str:
        cond = k.scheduled_condition(k.get_pod(self.kc, self.ns, name)) or {}
        return str(cond.get("message", "")) if cond.get("status") == "False" else ""


@pytest.fixture
def shared(k8s_cluster: KubeCluster, kubelet: FakeKubelet, tmp_path: Path) -> Iterator[Shared]:
    s = Shared(k8s_cluster, kubelet, tmp_path, grace=120)
    try:
        yield s
    finally:
        s.close()


def test_k8s_a_foreign_pod_is_used_capacity_a_serving_surge_never_preempts(
    shared: Shared,
) -> None:
    s = shared
    kube = s.foreign("kube", gpus=4)
    s.start()
    mark = len(s.log.writes)
    sv1 = s.env.pod("sv1", gpus=2, labels=SERVING)
    told = k.wait("sv1's reason", lambda: "other schedulers" in (r := s.reason(sv1)) and r, 40)
    assert (
        f"pods of other schedulers hold 4 GPUs of training ({s.ns}/kube: 4), used capacity "
        "gpufence never preempts (unless labelled gpufence.io/preemptible=true)"
    ) in told, told
    time.sleep(4)  # protection has had its cycles: still nothing is noticed or evicted
    assert not s.annotation(kube, NOTICE)
    assert not (s.pod(kube).get("metadata") or {}).get("deletionTimestamp")
    assert not k.node_of(s.kc, s.ns, sv1)
    assert s.log.since(mark, {kube, sv1}) == []


def test_k8s_an_opted_in_foreign_pod_is_a_checkpointable_victim(shared: Shared) -> None:
    s = shared
    kube = s.foreign("kube", gpus=2)
    opt = s.foreign("opt", gpus=2, labels=OPT_IN)
    s.start()
    mark = len(s.log.writes)
    sv1 = s.env.pod("sv1", gpus=2, labels=SERVING)
    value = k.wait("the notice on opt", lambda: s.annotation(opt, NOTICE), 40)
    assert value.startswith("incident-preemption "), value
    told = k.wait("sv1's reason", lambda: "checkpoint" in (r := s.reason(sv1)) and r)
    assert f"waiting for {s.ns}/opt to checkpoint" in told, told
    patch = {"metadata": {"annotations": {ACK: value}}}
    k.ok(s.kc, "PATCH", f"/api/v1/namespaces/{s.ns}/pods/{opt}", patch, content_type=MERGE)
    assert s.env.bound(sv1, 40) == f"{s.run}-training"
    s.log.seen(("bind", sv1))
    assert s.log.since(mark, {kube, opt, sv1}) == [
        ("notice", opt),
        ("evict", opt),
        ("delete", opt),
        ("bind", sv1),
    ]
    assert not s.annotation(kube, NOTICE)
    assert not (s.pod(kube).get("metadata") or {}).get("deletionTimestamp")


def test_k8s_a_restart_takes_back_the_notice_on_an_opted_in_foreign_pod(shared: Shared) -> None:
    """The notice lives on the pod: a scheduler killed between notice and ack adopts the pod
    again with the same notice (no second one), and its ack still evicts it."""
    s = shared
    opt = s.foreign("opt", gpus=4, labels=OPT_IN)
    s.start()
    sv1 = s.env.pod("sv1", gpus=2, labels=SERVING)
    value = k.wait("the notice on opt", lambda: s.annotation(opt, NOTICE), 40)
    # the Notice Event is written after the annotation: kill once both are there (a kill in
    # between leaves no Event, and the one-Event check below would read that)
    k.wait(
        "the Notice event",
        lambda: [e for e in k.events(s.kc, s.ns, opt) if e.get("reason") == "Notice"],
    )
    s.sched.kill()
    s.sched = s.env.start(extra=["--lease-namespace", s.ns])
    s.sched.wait_ready()
    time.sleep(3)  # the new leader has rebuilt and taken the pod back
    assert s.annotation(opt, NOTICE) == value
    notices = [e for e in k.events(s.kc, s.ns, opt) if e.get("reason") == "Notice"]
    assert len(notices) == 1, notices
    patch = {"metadata": {"annotations": {ACK: value}}}
    k.ok(s.kc, "PATCH", f"/api/v1/namespaces/{s.ns}/pods/{opt}", patch, content_type=MERGE)
    assert s.env.bound(sv1, 40) == f"{s.run}-training"


@pytest.fixture
def hurried(k8s_cluster: KubeCluster, kubelet: FakeKubelet, tmp_path: Path) -> Iterator[Shared]:
    s = Shared(k8s_cluster, kubelet, tmp_path, grace=6)
    try:
        yield s
    finally:
        s.close()


def test_k8s_an_opted_in_foreign_pod_that_never_acks_is_evicted_at_the_deadline(
    hurried: Shared,
) -> None:
    s = hurried
    opt = s.foreign("opt", gpus=4, labels=OPT_IN)
    s.start()
    mark = len(s.log.writes)
    sv1 = s.env.pod("sv1", gpus=2, labels=SERVING)
    value = k.wait("the notice on opt", lambda: s.annotation(opt, NOTICE), 40)
    deadline = float(value.split(" ")[1])
    k.wait("opt evicted", lambda: (s.pod(opt).get("metadata") or {}).get("deletionTimestamp"), 40)
    assert time.time() >= deadline - 1  # not before its deadline
    assert s.env.bound(sv1, 40) == f"{s.run}-training"
    s.log.seen(("bind", sv1))
    assert s.log.since(mark, {opt, sv1}) == [
        ("notice", opt),
        ("evict", opt),
        ("delete", opt),
        ("bind", sv1),
    ]
