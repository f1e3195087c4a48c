"""Lending and reclaim on Kubernetes, through the real API server (fake kubelets finish the
evicted pods): the serving fence lends its idle GPUs to checkpointable pods of the partitions
its lending rule names, up to the rule's cap; a serving surge takes back the fewest lent pods
that cover it, through the same notice -> checkpoint ack -> eviction path as an incident.

The API writes are read back in order from a watch on the test's namespace (``WriteLog``), so
the sequence -- notice on exactly the pods the core names, their eviction, the serving pod's
bind -- is asserted as the API server saw it.
"""

from __future__ import annotations

import http.client
import json
import secrets
import ssl
import threading
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

LENDING = """
name: k8s-lending
kubernetes: {{scheduler_name: {sched}}}
partitions:
  serving:
    node_selector: {{test.gpufence.io/run: {run}, gpufence.io/fence: serving}}
    admits: [serving]
    lending: [{{to: [training], cap_gpus: {cap}, reclaim_deadline_s: {deadline},
                checkpointable_only: true}}]
  training:
    node_selector: {{test.gpufence.io/run: {run}, gpufence.io/fence: training}}
    admits: [training, batch]
  desks:
    node_selector: {{test.gpufence.io/run: {run}, gpufence.io/fence: desks}}
    admits: [interactive]
queues:
  - {{name: online, partition: serving, tenant: ns-{run}}}
  - {{name: research, partition: training, tenant: ns-{run}}}
  - {{name: desk, partition: desks, tenant: ns-{run}}}
"""
NOTICE, ACK, LENT_FROM = "gpufence.io/notice", "gpufence.io/checkpointed", "gpufence.io/lent-from"
SERVING = {"gpufence.io/class": "serving"}
CKPT = {"gpufence.io/checkpointable": "true"}
MERGE = "application/merge-patch+json"


class WriteLog:
    """What happened to the namespace's pods, in the API server's order, read from a watch:
    ``("notice", pod)`` when a notice annotation appears, ``("evict", pod)`` when the Eviction
    API marks it (the DisruptionTarget condition only an eviction sets), ``("delete", pod)``
    when it is marked for deletion, ``("bind", pod)`` when it gets a node."""

    def __init__(self, kc: KubeCluster, ns: str) -> None:
        self.kc, self.ns = kc, ns
        self.writes: list[tuple[str, str]] = []
        self._seen: dict[str, tuple[str, str, bool, bool]] = {}
        self._stop = threading.Event()
        listed = k.ok(kc, "GET", f"/api/v1/namespaces/{ns}/pods")
        for p in listed["items"]:
            self._see(p)
        self._rv = listed["metadata"]["resourceVersion"]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _see(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        now = (
            (meta.get("annotations") or {}).get(NOTICE, ""),
            pod["spec"].get("nodeName", ""),
            any(
                c.get("type") == "DisruptionTarget"
                for c in (pod.get("status") or {}).get("conditions") or ()
            ),
            bool(meta.get("deletionTimestamp")),
        )
        old = self._seen.get(meta["name"], ("", "", False, False))
        self._seen[meta["name"]] = now
        for i, what in enumerate(("notice", "bind", "evict", "delete")):
            if now[i] and not old[i]:
                self.writes.append((what, meta["name"]))

    def _run(self) -> None:
        ctx = ssl.create_default_context(cafile=str(self.kc.ca_file))
        conn = http.client.HTTPSConnection("127.0.0.1", self.kc.port, context=ctx, timeout=600)
        path = f"/api/v1/namespaces/{self.ns}/pods?watch=1&resourceVersion={self._rv}"
        conn.request("GET", path, headers={"Authorization": f"Bearer {self.kc.admin_token}"})
        resp = conn.getresponse()
        try:
            while not self._stop.is_set():
                line = resp.readline()
                if not line:
                    return
                event = json.loads(line)
                if event.get("type") in ("ADDED", "MODIFIED"):
                    self._see(event["object"])
        except (OSError, ValueError):
            return
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()

    def mark(self, *bound: str) -> int:
        """Where the next writes start, once the watch has seen ``bound``'s binds (the caller saw
        them by polling; the watch may lag, and a bind it showed later would count as new)."""
        for pod in bound:
            self.seen(("bind", pod))
        return len(self.writes)

    def since(self, mark: int, pods: set[str]) -> list[tuple[str, str]]:
        """The writes to ``pods`` after ``mark`` (see ``seen``: wait for the last first)."""
        return [w for w in self.writes[mark:] if w[1] in pods]

    def seen(self, write: tuple[str, str], timeout: float = 10.0) -> None:
        """Wait until the watch saw ``write`` (what the caller already saw by polling)."""
        k.wait(f"the watch to see {write}", lambda: write in self.writes, timeout)


@pytest.fixture
def kubelet(k8s_cluster: KubeCluster) -> Iterator[FakeKubelet]:
    with FakeKubelet(k8s_cluster.kubeconfig, lease_interval_s=1.0) as kl:
        yield kl


class Fences:
    """A serving fence of one ``serving_gpus`` node lending to training (``cap``), a training
    fence of one 1-GPU node held by ``hold`` (not checkpointable), and a fence of interactive
    desks (one 1-GPU node held by ``desk``) that serving does not lend to."""

    def __init__(
        self,
        kc: KubeCluster,
        kubelet: FakeKubelet,
        tmp: Path,
        *,
        cap: int,
        deadline: float,
        serving_gpus: int = 4,
    ) -> None:
        run = f"r{secrets.token_hex(3)}"
        sched = f"gpufence-{run}"
        config = tmp / "cluster.yaml"
        config.write_text(LENDING.format(run=run, sched=sched, cap=cap, deadline=deadline))
        self.env = Env(kc, k.namespace(kc, f"ns-{run}"), run, sched, config, tmp, [])
        self.kc, self.ns, self.run = kc, self.env.ns, run
        for fence, gpus in (("serving", serving_gpus), ("training", 1), ("desks", 1)):
            labels = {"test.gpufence.io/run": run, "gpufence.io/fence": fence}
            kubelet.add_nodes([FakeNode(f"{run}-{fence}", gpus=gpus, labels=labels)])
            # (the not-ready taint is lifted here too, as in test_k8s_incident)
            node_path = f"/api/v1/nodes/{run}-{fence}"
            k.ok(kc, "PATCH", node_path, {"spec": {"taints": None}}, content_type=MERGE)
        self.log = WriteLog(kc, self.ns)
        s = self.env.start(extra=["--lease-namespace", self.ns])
        s.wait_ready()
        self.hold = self.env.pod("hold", gpus=1)
        assert self.env.bound(self.hold) == f"{run}-training"
        self.desk = self.env.pod("desk", gpus=1, labels={"gpufence.io/class": "interactive"})
        assert self.env.bound(self.desk) == f"{run}-desks"

    def close(self) -> None:
        self.log.close()
        for p in self.env.procs:
            p.stop()

    def borrower(self, name: str, priority: int, **kw: Any) -> str:
        ann = {**CKPT, "gpufence.io/priority": str(priority)}
        return self.env.pod(name, gpus=1, annotations=ann, grace_s=2, **kw)

    def annotation(self, name: str, key: str) -> str:
        got = k.get_pod_or_none(self.kc, self.ns, name)
        return str(((got or {}).get("metadata") or {}).get("annotations", {}).get(key, ""))

    def reason(self, name: str) -> str:
        cond = k.scheduled_condition(k.get_pod(self.kc, self.ns, name)) or {}
        return str(cond.get("message", "")) if cond.get("status") == "False" else ""

    def ack(self, name: str) -> None:
        value = self.annotation(name, NOTICE)
        assert value, f"{name} has no notice to acknowledge"
        patch = {"metadata": {"annotations": {ACK: value}}}
        path = f"/api/v1/namespaces/{self.ns}/pods/{name}"
        k.ok(self.kc, "PATCH", path, patch, content_type=MERGE)

    def terminating(self, name: str) -> bool:
        got = k.get_pod_or_none(self.kc, self.ns, name)
        return got is None or bool(got["metadata"].get("deletionTimestamp"))


@pytest.fixture
def lent(k8s_cluster: KubeCluster, kubelet: FakeKubelet, tmp_path: Path) -> Iterator[Fences]:
    f = Fences(k8s_cluster, kubelet, tmp_path, cap=3, deadline=120)
    try:
        yield f
    finally:
        f.close()


def _notice(value: str) -> tuple[str, float]:
    reason, deadline = value.split(" ")
    return reason, float(deadline)


def test_k8s_serving_lends_idle_gpus_to_checkpointable_borrowers_up_to_its_cap(
    lent: Fences,
) -> None:
    f = lent
    serving_node = f"{f.run}-serving"
    b = [f.borrower(f"b{i}", priority=0 if i == 1 else 5) for i in (1, 2, 3)]
    for pod in b:
        assert f.env.bound(pod) == serving_node, pod
        assert f.annotation(pod, LENT_FROM) == "serving"
        assert f.annotation(pod, "gpufence.io/bound-partition") == "serving"
    # a fourth checkpointable borrower: the cap (3) is reached, one GPU of serving stays idle
    b4 = f.borrower("b4", priority=5)
    # a borrower that does not checkpoint is never lent anything
    plain = f.env.pod("plain", gpus=1, annotations={"gpufence.io/priority": "5"})
    # nor is a checkpointable pod of a fence the rule does not name
    other = f.env.pod(
        "other", gpus=1, labels={"gpufence.io/class": "interactive"}, annotations=CKPT
    )
    why4 = k.wait("b4's reason", lambda: f.reason(b4))
    why_plain = k.wait("plain's reason", lambda: f.reason(plain))
    why_other = k.wait("other's reason", lambda: f.reason(other))
    assert not any(k.node_of(f.kc, f.ns, p) for p in (b4, plain, other))
    assert why_other == "no-fit: needs 1 free GPU, partition desks has 0 free", why_other
    cap = "serving lends 3 of its 4 idle GPUs (cap 3) to training: no more may be lent"
    assert cap in why4, why4
    assert "to checkpointable jobs only" in why_plain, why_plain


def test_k8s_a_serving_surge_reclaims_the_fewest_lent_pods_that_cover_it(lent: Fences) -> None:
    f = lent
    serving_node = f"{f.run}-serving"
    b = [f.borrower(f"b{i}", priority=0 if i == 1 else 5) for i in (1, 2, 3)]
    for pod in b:
        assert f.env.bound(pod) == serving_node, pod
    mark = f.log.mark(*b)
    # 1 GPU of serving is idle: a 2-GPU replica needs one lent GPU back -- b1 (lowest priority)
    sv1 = f.env.pod("sv1", gpus=2, labels=SERVING)
    value = k.wait("the notice on b1", lambda: f.annotation("b1", NOTICE))
    reason, deadline = _notice(value)
    assert reason == "lent-reclaim" and abs(deadline - (time.time() + 120)) < 15, value
    told = k.wait("sv1's reason", lambda: "checkpoint" in (r := f.reason(sv1)) and r)
    assert f"waiting for {f.ns}/b1 to checkpoint, deadline in " in told, told
    reclaim = f"waiting-for-preemption: reclaiming 1 lent GPU of serving from {f.ns}/b1; "
    assert told.startswith(reclaim), told
    assert not f.terminating("b1")  # nothing is stopped before the checkpoint
    f.ack("b1")
    assert f.env.bound(sv1, 30) == serving_node
    f.log.seen(("bind", sv1))
    everyone = {*b, sv1}
    assert f.log.since(mark, everyone) == [
        ("notice", "b1"),
        ("evict", "b1"),
        ("delete", "b1"),
        ("bind", sv1),
    ]
    for pod in b[1:]:
        assert not f.annotation(pod, NOTICE), pod
        assert not f.terminating(pod), pod


@pytest.fixture
def short(k8s_cluster: KubeCluster, kubelet: FakeKubelet, tmp_path: Path) -> Iterator[Fences]:
    f = Fences(k8s_cluster, kubelet, tmp_path, cap=2, deadline=6, serving_gpus=2)
    try:
        yield f
    finally:
        f.close()


def test_k8s_a_borrower_that_never_acks_is_evicted_at_the_lending_rules_deadline(
    short: Fences,
) -> None:
    f = short
    b1 = f.borrower("b1", priority=0)
    assert f.env.bound(b1) == f"{f.run}-serving"
    mark = f.log.mark(b1)
    sv1 = f.env.pod("sv1", gpus=2, labels=SERVING)
    value = k.wait("the notice on b1", lambda: f.annotation(b1, NOTICE))
    noticed = time.time()
    _, deadline = _notice(value)
    assert abs(deadline - (noticed + 6)) < 3, value
    k.wait("b1 evicted", lambda: f.terminating(b1), 30)
    assert time.time() >= deadline - 1  # not before its deadline, without an ack
    f.env.bound(sv1, 30)
    f.log.seen(("bind", sv1))
    writes = [("notice", b1), ("evict", b1), ("delete", b1), ("bind", sv1)]
    assert f.log.since(mark, {b1, sv1}) == writes
