"""The workload controllers gpufence supports on Kubernetes, each through the real API server
with kube-controller-manager making the pods:

- an indexed ``batch/v1`` Job whose pods are one gang: evicted by an incident, the Job
  controller's new pods are the same job's attempt 2, all members, bound together;
- a ``Deployment`` for serving: its ReplicaSet's pods are placed in the serving fence; a replica
  stopped by a node failure comes back through the ReplicaSet as the same job's attempt 2, and
  the pod the ReplicaSet makes after a deletion by hand is placed in the fence too (a new job);
- a bare ``Pod``: evicted and never made again, its job ends as preempted and its Preempted
  Event says so;
- a JobSet (``jobset.x-k8s.io``): its controller is not built here (the Go module
  sigs.k8s.io/jobset is not served to this harness), so the test installs the JobSet CRD and
  makes the child Jobs as JobSet's controller does -- owned by the JobSet, labelled
  ``jobset.sigs.k8s.io/jobset-name``, and on a restart deleted and made anew -- and the new
  Jobs' pods are the gang's attempt 2.
"""

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

CONFIG = """
name: k8s-controllers
kubernetes: {{scheduler_name: {sched}}}
partitions:
  serving:
    node_selector: {{test.gpufence.io/run: {run}, gpufence.io/fence: serving}}
    admits: [serving]
    preemption: {{mode: incident-only, from: [training], budget: 5, window_s: 3600,
                 min_runtime_s: 0, grace_s: 120}}
  training:
    node_selector: {{test.gpufence.io/run: {run}, gpufence.io/fence: training}}
    admits: [training, batch]
queues:
  - {{name: online, partition: serving, tenant: ns-{run}}}
  - {{name: research, partition: training, tenant: ns-{run}}}
"""
NOTICE, ACK = "gpufence.io/notice", "gpufence.io/checkpointed"
JOB, ATTEMPT = "gpufence.io/job", "gpufence.io/attempt"
SERVING = {"gpufence.io/class": "serving"}
MERGE = "application/merge-patch+json"
CKPT = {"gpufence.io/checkpointable": "true", "gpufence.io/priority": "0"}
JOBSET_GROUP, JOBSET_VERSION = "jobset.x-k8s.io", "v1alpha2"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"jobsets.{JOBSET_GROUP}"},
    "spec": {
        "group": JOBSET_GROUP,
        "scope": "Namespaced",
        "names": {"kind": "JobSet", "plural": "jobsets", "singular": "jobset"},
        "versions": [
            {
                "name": JOBSET_VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


@pytest.fixture(scope="module")
def controlled(
    k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeCluster]:
    """An API server of this module's own, with kube-controller-manager and the JobSet CRD."""
    kc = KubeCluster(k8s_bin_dir, tmp_path_factory.mktemp("k8s-controllers"))
    kc.start()
    try:
        kc.start_controllers()
        k.ok(kc, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", JOBSET_CRD, 201)
        k.wait(
            "the JobSet CRD served",
            lambda: kc.request("GET", f"/apis/{JOBSET_GROUP}/{JOBSET_VERSION}/jobsets")[0] == 200,
        )
        yield kc
    finally:
        kc.close()


class Fences:
    """``serving_nodes`` serving nodes of ``serving_gpus`` and a training node of
    ``training_gpus``, fake kubelets for them, and gpufence running for them."""

    def __init__(
        self,
        kc: KubeCluster,
        kubelet: FakeKubelet,
        tmp: Path,
        serving_gpus: int,
        training_gpus: int,
        serving_nodes: int = 1,
    ) -> None:
        run = f"c{secrets.token_hex(3)}"
        config = tmp / "cluster.yaml"
        config.write_text(CONFIG.format(run=run, sched=f"gpufence-{run}"))
        self.env = Env(kc, k.namespace(kc, f"ns-{run}"), run, f"gpufence-{run}", config, tmp, [])
        self.kc, self.ns = kc, self.env.ns
        self.serving_node, self.training_node = f"{run}-serving", f"{run}-training"
        nodes = [(self.serving_node, "serving", serving_gpus)]
        nodes += [(f"{run}-serving-{i}", "serving", serving_gpus) for i in range(1, serving_nodes)]
        for name, fence, gpus in (*nodes, (self.training_node, "training", training_gpus)):
            labels = {"test.gpufence.io/run": run, "gpufence.io/fence": fence}
            kubelet.add_nodes([FakeNode(name, gpus=gpus, labels=labels)])
            path = f"/api/v1/nodes/{name}"
            k.ok(kc, "PATCH", path, {"spec": {"taints": None}}, content_type=MERGE)
        self.env.start(extra=["--lease-namespace", self.ns]).wait_ready()

    def pod(self, name: str) -> dict[str, Any]:
        return k.get_pod_or_none(self.kc, self.ns, name) or {}

    def annotation(self, name: str, key: str) -> str:
        return str((self.pod(name).get("metadata") or {}).get("annotations", {}).get(key, ""))

    def running(self, name: str, timeout: float = 30) -> None:
        k.wait(
            f"{name} Running",
            lambda: self.pod(name).get("status", {}).get("phase") == "Running",
            timeout,
        )

    def ack(self, name: str) -> None:
        """The workload's word that its checkpoint is written (README, "On Kubernetes")."""
        value = k.wait(f"the notice on {name}", lambda: self.annotation(name, NOTICE))
        patch = {"metadata": {"annotations": {ACK: value}}}
        path = f"/api/v1/namespaces/{self.ns}/pods/{name}"
        k.ok(self.kc, "PATCH", path, patch, content_type=MERGE)

    def owned_by(self, kind: str, name: str) -> list[str]:
        """Live pods whose controller is the ``kind`` named ``name``, by name."""
        return sorted(
            p["metadata"]["name"]
            for p in k.pods(self.kc, self.ns)
            if not p["metadata"].get("deletionTimestamp")
            and any(
                o.get("kind") == kind and o.get("name") == name and o.get("controller")
                for o in p["metadata"].get("ownerReferences") or ()
            )
        )

    def template(self, labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
        """A 2-GPU pod template for gpufence."""
        spec = {
            "schedulerName": self.env.sched,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"limits": {k.GPU: "2"}}}
            ],
        }
        return {"metadata": {"labels": labels, "annotations": annotations}, "spec": spec}

    def surge(self, name: str) -> str:
        """A 2-GPU serving pod; the serving fence is full, so it waits on an incident."""
        return self.env.pod(name, gpus=2, labels=SERVING)

    def events(self, name: str, reason: str) -> list[dict[str, Any]]:
        return [e for e in k.events(self.kc, self.ns, name) if e.get("reason") == reason]


@pytest.fixture
def kubelet(controlled: KubeCluster) -> Iterator[FakeKubelet]:
    with FakeKubelet(controlled.kubeconfig, lease_interval_s=1.0) as kl:
        yield kl


def _fences(
    kc: KubeCluster, kl: FakeKubelet, tmp: Path, serving: int, training: int, serving_nodes: int = 1
) -> Iterator[Fences]:
    f = Fences(kc, kl, tmp, serving, training, serving_nodes)
    try:
        yield f
    finally:
        for p in f.env.procs:
            p.stop()


@pytest.fixture
def incident(controlled: KubeCluster, kubelet: FakeKubelet, tmp_path: Path) -> Iterator[Fences]:
    """The serving fence (2 GPUs) held by sv0; 6 training GPUs."""
    for f in _fences(controlled, kubelet, tmp_path, 2, 6):
        f.env.bound(f.surge("sv0"))
        f.running("sv0")
        yield f


def _gang_of_attempt_2(
    f: Fences, first: list[str], job_id: str, owner: tuple[str, str]
) -> list[str]:
    """After the gang's eviction: its controller's new pods wait (the fence is full) until the
    non-checkpointable ``keep`` goes, then are bound together as the job's attempt 2."""
    again = k.wait(
        "the controller's new pods",
        lambda: (
            (got := [p for p in f.owned_by(*owner) if p not in first]) and len(got) == 2 and got
        ),
        90,
    )
    time.sleep(2)
    assert not any(k.node_of(f.kc, f.ns, p) for p in again), "bound before there was room"
    k.delete_pod(f.kc, f.ns, "keep")
    for p in again:
        f.env.bound(p, 30)
        assert f.annotation(p, JOB) == job_id, p
        assert f.annotation(p, ATTEMPT) == "2", p
    return list(again)


def test_k8s_an_indexed_job_gang_evicted_by_an_incident_comes_back_whole_as_attempt_2(
    incident: Fences,
) -> None:
    f = incident
    gang = {**CKPT, "gpufence.io/gang-name": "train", "gpufence.io/gang-size": "2"}
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {
            "completionMode": "Indexed",
            "completions": 2,
            "parallelism": 2,
            "backoffLimit": 6,
            "template": f.template({"app": "train"}, gang),
        },
    }
    k.ok(f.kc, "POST", f"/apis/batch/v1/namespaces/{f.ns}/jobs", job, 201)
    first = k.wait("the Job's 2 pods", lambda: len(got := f.owned_by("Job", "train")) == 2 and got)
    f.env.pod("keep", gpus=2)
    for p in (*first, "keep"):
        f.env.bound(p)
        f.running(p)
    job_id = f.annotation(first[0], JOB)
    assert job_id and [f.annotation(p, JOB) for p in first] == [job_id, job_id]
    assert [f.annotation(p, ATTEMPT) for p in first] == ["1", "1"]
    sv1 = f.surge("sv1")
    # every member is told (each its own annotation write: rank 1's may land after rank 0's,
    # so it is waited for, before rank 0's ack starts the gang's eviction)
    k.wait("the notice on every member", lambda: all(f.annotation(p, NOTICE) for p in first))
    f.ack(first[0])  # rank 0's word is the gang's
    k.wait(
        "the gang evicted",
        lambda: all(
            f.pod(p).get("metadata", {}).get("deletionTimestamp") or not f.pod(p) for p in first
        ),
        30,
    )
    assert f.env.bound(sv1, 30) == f.training_node
    again = _gang_of_attempt_2(f, first, job_id, ("Job", "train"))
    indexes = sorted(f.annotation(p, "batch.kubernetes.io/job-completion-index") for p in again)
    assert indexes == ["0", "1"]  # all members, each index once


@pytest.fixture
def roomy(controlled: KubeCluster, kubelet: FakeKubelet, tmp_path: Path) -> Iterator[Fences]:
    """A serving fence of 4 GPUs, empty."""
    yield from _fences(controlled, kubelet, tmp_path, 4, 4)


def test_k8s_a_serving_deployment_is_placed_in_the_serving_fence_and_so_is_its_replacement(
    roomy: Fences,
) -> None:
    f = roomy
    rs_name = _deployment(f, 2)
    pods = k.wait("its 2 pods", lambda: len(got := f.owned_by("ReplicaSet", rs_name)) == 2 and got)
    for p in pods:
        assert f.env.bound(p) == f.serving_node, p
        assert f.annotation(p, "gpufence.io/bound-partition") == "serving", p
    k.delete_pod(f.kc, f.ns, pods[0])
    new = k.wait(
        "the ReplicaSet's replacement",
        lambda: [p for p in f.owned_by("ReplicaSet", rs_name) if p not in pods],
        60,
    )[0]
    assert f.env.bound(new, 30) == f.serving_node
    assert f.annotation(new, "gpufence.io/bound-partition") == "serving"
    assert f.annotation(new, ATTEMPT) == "1"  # a replica made anew, not a requeued job
    assert sorted(f.owned_by("ReplicaSet", rs_name)) == sorted([pods[1], new])


def _deployment(f: Fences, replicas: int) -> str:
    """A serving Deployment ``llm`` of 2-GPU pods; the name of its ReplicaSet."""
    tpl = f.template({"app": "llm", **SERVING}, {})
    tpl["spec"].pop("restartPolicy")  # a Deployment's pods restart Always
    deploy = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llm"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "llm"}},
            "template": tpl,
        },
    }
    k.ok(f.kc, "POST", f"/apis/apps/v1/namespaces/{f.ns}/deployments", deploy, 201)
    path = f"/apis/apps/v1/namespaces/{f.ns}/replicasets"
    rs = k.wait("the ReplicaSet", lambda: k.ok(f.kc, "GET", path)["items"])
    return str(rs[0]["metadata"]["name"])


@pytest.fixture
def two_serving(controlled: KubeCluster, kubelet: FakeKubelet, tmp_path: Path) -> Iterator[Fences]:
    """Two serving nodes of 2 GPUs each, empty."""
    yield from _fences(controlled, kubelet, tmp_path, 2, 2, serving_nodes=2)


def test_k8s_a_serving_replica_stopped_by_a_node_failure_comes_back_as_the_same_job(
    two_serving: Fences, kubelet: FakeKubelet
) -> None:
    f = two_serving
    rs_name = _deployment(f, 1)
    first = k.wait("its pod", lambda: f.owned_by("ReplicaSet", rs_name))[0]
    where = f.env.bound(first)
    f.running(first)
    job_id = f.annotation(first, JOB)
    # its node fails: the core stops the job to run it elsewhere (an eviction); the kubelet is
    # dead, so the operator force-deletes the pod, as for any pod of a lost node
    kubelet.set_ready(where, False)
    k.wait(f"{first} evicted", lambda: f.pod(first).get("metadata", {}).get("deletionTimestamp"))
    k.delete_pod(f.kc, f.ns, first)
    new = k.wait("the ReplicaSet's replacement", lambda: f.owned_by("ReplicaSet", rs_name), 60)[0]
    assert new != first
    # on the other serving node: the same serving job, its next attempt
    assert f.env.bound(new, 30) in {f.serving_node, f"{f.env.run}-serving-1"} - {where}
    assert f.annotation(new, "gpufence.io/bound-partition") == "serving"
    assert f.annotation(new, JOB) == job_id
    assert f.annotation(new, ATTEMPT) == "2"


def test_k8s_a_bare_pod_evicted_is_not_made_again_and_its_event_says_its_job_ended_preempted(
    incident: Fences,
) -> None:
    f = incident
    f.env.pod("solo", gpus=2, annotations=CKPT, grace_s=2)
    f.env.pod("keep", gpus=2)
    f.env.pod("keep2", gpus=2)  # the training fence full: the surge must preempt
    for p in ("solo", "keep", "keep2"):
        f.env.bound(p)
        f.running(p)
    sv1 = f.surge("sv1")
    f.ack("solo")
    k.wait("solo gone", lambda: not f.pod("solo"), 30)
    assert f.env.bound(sv1, 30) == f.training_node
    said = k.wait("solo's Preempted event", lambda: f.events("solo", "Preempted"))
    msg = said[0]["message"]
    assert "incident-preemption" in msg, msg
    assert "no controller makes the pod again, so its job ends here, preempted" in msg, msg
    time.sleep(3)
    left = sorted(p["metadata"]["name"] for p in k.pods(f.kc, f.ns))
    assert left == ["keep", "keep2", "sv0", "sv1"], left  # nothing made solo again


def _child_job(f: Fences, jobset: dict[str, Any], index: int, restart: int) -> None:
    """A JobSet's child Job as its controller makes it: ``<jobset>-<replicatedJob>-<i>``,
    owned by the JobSet, the JobSet labels on it and its pods, no retries of its own (a
    failure restarts the JobSet: every child Job is made anew)."""
    name = jobset["metadata"]["name"]
    labels = {
        JOBSET_NAME: name,
        "jobset.sigs.k8s.io/replicatedjob-name": "workers",
        "jobset.sigs.k8s.io/job-index": str(index),
        "jobset.sigs.k8s.io/restart-attempt": str(restart),
    }
    gang = {**CKPT, "gpufence.io/gang-name": name, "gpufence.io/gang-size": "2"}
    owner = {
        "apiVersion": f"{JOBSET_GROUP}/{JOBSET_VERSION}",
        "kind": "JobSet",
        "name": name,
        "uid": jobset["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"{name}-workers-{index}",
            "labels": labels,
            "ownerReferences": [owner],
        },
        "spec": {"backoffLimit": 0, "template": f.template(labels, gang)},
    }
    k.ok(f.kc, "POST", f"/apis/batch/v1/namespaces/{f.ns}/jobs", job, 201)


def _jobset_pods(f: Fences, name: str) -> list[str]:
    return sorted(
        p["metadata"]["name"]
        for p in k.pods(f.kc, f.ns)
        if p["metadata"].get("labels", {}).get(JOBSET_NAME) == name
        and not p["metadata"].get("deletionTimestamp")
    )


def test_k8s_a_jobset_gang_restarted_with_new_child_jobs_is_attempt_2(incident: Fences) -> None:
    f = incident
    body = {
        "apiVersion": f"{JOBSET_GROUP}/{JOBSET_VERSION}",
        "kind": "JobSet",
        "metadata": {"name": "pretrain"},
        "spec": {"replicatedJobs": [{"name": "workers", "replicas": 2}]},
    }
    path = f"/apis/{JOBSET_GROUP}/{JOBSET_VERSION}/namespaces/{f.ns}/jobsets"
    jobset = k.ok(f.kc, "POST", path, body, 201)
    for i in range(2):
        _child_job(f, jobset, i, restart=0)
    first = k.wait(
        "the JobSet's 2 pods", lambda: len(got := _jobset_pods(f, "pretrain")) == 2 and got
    )
    f.env.pod("keep", gpus=2)
    for p in (*first, "keep"):
        f.env.bound(p)
        f.running(p)
    job_id = f.annotation(first[0], JOB)
    sv1 = f.surge("sv1")
    f.ack(first[0])
    k.wait("the gang evicted", lambda: not _jobset_pods(f, "pretrain"), 30)
    assert f.env.bound(sv1, 30) == f.training_node
    # the JobSet restarts: its failed child Jobs are deleted and made anew (new uids)
    for i in range(2):
        job_path = f"/apis/batch/v1/namespaces/{f.ns}/jobs/pretrain-workers-{i}"
        k.ok(f.kc, "DELETE", f"{job_path}?propagationPolicy=Background")
        k.wait(f"child Job {i} gone", lambda p=job_path: f.kc.request("GET", p)[0] == 404, 30)
    for i in range(2):
        _child_job(f, jobset, i, restart=1)
    again = k.wait(
        "the new child Jobs' pods",
        lambda: len(got := [p for p in _jobset_pods(f, "pretrain") if p not in first]) == 2 and got,
        60,
    )
    time.sleep(2)
    assert not any(k.node_of(f.kc, f.ns, p) for p in again), "bound before there was room"
    k.delete_pod(f.kc, f.ns, "keep")
    for p in again:
        f.env.bound(p, 30)
        assert f.annotation(p, JOB) == job_id, p
        assert f.annotation(p, ATTEMPT) == "2", p


def _job_status(f: Fences, name: str) -> dict[str, Any]:
    got = k.ok(f.kc, "GET", f"/apis/batch/v1/namespaces/{f.ns}/jobs/{name}")
    return dict(got.get("status") or {})


def test_k8s_a_job_failed_by_its_eviction_makes_no_attempt_2_and_its_held_job_is_cancelled(
    incident: Fences,
) -> None:
    """``backoffLimit: 0`` and no ``podFailurePolicy``: the Job controller counts the eviction
    as a failure and fails the Job, which then makes no new pod; gpufence cancels the requeued
    job instead of holding it (counted pending, kept in the state record) forever."""
    f = incident
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "once"},
        "spec": {"backoffLimit": 0, "template": f.template({"app": "once"}, CKPT)},
    }
    k.ok(f.kc, "POST", f"/apis/batch/v1/namespaces/{f.ns}/jobs", job, 201)
    first = k.wait("the Job's pod", lambda: f.owned_by("Job", "once"))[0]
    f.env.pod("keep", gpus=2)
    f.env.pod("keep2", gpus=2)  # the training fence full: the surge must preempt
    for p in (first, "keep", "keep2"):
        f.env.bound(p)
        f.running(p)
    sv1 = f.surge("sv1")
    f.ack(first)
    assert f.env.bound(sv1, 30) == f.training_node
    k.wait(
        "the Job failed",
        lambda: any(
            c.get("type") == "Failed" and c.get("status") == "True"
            for c in _job_status(f, "once").get("conditions") or ()
        ),
        60,
    )
    proc = f.env.procs[0]
    said = k.wait(
        "the held job cancelled, and why",
        lambda: [ln for ln in proc.log_path_text().splitlines() if "its controller Job/" in ln],
        60,
    )
    assert said[0].endswith(" is failed (BackoffLimitExceeded); cancelled"), said
    research = 'gpufence_queue_pending_jobs{partition="training",queue="research"} 0.0'
    k.wait("its queue with nothing pending", lambda: research in proc.get("/metrics"), 10)
    lease = f"/apis/coordination.k8s.io/v1/namespaces/{f.ns}/leases/gpufence-scheduler-state"
    k.wait(
        "the state record no longer carrying it",
        lambda: (
            "Job/"
            not in (k.ok(f.kc, "GET", lease)["metadata"].get("annotations") or {}).get(
                "gpufence.io/requeued", ""
            )
        ),
        30,
    )
    assert f.owned_by("Job", "once") == []  # and indeed no attempt 2 was made


def test_k8s_the_owner_check_reads_controllers_gone_or_done_from_the_api_server(
    controlled: KubeCluster,
) -> None:
    from gpufence.kube.api import KubeApi
    from gpufence.kube.owners import OwnerCheck

    kc = controlled
    ns = k.namespace(kc, f"own-{secrets.token_hex(3)}")
    api = KubeApi(str(kc.kubeconfig))
    check = OwnerCheck(api, every_s=0.0, grace_s=0.0)
    tpl = {
        "metadata": {"labels": {"app": "x"}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "m", "image": "busybox"}]},
    }
    job = {"metadata": {"name": "j"}, "spec": {"suspend": True, "template": tpl}}
    made = k.ok(kc, "POST", f"/apis/batch/v1/namespaces/{ns}/jobs", job, 201)
    tpl_rs = {**tpl, "spec": {**tpl["spec"], "restartPolicy": "Always"}}
    rs = {
        "metadata": {"name": "rs"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "x"}}, "template": tpl_rs},
    }
    made_rs = k.ok(kc, "POST", f"/apis/apps/v1/namespaces/{ns}/replicasets", rs, 201)
    jobset = {
        "apiVersion": f"{JOBSET_GROUP}/{JOBSET_VERSION}",
        "kind": "JobSet",
        "metadata": {"name": "js"},
        "spec": {},
    }
    k.ok(kc, "POST", f"/apis/{JOBSET_GROUP}/{JOBSET_VERSION}/namespaces/{ns}/jobsets", jobset, 201)
    job_owner, rs_owner = (
        f"Job/{made['metadata']['uid']}",
        f"ReplicaSet/{made_rs['metadata']['uid']}",
    )
    awaiting = {
        job_owner: (f"{ns}/a", 2),
        rs_owner: (f"{ns}/b", 2),
        f"JobSet/{ns}/js": (f"{ns}/c", 2),
        f"JobSet/{ns}/gone": (f"{ns}/d", 2),
        "Job/00000000-0000-0000-0000-000000000000": (f"{ns}/e", 2),
        "Widget/123": (f"{ns}/f", 2),  # a kind gpufence does not know: left alone
    }
    assert check.gone(awaiting, 100.0) == {
        rs_owner: "scaled to 0 replicas",
        f"JobSet/{ns}/gone": "deleted",
        "Job/00000000-0000-0000-0000-000000000000": "deleted",
    }
    k.ok(kc, "DELETE", f"/apis/batch/v1/namespaces/{ns}/jobs/j", None)
    try:
        k.wait("the Job gone", lambda: job_owner in check.gone(awaiting, 200.0), 30)
    finally:
        api.close()
