"""An incident budget on the real API server: ``budget: 2`` in an hour lets two serving surges
preempt (a notice, the ack, an eviction each) and stops the third -- it waits, its reason says
the budget is spent, and the scheduler writes nothing to the pod it would have noticed. The
scheduler runs as its own user and the API server's audit log (tests/k8s/audit.py) is the
record of exactly what it wrote."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import audit
import kobjects as k
import pytest
from cluster import KubeCluster
from fake_objects import FakeNode
from kubelet import FakeKubelet
from scheduler_proc import SchedulerProc

CONFIG = """
name: k8s-budget
kubernetes: {{scheduler_name: {sched}}}
partitions:
  serving:
    node_selector: {{test.gpufence.io/run: {run}, gpufence.io/fence: serving}}
    admits: [serving]
    preemption: {{mode: incident-only, from: [training], budget: 2, window_s: 3600,
                 min_runtime_s: 0, grace_s: 120}}
  training:
    node_selector: {{test.gpufence.io/run: {run}, gpufence.io/fence: training}}
    admits: [training, batch]
queues:
  - {{name: online, partition: serving, tenant: {ns}}}
  - {{name: research, partition: training, tenant: {ns}}}
"""
NOTICE, ACK = "gpufence.io/notice", "gpufence.io/checkpointed"
SERVING = {"gpufence.io/class": "serving"}
MERGE = "application/merge-patch+json"


@pytest.fixture(scope="module")
def audited(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    """An API server of this module's own that logs gpufence-scheduler's writes."""
    work = tmp_path_factory.mktemp("k8s-budget")
    kc = KubeCluster(k8s_bin_dir, work, extra_apiserver_args=audit.apiserver_args(work))
    kc.start()
    try:
        audit.grant_scheduler(kc)
        yield kc
    finally:
        kc.close()


class Fence:
    """A serving node of 2 GPUs held by sv0; a training node of 6 GPUs held by three
    checkpointable pods, ck1 the core's first victim (lowest priority), then ck2, then ck3."""

    def __init__(self, kc: KubeCluster, kubelet: FakeKubelet, tmp: Path) -> None:
        self.kc, self.run = kc, f"b{secrets.token_hex(3)}"
        self.ns, self.sched = k.namespace(kc, f"ns-{self.run}"), f"gpufence-{self.run}"
        for fence, gpus in (("serving", 2), ("training", 6)):
            labels = {"test.gpufence.io/run": self.run, "gpufence.io/fence": fence}
            kubelet.add_nodes([FakeNode(f"{self.run}-{fence}", gpus=gpus, labels=labels)])
            path = f"/api/v1/nodes/{self.run}-{fence}"
            k.ok(kc, "PATCH", path, {"spec": {"taints": None}}, content_type=MERGE)
        config = tmp / "cluster.yaml"
        config.write_text(CONFIG.format(run=self.run, sched=self.sched, ns=self.ns))
        extra = ["--lease-namespace", self.ns]
        self.proc = SchedulerProc(
            kc.gpufence_scheduler_kubeconfig, config, tmp / "sched.log", extra=extra
        )
        self.proc.wait_ready()
        self.pod("sv0", labels=SERVING)
        for prio in range(3):
            ann = {"gpufence.io/checkpointable": "true", "gpufence.io/priority": str(prio)}
            self.pod(f"ck{prio + 1}", annotations=ann, grace_s=1)
        for p in ("sv0", "ck1", "ck2", "ck3"):
            k.wait(
                f"{p} Running", lambda p=p: self.get(p).get("status", {}).get("phase") == "Running"
            )

    def pod(self, name: str, **kw: Any) -> str:
        return k.pod(self.kc, self.ns, name, gpus=2, scheduler=self.sched, **kw)

    def get(self, name: str) -> dict[str, Any]:
        return k.get_pod_or_none(self.kc, self.ns, name) or {}

    def annotation(self, name: str, key: str) -> str:
        return str((self.get(name).get("metadata") or {}).get("annotations", {}).get(key, ""))

    def reason(self, name: str) -> str:
        cond = k.scheduled_condition(self.get(name)) or {}
        return str(cond.get("message", "")) if cond.get("status") == "False" else ""

    def surge(self, sv: str, victim: str) -> list[audit.Write]:
        """A serving pod the full fence cannot hold, answered by preempting ``victim``: the
        scheduler's writes from the surge to the serving pod's bind."""
        before = len(audit.writes(self.kc, self.ns))
        self.pod(sv, labels=SERVING)
        value = k.wait(f"the notice on {victim}", lambda: self.annotation(victim, NOTICE))
        patch = {"metadata": {"annotations": {ACK: value}}}
        path = f"/api/v1/namespaces/{self.ns}/pods/{victim}"
        k.ok(self.kc, "PATCH", path, patch, content_type=MERGE)
        k.wait(f"{victim} gone", lambda: not self.get(victim), 30)
        assert k.wait(f"{sv} bound", lambda: k.node_of(self.kc, self.ns, sv), 30)
        k.wait(f"{sv} Running", lambda: self.get(sv).get("status", {}).get("phase") == "Running")
        return audit.writes(self.kc, self.ns)[before:]


@pytest.fixture
def fence(audited: KubeCluster, tmp_path: Path) -> Iterator[Fence]:
    with FakeKubelet(audited.kubeconfig, lease_interval_s=1.0) as kl:
        f = Fence(audited, kl, tmp_path)
        try:
            yield f
        finally:
            f.proc.stop()


def _on(writes: list[audit.Write], pod: str) -> list[str]:
    """The writes that touch ``pod`` -- on the pod itself, or an Event about it (with its
    reason) -- as ``"verb resource [reason]"``, sorted (Events and the eviction race)."""
    out = []
    for w in writes:
        body = w.body or {}
        about = body.get("involvedObject", {}).get("name") if w.resource == "events" else ""
        if w.name == pod or about == pod:
            out.append(f"{w.verb} {w.resource} {body.get('reason', '')}".strip())
    return sorted(out)


def test_k8s_a_budget_of_2_in_an_hour_stops_the_third_preemption(fence: Fence) -> None:
    victim_writes = [
        "create events Notice",
        "create events Preempted",
        "create pods/eviction",
        "patch pods",  # the notice
    ]
    for n in (1, 2):
        wrote = fence.surge(f"sv{n}", f"ck{n}")
        log = "\n".join(map(str, wrote))
        assert _on(wrote, f"ck{n}") == victim_writes, log
        notice = next(w for w in wrote if w.name == f"ck{n}" and w.resource == "pods")
        assert set(notice.body["metadata"]["annotations"]) == {NOTICE}, notice.body
        assert [w.name for w in wrote if w.resource == "pods/binding"] == [f"sv{n}"], log
        others = [f"ck{m}" for m in (1, 2, 3) if m != n]
        assert not [w for m in others for w in _on(wrote, m)], log
    before = len(audit.writes(fence.kc, fence.ns))
    fence.pod("sv3", labels=SERVING)
    why = k.wait("sv3's reason", lambda: "budget" in (r := fence.reason("sv3")) and r)
    assert "incident preemption budget spent (2 of 2 in 3600 s)" in why, why
    # the reason's Event is written after the condition the test just read: wait for it, so
    # that the sleep below is only the "nothing else happens" window
    k.wait(
        "sv3's FailedScheduling event in the audit log",
        lambda: (
            "create events FailedScheduling"
            in _on(audit.writes(fence.kc, fence.ns)[before:], "sv3")
        ),
    )
    time.sleep(3)  # a notice or an eviction would have been written by now
    wrote = audit.writes(fence.kc, fence.ns)[before:]
    log = "\n".join(map(str, wrote))
    # the state record may be rewritten meanwhile (fair share, every 30 s): with the same two
    # budget slots, never a third
    leases = [w for w in wrote if w.resource == "leases"]
    for w in leases:
        slots = json.loads(w.body["metadata"]["annotations"]["gpufence.io/preemptions"])
        assert len(slots["serving"]) == 2, slots
    # the third surge's only other writes: sv3's reason (its condition and an Event) --
    # nothing on ck3, no eviction, no bind
    rest = [w for w in wrote if w.resource != "leases"]
    assert _on(rest, "sv3") == ["create events FailedScheduling", "patch pods/status"], log
    # a reason of the earlier surges' pods (their waits, rate-limited) may land late on a
    # loaded machine; any other write -- a notice, an eviction, a bind -- is the failure
    late = [x for p in ("sv1", "sv2") for x in _on(rest, p)]
    assert set(late) <= {"create events FailedScheduling", "patch pods/status"}, log
    assert len(rest) == 2 + len(late), log
    assert not fence.annotation("ck3", NOTICE)
    assert not k.node_of(fence.kc, fence.ns, "sv3")
    assert fence.get("ck3")["status"]["phase"] == "Running"
