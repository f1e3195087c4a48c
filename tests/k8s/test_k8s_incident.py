"""Incident preemption on Kubernetes, through the real API server with kube-controller-manager
(the disruption controller keeps PodDisruptionBudgets' status, the Job controller makes pods):
a serving surge in a full fence -> the core's Notice is the ``gpufence.io/notice`` annotation
and an Event on exactly the checkpointable pod it names -> the workload's ack
(``gpufence.io/checkpointed``) -> the core's Stop is a ``policy/v1`` eviction, which a PDB may
hold (retried, and the waiting pod's reason says so) -> the serving pod binds on the freed GPUs.
"""

from __future__ import annotations

import json
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

INCIDENT = """
name: k8s-incident
kubernetes: {{scheduler_name: {sched}}}
partitions:
  serving:
    node_selector: {{test.gpufence.io/run: {run}, gpufence.io/fence: serving}}
    admits: [serving]
    preemption: {{mode: incident-only, from: [training], budget: {budget}, window_s: 3600,
                 min_runtime_s: 0, grace_s: {grace}}}
  training:
    node_selector: {{test.gpufence.io/run: {run}, gpufence.io/fence: training}}
    admits: [training, batch]
queues:
  - {{name: online, partition: serving, tenant: ns-{run}}}
  - {{name: research, partition: training, tenant: ns-{run}}}
"""
NOTICE, ACK = "gpufence.io/notice", "gpufence.io/checkpointed"
SERVING = {"gpufence.io/class": "serving"}
MERGE = "application/merge-patch+json"


@pytest.fixture(scope="module")
def controlled(
    k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeCluster]:
    """An API server of this module's own, with kube-controller-manager running."""
    kc = KubeCluster(k8s_bin_dir, tmp_path_factory.mktemp("k8s-incident"))
    kc.start()
    try:
        kc.start_controllers()
        yield kc
    finally:
        kc.close()


@pytest.fixture
def kubelet(controlled: KubeCluster) -> Iterator[FakeKubelet]:
    with FakeKubelet(controlled.kubeconfig, lease_interval_s=1.0) as kl:
        yield kl


def _env(kc: KubeCluster, tmp: Path, budget: int, grace: int) -> Env:
    run = f"r{secrets.token_hex(3)}"
    sched = f"gpufence-{run}"
    config = tmp / "cluster.yaml"
    config.write_text(INCIDENT.format(run=run, sched=sched, budget=budget, grace=grace))
    return Env(kc, k.namespace(kc, f"ns-{run}"), run, sched, config, tmp, [])


@pytest.fixture
def full(controlled: KubeCluster, kubelet: FakeKubelet, tmp_path: Path) -> Iterator[Full]:
    f = Full(_env(controlled, tmp_path, budget=1, grace=120), kubelet)
    try:
        yield f
    finally:
        for p in f.env.procs:
            p.stop()


class Full:
    """A serving fence (one 2-GPU node) held by sv0, and a training fence (one 6-GPU node) held
    by two checkpointable pods (``ckpt`` of the lower priority: the core's first victim) and one
    that is not."""

    def __init__(self, env: Env, kubelet: FakeKubelet, *, job: bool = False) -> None:
        self.env, self.kc, self.ns = env, env.kc, env.ns
        for fence, gpus in (("serving", 2), ("training", 6)):
            labels = {"test.gpufence.io/run": env.run, "gpufence.io/fence": fence}
            kubelet.add_nodes([FakeNode(f"{env.run}-{fence}", gpus=gpus, labels=labels)])
            # (the not-ready taint the admission plugin adds is lifted here too: the fake
            # kubelet's own patch may lose a race with the node's first status write)
            node_path = f"/api/v1/nodes/{env.run}-{fence}"
            k.ok(self.kc, "PATCH", node_path, {"spec": {"taints": None}}, content_type=MERGE)
        self.sched = self.start()
        self.sv0 = env.pod("sv0", gpus=2, labels=SERVING)
        ckpt = {"gpufence.io/checkpointable": "true"}
        # a few seconds of grace: the eviction's marks (deletionTimestamp, DisruptionTarget)
        # stay visible that long before the fake kubelet finishes the pod
        self.ckpt = (
            self.job_pod()
            if job
            else env.pod(
                "ckpt",
                gpus=2,
                annotations={**ckpt, "gpufence.io/priority": "0"},
                labels={"app": "ckpt"},
                grace_s=4,
            )
        )
        self.ckpt2 = env.pod("ckpt2", gpus=2, annotations={**ckpt, "gpufence.io/priority": "5"})
        self.keep = env.pod("keep", gpus=2, annotations={"gpufence.io/priority": "0"})
        for p in (self.sv0, self.ckpt, self.ckpt2, self.keep):
            env.bound(p)
            k.wait(f"{p} Running", lambda p=p: self.pod(p)["status"].get("phase") == "Running")

    def job_pod(self) -> str:
        """ckpt as the pod of a batch/v1 Job (its controller makes the next attempt's pod)."""
        ann = {"gpufence.io/checkpointable": "true", "gpufence.io/priority": "0"}
        spec = {
            "schedulerName": self.env.sched,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 4,
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"limits": {k.GPU: "2"}}}
            ],
        }
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "train"},
            "spec": {
                "backoffLimit": 6,
                "template": {
                    "metadata": {"labels": {"app": "ckpt"}, "annotations": ann},
                    "spec": spec,
                },
            },
        }
        k.ok(self.kc, "POST", f"/apis/batch/v1/namespaces/{self.ns}/jobs", job, 201)
        return str(k.wait("the Job's pod", lambda: self.job_pods() and self.job_pods()[0]))

    def job_pods(self) -> list[str]:
        return [
            p["metadata"]["name"]
            for p in k.pods(self.kc, self.ns)
            if p["metadata"].get("labels", {}).get("job-name") == "train"
        ]

    def start(self) -> Any:
        s = self.env.start(extra=["--lease-namespace", self.ns])
        s.wait_ready()
        return s

    def pod(self, name: str) -> dict[str, Any]:
        return k.get_pod(self.kc, self.ns, name)

    def annotation(self, name: str, key: str) -> str:
        got = k.get_pod_or_none(self.kc, self.ns, name)
        return str(((got or {}).get("metadata") or {}).get("annotations", {}).get(key, ""))

    def reason(self, name: str) -> str:
        cond = k.scheduled_condition(self.pod(name)) or {}
        return str(cond.get("message", "")) if cond.get("status") == "False" else ""

    def events(self, name: str, reason: str) -> list[dict[str, Any]]:
        return [e for e in k.events(self.kc, self.ns, name) if e.get("reason") == reason]

    def ack(self, name: str) -> None:
        """What the workload does once its checkpoint is written (README, "On Kubernetes")."""
        value = self.annotation(name, NOTICE)
        assert value, f"{name} has no notice to acknowledge"
        patch = {"metadata": {"annotations": {ACK: value}}}
        k.ok(
            self.kc, "PATCH", f"/api/v1/namespaces/{self.ns}/pods/{name}", patch, content_type=MERGE
        )

    def evicted(self, name: str) -> dict[str, Any] | None:
        """The pod as the Eviction API leaves it: terminating, with the DisruptionTarget
        condition only an eviction sets (a plain delete does not)."""
        got = k.get_pod_or_none(self.kc, self.ns, name)
        if got is None or not got["metadata"].get("deletionTimestamp"):
            return None
        for cond in got.get("status", {}).get("conditions") or ():
            if cond.get("type") == "DisruptionTarget":
                return dict(cond)
        return None

    def no_notice_but(self, name: str) -> None:
        for other in (self.sv0, self.ckpt, self.ckpt2, self.keep):
            if other != name:
                assert not self.annotation(other, NOTICE), f"{other} was noticed too"
                assert not self.events(other, "Notice"), f"{other} got a Notice event"
                assert not self.events(other, "Preempted"), f"{other} was stopped"


def _notice_deadline(value: str) -> float:
    reason, deadline = value.split(" ")
    assert reason == "incident-preemption", value
    return float(deadline)


def test_k8s_serving_surge_evicts_exactly_the_checkpointable_pod_the_core_names(
    full: Full,
) -> None:
    sv1 = full.env.pod("sv1", gpus=2, labels=SERVING)
    value = k.wait("the notice on ckpt", lambda: full.annotation(full.ckpt, NOTICE))
    assert abs(_notice_deadline(value) - (time.time() + 120)) < 15, value
    assert k.wait("a Notice event", lambda: full.events(full.ckpt, "Notice"))
    told = k.wait("sv1's reason", lambda: "checkpoint" in (r := full.reason(sv1)) and r)
    assert f"waiting for {full.ns}/{full.ckpt} to checkpoint, deadline in " in told, told
    left = int(told.split("deadline in ")[1].split(" s")[0])
    assert 90 <= left <= 120, told
    assert not full.evicted(full.ckpt)  # nothing is stopped before the checkpoint
    full.ack(full.ckpt)
    cond = k.wait("ckpt evicted", lambda: full.evicted(full.ckpt), 15)
    assert cond["reason"] == "EvictionByEvictionAPI", cond
    assert full.env.bound(sv1, 30) == f"{full.env.run}-training"
    full.no_notice_but(full.ckpt)
    for p in (full.sv0, full.ckpt2, full.keep):
        assert not full.pod(p)["metadata"].get("deletionTimestamp"), p


def test_k8s_a_pdb_that_forbids_the_eviction_holds_the_stop_and_the_reason_says_so(
    full: Full,
) -> None:
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "ckpt"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "ckpt"}}},
    }
    path = f"/apis/policy/v1/namespaces/{full.ns}/poddisruptionbudgets"
    k.ok(full.kc, "POST", path, pdb, 201)
    k.wait(
        "the disruption controller's status",
        lambda: k.ok(full.kc, "GET", f"{path}/ckpt").get("status", {}).get("observedGeneration"),
    )
    sv1 = full.env.pod("sv1", gpus=2, labels=SERVING)
    k.wait("the notice on ckpt", lambda: full.annotation(full.ckpt, NOTICE))
    full.ack(full.ckpt)
    told = k.wait("sv1's reason", lambda: "eviction is refused" in (r := full.reason(sv1)) and r)
    assert f"waiting for {full.ns}/{full.ckpt} to stop" in told, told
    assert "disruption budget" in told, told
    assert k.wait("an EvictionRefused event", lambda: full.events(full.ckpt, "EvictionRefused"))
    time.sleep(3)  # retried meanwhile, and never deleted around the budget
    assert full.pod(full.ckpt)["metadata"].get("deletionTimestamp") is None
    assert not k.node_of(full.kc, full.ns, sv1)
    full.no_notice_but(full.ckpt)
    # the operator lifts the budget: the next retry evicts, and sv1 runs
    k.ok(full.kc, "DELETE", f"{path}/ckpt")
    cond = k.wait("ckpt evicted", lambda: full.evicted(full.ckpt), 40)
    assert cond["reason"] == "EvictionByEvictionAPI", cond
    full.env.bound(sv1, 30)


def _state_record(full: Full) -> dict[str, Any]:
    path = f"/apis/coordination.k8s.io/v1/namespaces/{full.ns}/leases/gpufence-scheduler-state"
    status, body = full.kc.request("GET", path)
    if status != 200:
        return {}
    raw = (body.get("metadata") or {}).get("annotations", {}).get("gpufence.io/preemptions")
    return dict(json.loads(raw)) if raw else {}


def test_k8s_kill_9_between_notice_and_stop_keeps_the_notice_and_the_spent_budget(
    full: Full,
) -> None:
    sv1 = full.env.pod("sv1", gpus=2, labels=SERVING)
    value = k.wait("the notice on ckpt", lambda: full.annotation(full.ckpt, NOTICE))
    spent = k.wait("the budget slot in the state record", lambda: _state_record(full))
    assert list(spent) == ["serving"] and len(spent["serving"]) == 1, spent
    # the Notice Event is written after the annotation: the kill comes once both are there (a
    # kill in between would leave no Event, and the one-Event check below would read that)
    k.wait("the Notice event", lambda: full.events(full.ckpt, "Notice"))
    full.sched.kill()
    # the reason the killed scheduler wrote is wiped, so what follows is the new one's word
    cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "-"}
    k.ok(
        full.kc,
        "PATCH",
        f"/api/v1/namespaces/{full.ns}/pods/{sv1}/status",
        {"status": {"conditions": [cond]}},
        content_type="application/strategic-merge-patch+json",
    )
    full.sched = full.start()
    told = k.wait(
        "sv1's reason after the restart", lambda: "checkpoint" in (r := full.reason(sv1)) and r
    )
    assert f"waiting for {full.ns}/{full.ckpt} to checkpoint" in told, told
    assert full.annotation(full.ckpt, NOTICE) == value  # the same notice, not a second one
    assert len(full.events(full.ckpt, "Notice")) == 1
    full.no_notice_but(full.ckpt)
    full.ack(full.ckpt)
    k.wait("ckpt evicted", lambda: full.evicted(full.ckpt), 15)
    full.env.bound(sv1, 30)
    # the budget (1 in an hour) was spent before the crash and stays spent: a second surge
    # preempts nobody (a restart that forgot it would notice ckpt2 now)
    sv2 = full.env.pod("sv2", gpus=2, labels=SERVING)
    why = k.wait("sv2's reason", lambda: "preemption-budget" in (r := full.reason(sv2)) and r)
    assert "budget spent (1 of 1" in why, why
    time.sleep(2)
    full.no_notice_but(full.ckpt)
    assert not k.node_of(full.kc, full.ns, sv2)


@pytest.fixture
def full_job(controlled: KubeCluster, kubelet: FakeKubelet, tmp_path: Path) -> Iterator[Full]:
    f = Full(_env(controlled, tmp_path, budget=1, grace=120), kubelet, job=True)
    try:
        yield f
    finally:
        for p in f.env.procs:
            p.stop()


def test_k8s_an_evicted_job_pod_comes_back_through_its_controller_as_attempt_2(
    full_job: Full,
) -> None:
    full = full_job
    first = full.ckpt
    job_id = full.annotation(first, "gpufence.io/job")
    assert full.annotation(first, "gpufence.io/attempt") == "1"
    sv1 = full.env.pod("sv1", gpus=2, labels=SERVING)
    k.wait("the notice on the Job's pod", lambda: full.annotation(first, NOTICE))
    full.ack(first)
    k.wait("the Job's pod evicted", lambda: full.evicted(first), 15)
    full.env.bound(sv1, 30)
    # the Job controller replaces the evicted pod; the fence is full, so it waits ...
    again = k.wait("the Job's next pod", lambda: [p for p in full.job_pods() if p != first], 60)
    time.sleep(2)
    assert not k.node_of(full.kc, full.ns, again[0])
    # ... until room frees up: then it is bound as the same job's second attempt
    k.delete_pod(full.kc, full.ns, full.keep)
    full.env.bound(again[0], 30)
    assert full.annotation(again[0], "gpufence.io/job") == job_id
    assert full.annotation(again[0], "gpufence.io/attempt") == "2"


def _requeued_record(full: Full) -> dict[str, Any]:
    path = f"/apis/coordination.k8s.io/v1/namespaces/{full.ns}/leases/gpufence-scheduler-state"
    status, body = full.kc.request("GET", path)
    raw = (body.get("metadata") or {}).get("annotations", {}) if status == 200 else {}
    return dict(json.loads(raw.get("gpufence.io/requeued") or "{}"))


def test_k8s_a_requeued_job_is_still_attempt_2_after_a_kill_9_before_its_next_pod_binds(
    full_job: Full,
) -> None:
    full = full_job
    first = full.ckpt
    job_id = full.annotation(first, "gpufence.io/job")
    sv1 = full.env.pod("sv1", gpus=2, labels=SERVING)
    k.wait("the notice on the Job's pod", lambda: full.annotation(first, NOTICE))
    full.ack(first)
    k.wait("the Job's pod evicted", lambda: full.evicted(first), 15)
    full.env.bound(sv1, 30)
    # the requeued job waits for its controller's pod: that is written down before a crash
    saved = k.wait("the requeued job in the state record", lambda: _requeued_record(full), 60)
    assert list(saved.values()) == [[job_id, 2]], saved
    full.sched.kill()
    again = k.wait("the Job's next pod", lambda: [p for p in full.job_pods() if p != first], 60)
    full.sched = full.start()
    time.sleep(2)
    assert not k.node_of(full.kc, full.ns, again[0])
    k.delete_pod(full.kc, full.ns, full.keep)
    full.env.bound(again[0], 30)
    assert full.annotation(again[0], "gpufence.io/job") == job_id
    assert full.annotation(again[0], "gpufence.io/attempt") == "2"
