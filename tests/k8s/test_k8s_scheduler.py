"""gpufence as a secondary scheduler on a real kube-apiserver: binds, gangs, fences, pending
reasons, rejections, restarts and foreign capacity -- observed only through the API server.

Each test gets its own scheduler name and its own nodes (selected by a label unique to the
test), so the tests share one API server without seeing each other's work.
"""

from __future__ import annotations

import json
from pathlib import Path

import kobjects as k
from kenv import Env
from scheduler_proc import SchedulerProc


def _note(p: dict[str, object]) -> dict[str, str]:
    return dict(p["metadata"].get("annotations") or {})  # type: ignore[union-attr]


def _capacity(s: SchedulerProc, fence: str) -> float | None:
    """The GPUs the scheduler's model gives ``fence`` (/v1/fences): what foreign usage left."""
    rows = json.loads(s.get("/v1/fences"))["fences"]
    return next((float(r["capacity_gpus"]) for r in rows if r["name"] == fence), None)


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
    assert ann["gpufence.io/gpus"] == ",".join(str(g) for g in plan[0]["gpus"])


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
    # three of four: nothing is bound, and each pod says why (a reason written while the
    # scheduler had seen only one or two of them says "1 of 4" or "2 of 4" until rewritten)
    cond = k.wait(
        "the reason counting 3 of 4",
        lambda: (
            (c := k.scheduled_condition(k.get_pod(env.kc, env.ns, members[0])))
            and "3 of 4" in c["message"]
            and c
        ),
    )
    assert "waiting for the gang's pods: 3 of 4 exist" in cond["message"], cond
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
    # (its HTTP server answers before its elector has read the lease: "the leader is nobody
    # yet" until then)
    code, text = k.wait(
        "the standby naming a leader",
        lambda: (c := second.readyz())[0] and "nobody yet" not in c[1] and c,
    )
    assert code == 503 and "the leader is first" in text, (code, text)
    first.kill()
    second.wait_ready(timeout=30)
    pod = env.pod(gpus=1)
    env.bound(pod)
    assert "gpufence_k8s_leader 1.0" in second.get("/metrics")


def test_k8s_status_verb_metrics_and_page_say_who_holds_what(env: Env) -> None:
    import subprocess
    import sys

    env.node("training", gpus=4)
    s = env.start()
    s.wait_ready()
    env.bound(env.pod(gpus=3))
    out = subprocess.run(
        [sys.executable, "-m", "gpufence", "k8s", "status", "--url", s.url, "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    fences = {f["name"]: f for f in json.loads(out)["fences"]}
    assert (fences["training"]["capacity_gpus"], fences["training"]["used_gpus"]) == (4, 3.0)
    assert fences["serving"]["capacity_gpus"] == 0
    assert 'gpufence_partition_used_gpus{partition="training"} 3.0' in s.get("/metrics")
    assert "<h2>Fences</h2>" in s.get("/")
    table = subprocess.run(
        [sys.executable, "-m", "gpufence", "k8s", "status", "--url", s.url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "training" in table and "FENCE" in table


def test_k8s_podgroup_gang_from_the_kubernetes_gang_api(env: Env) -> None:
    env.node("training", gpus=4)
    env.node("training", gpus=4)
    env.start().wait_ready()
    # pods first, their PodGroup later: they wait for it, saying so
    pods = [env.pod(f"w-{i}", gpus=2, group="train-job") for i in range(3)]
    cond = k.wait(
        "a waiting reason", lambda: k.scheduled_condition(k.get_pod(env.kc, env.ns, pods[0]))
    )
    assert "PodGroup train-job" in cond["message"]
    k.pod_group(env.kc, env.ns, "train-job", 4)
    k.wait(
        "the count",
        lambda: (
            "3 of 4"
            in (k.scheduled_condition(k.get_pod(env.kc, env.ns, pods[0])) or {}).get("message", "")
        ),
    )
    assert not any(k.node_of(env.kc, env.ns, p) for p in pods)
    pods.append(env.pod("w-3", gpus=2, group="train-job"))
    assert len({env.bound(p) for p in pods}) == 2
    plan = json.loads(_note(k.get_pod(env.kc, env.ns, "w-0"))["gpufence.io/gang-plan"])
    assert sorted(m["pod"] for m in plan) == ["w-0", "w-1", "w-2", "w-3"]


def test_k8s_fence_and_queue_objects_show_who_holds_what(env: Env) -> None:
    import kapply

    root = Path(__file__).resolve().parents[2]
    kapply.apply_all(env.kc, kapply.documents(root / "deploy" / "01-crds.yaml"))
    for crd in ("fences.gpufence.io", "queues.gpufence.io"):
        kapply.wait_established(env.kc, crd)
    env.node("training", gpus=4)
    env.start().wait_ready()
    env.bound(env.pod(gpus=3, labels={"gpufence.io/queue": "research"}))

    def status(path: str) -> dict[str, object]:
        status_code, body = env.kc.request("GET", f"/apis/gpufence.io/v1alpha1/{path}")
        return dict(body.get("status") or {}) if status_code == 200 else {}

    fence = k.wait(
        "the Fence status", lambda: (s := status("fences/training")).get("usedGPUs") == 3 and s, 20
    )
    assert (fence["capacityGPUs"], fence["running"], fence["pending"]) == (4, 1, 0)
    queue = k.wait(
        "the Queue status", lambda: (s := status("queues/research")).get("usedGPUs") == 3 and s, 20
    )
    assert queue["running"] == 1


def test_k8s_a_pod_naming_us_but_bound_by_hand_counts_as_foreign(env: Env) -> None:
    node = env.node("training", gpus=4)
    s = env.start()
    s.wait_ready()
    # a tenant bypasses every scheduler: spec.nodeName at creation, schedulerName ours
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "by-hand"},
        "spec": {
            "schedulerName": env.sched,
            "nodeName": node,
            "containers": [
                {"name": "m", "image": "busybox", "resources": {"limits": {k.GPU: "3"}}}
            ],
        },
    }
    k.ok(env.kc, "POST", f"/api/v1/namespaces/{env.ns}/pods", body, 201)
    # the model is rebuilt with its GPUs taken off (a fixed sleep assumed that within 3 s; a
    # rebuild any later and "two" is bound onto the by-hand pod's GPUs)
    k.wait("the by-hand pod's GPUs off the model", lambda: _capacity(s, "training") == 1.0)
    two = env.pod(gpus=2)
    k.wait("a pending reason", lambda: k.scheduled_condition(k.get_pod(env.kc, env.ns, two)))
    assert not k.node_of(env.kc, env.ns, two)
    assert env.bound(env.pod(gpus=1)) == node


def test_k8s_two_notes_claiming_the_same_gpus_do_not_stop_the_scheduler(env: Env) -> None:
    node = env.node("training", gpus=4)
    # two pods bound by hand, each with a well-formed note claiming all four GPUs: what a
    # tenant forging notes (or a botched manual restore) leaves for the next start
    for name in ("forged-a", "forged-b"):
        env.pod(name, gpus=4)
        note = {
            "gpufence.io/job": f"{env.ns}/{name}",
            "gpufence.io/bound-partition": "training",
            "gpufence.io/attempt": "1",
            "gpufence.io/bound-at": "1000.0",
            "gpufence.io/gang-plan": json.dumps(
                [{"pod": name, "node": node, "gpus": [0, 1, 2, 3]}]
            ),
        }
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "annotations": note},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        k.ok(env.kc, "POST", f"/api/v1/namespaces/{env.ns}/pods/{name}/binding", binding, 201)
    s = env.start()
    s.wait_ready()
    # a rebuild counts the disowned pod as foreign: its 4 GPUs leave the model
    k.wait("the disowned pod's GPUs off the model", lambda: _capacity(s, "training") == 0.0)
    late = env.pod(gpus=1)
    k.wait("a pending reason", lambda: k.scheduled_condition(k.get_pod(env.kc, env.ns, late)))
    assert not k.node_of(env.kc, env.ns, late)
    assert s.proc.poll() is None and "not restoring" in s.log_path_text()
