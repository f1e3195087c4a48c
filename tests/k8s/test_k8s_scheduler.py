"""gpufence as a secondary scheduler on a real kube-apiserver: binds, gangs, fences, pending
reasons, rejections, restarts and foreign capacity -- observed only through the API server.

Each test gets its own scheduler name and its own nodes (selected by a label unique to the
test), so the tests share one API server without seeing each other's work.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import kobjects as k
import pytest
from cluster import KubeCluster
from scheduler_proc import SchedulerProc

FENCED = """
name: k8s-test
kubernetes: {{scheduler_name: {sched}}}
partitions:
  serving:
    node_selector: {{test.gpufence.io/run: {run}, gpufence.io/fence: serving}}
    admits: [serving]
  training:
    node_selector: {{test.gpufence.io/run: {run}, gpufence.io/fence: training}}
    admits: [training, batch]
queues:
  - {{name: online, partition: serving, tenant: ns-{run}}}
  - {{name: research, partition: training, tenant: ns-{run}}}
"""


@dataclass
class Env:
    kc: KubeCluster
    ns: str
    run: str
    sched: str
    config: Path
    tmp: Path
    procs: list[SchedulerProc]

    def node(self, fence: str = "training", gpus: int = 8, **kw: object) -> str:
        labels = {"test.gpufence.io/run": self.run, "gpufence.io/fence": fence}
        return k.gpu_node(
            self.kc, f"{self.run}-{fence}-{secrets.token_hex(2)}", gpus=gpus, labels=labels, **kw
        )  # type: ignore[arg-type]

    def pod(self, name: str | None = None, **kw: object) -> str:
        return k.pod(self.kc, self.ns, name, scheduler=self.sched, **kw)  # type: ignore[arg-type]

    def start(self, **kw: object) -> SchedulerProc:
        p = SchedulerProc(
            self.kc.kubeconfig, self.config, self.tmp / f"sched-{len(self.procs)}.log", **kw
        )  # type: ignore[arg-type]
        self.procs.append(p)
        return p

    def bound(self, pod: str, timeout: float = 20.0) -> str:
        return str(k.wait(f"{pod} bound", lambda: k.node_of(self.kc, self.ns, pod), timeout))


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


def _note(p: dict[str, object]) -> dict[str, str]:
    return dict(p["metadata"].get("annotations") or {})  # type: ignore[union-attr]


def test_k8s_binds_a_pod_with_its_placement_note(env: Env) -> None:
    node = env.node("training")
    env.start().wait_ready()
    pod = env.pod(gpus=2)
    assert env.bound(pod) == node
    ann = _note(k.get_pod(env.kc, env.ns, pod))
    plan = json.loads(ann["gpufence.io/gang-plan"])
    assert [m["node"] for m in plan] == [node]
    assert len(plan[0]["gpus"]) == 2
    assert ann["gpufence.io/bound-partition"] == "training"


def test_k8s_gang_is_bound_whole_or_not_at_all(env: Env) -> None:
    env.node("training", gpus=4)
    env.node("training", gpus=4)
    s = env.start()
    s.wait_ready()
    members = [
        env.pod(
            f"g-{i}",
            gpus=2,
            annotations={"gpufence.io/gang-name": "g", "gpufence.io/gang-size": "4"},
        )
        for i in range(3)
    ]
    # three of four: nothing is bound, and each pod says why
    cond = k.wait(
        "a waiting reason", lambda: k.scheduled_condition(k.get_pod(env.kc, env.ns, members[0]))
    )
    assert "3 of 4" in cond["message"]
    assert all(not k.node_of(env.kc, env.ns, m) for m in members)
    members.append(
        env.pod(
            "g-3", gpus=2, annotations={"gpufence.io/gang-name": "g", "gpufence.io/gang-size": "4"}
        )
    )
    nodes = [env.bound(m) for m in members]
    assert len(set(nodes)) == 2  # 8 GPUs over two 4-GPU nodes


def test_k8s_fences_keep_serving_and_training_apart(env: Env) -> None:
    serving = env.node("serving", gpus=2)
    training = env.node("training", gpus=2)
    env.start().wait_ready()
    s = env.pod(gpus=1, labels={"gpufence.io/class": "serving"})
    t = env.pod(gpus=2)
    assert env.bound(s) == serving
    assert env.bound(t) == training
    # the training fence is full: another training pod waits although serving has a free GPU
    waiting = env.pod(gpus=1)
    cond = k.wait(
        "a pending reason", lambda: k.scheduled_condition(k.get_pod(env.kc, env.ns, waiting))
    )
    assert cond["status"] == "False" and cond["reason"] == "Unschedulable", cond
    assert not k.node_of(env.kc, env.ns, waiting)
    evs = k.wait(
        "a FailedScheduling event",
        lambda: [e for e in k.events(env.kc, env.ns, waiting) if e["reason"] == "FailedScheduling"],
    )
    assert evs[0]["message"] == cond["message"]


def test_k8s_bad_annotation_is_rejected_naming_the_key(env: Env) -> None:
    env.node("training")
    env.start().wait_ready()
    bad = env.pod(annotations={"gpufence.io/priority": "high"})
    cond = k.wait("a rejection", lambda: k.scheduled_condition(k.get_pod(env.kc, env.ns, bad)))
    assert cond["reason"] == "gpufence/Rejected"
    assert "gpufence.io/priority" in cond["message"] and "integer" in cond["message"]
    assert not k.node_of(env.kc, env.ns, bad)


def test_k8s_finished_pod_frees_its_gpus(env: Env) -> None:
    env.node("training", gpus=2)
    env.start().wait_ready()
    first = env.pod(gpus=2)
    env.bound(first)
    second = env.pod(gpus=2)
    k.wait(
        "second pending with a reason",
        lambda: k.scheduled_condition(k.get_pod(env.kc, env.ns, second)),
    )
    k.set_phase(env.kc, env.ns, first, "Succeeded")
    env.bound(second)


def test_k8s_foreign_pods_capacity_is_not_booked_twice(env: Env) -> None:
    node = env.node("training", gpus=4)
    # a pod kube-scheduler (or anyone) bound there first, holding 3 GPUs
    foreign = k.pod(env.kc, env.ns, gpus=3, scheduler="default-scheduler")
    k.ok(
        env.kc,
        "POST",
        f"/api/v1/namespaces/{env.ns}/pods/{foreign}/binding",
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": foreign},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        },
        201,
    )
    env.start().wait_ready()
    two = env.pod(gpus=2)
    k.wait("a pending reason", lambda: k.scheduled_condition(k.get_pod(env.kc, env.ns, two)))
    one = env.pod(gpus=1)
    assert env.bound(one) == node
    assert not k.node_of(env.kc, env.ns, two)


def test_k8s_kill_9_loses_nothing_and_binds_nothing_twice(env: Env) -> None:
    env.node("training", gpus=4)
    s = env.start()
    s.wait_ready()
    a, b = env.pod(gpus=2), env.pod(gpus=2)
    env.bound(a), env.bound(b)
    s.kill()
    c = env.pod(gpus=2)  # arrives while no scheduler runs
    s2 = env.start()
    s2.wait_ready()
    # a and b still hold the node: c must wait, not be bound onto their GPUs
    k.wait("c's pending reason", lambda: k.scheduled_condition(k.get_pod(env.kc, env.ns, c)))
    assert not k.node_of(env.kc, env.ns, c)
    k.set_phase(env.kc, env.ns, a, "Succeeded")
    env.bound(c)
    plans = [
        json.loads(_note(k.get_pod(env.kc, env.ns, p))["gpufence.io/gang-plan"])[0]["gpus"]
        for p in (b, c)
    ]
    assert not set(plans[0]) & set(plans[1]), plans


def test_k8s_half_bound_gang_is_rolled_forward_after_a_crash(env: Env) -> None:
    node = env.node("training", gpus=4)
    ann = {"gpufence.io/gang-name": "h", "gpufence.io/gang-size": "2"}
    members = [env.pod(f"h-{i}", gpus=2, annotations=ann) for i in range(2)]
    # what a scheduler killed between the two binds leaves behind: one member bound, with the
    # gang's plan in its note
    plan = [
        {"pod": "h-0", "node": node, "gpus": [0, 1]},
        {"pod": "h-1", "node": node, "gpus": [2, 3]},
    ]
    note = {
        "gpufence.io/job": f"{env.ns}/@h",
        "gpufence.io/bound-partition": "training",
        "gpufence.io/attempt": "1",
        "gpufence.io/bound-at": "1000.0",
        "gpufence.io/gang-plan": json.dumps(plan),
    }
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "h-0", "annotations": note},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    k.ok(env.kc, "POST", f"/api/v1/namespaces/{env.ns}/pods/h-0/binding", binding, 201)
    env.start().wait_ready()
    assert env.bound(members[1]) == node
    got = json.loads(_note(k.get_pod(env.kc, env.ns, "h-1"))["gpufence.io/gang-plan"])
    assert got == plan


def test_k8s_standby_takes_over_when_the_leader_dies(env: Env) -> None:
    env.node("training", gpus=8)
    lease = ["--lease-namespace", env.ns, "--lease-name", "gpufence"]
    first = env.start(leader_elect=True, identity="first", extra=lease)
    first.wait_ready()
    second = env.start(leader_elect=True, identity="second", extra=lease)
    code, text = k.wait("the standby answering", lambda: (c := second.readyz())[0] and c)
    assert code == 503 and "first" in text
    first.kill()
    second.wait_ready(timeout=30)
    pod = env.pod(gpus=1)
    env.bound(pod)
    assert "gpufence_k8s_leader 1.0" in second.get("/metrics")
