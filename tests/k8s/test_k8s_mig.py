"""Dynamic MIG on Kubernetes through the GPU operator's MIG manager, on the real API server: a
MIG pod whose profile no node offers makes gpufence label an idle node's
``nvidia.com/mig.config`` (never a node with a running pod), and the pod binds once the MIG
manager (tests/k8s/mig_manager.py) reports ``success`` with the new allocatable; a failed re-cut
is named in the pod's reason and an Event and is not retried; a scheduler restarted mid-re-cut
waits for it instead of relabelling.

Each node log is the exact sequence of changes the MIG manager saw on it: gpufence's write (the
config label with its note, one patch), then the MIG manager's own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kobjects as k
import pytest
from cluster import KubeCluster
from kenv import Env
from mig_manager import FakeMigManager

from gpufence.kube.mig_parted import catalogue, config_name

MIG_FENCE = """
name: k8s-mig
kubernetes: {{scheduler_name: {sched}}}
partitions:
  mig:
    node_selector: {{test.gpufence.io/run: {run}, gpufence.io/fence: mig}}
    admits: [training, batch]
    sharing: mig
    mig: {{layout: [1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb],
          dynamic: true, reconfigure_delay_s: 1}}
queues:
  - {{name: research, partition: mig, tenant: ns-{run}}}
"""
# what the core cuts an idle 7 x 1g H100 into for one 3g.40gb pod
CUT_3G = config_name([(("1g.10gb", 4), ("3g.40gb", 1))])
CONFIGS = catalogue("H100-80GB", [1, 2])
MERGE = "application/merge-patch+json"


@pytest.fixture
def mig_env(k8s_cluster: KubeCluster, tmp_path: Path) -> Iterator[Env]:
    e = Env(k8s_cluster, "", "", "", tmp_path / "cluster.yaml", tmp_path, [])
    e.run = f"r{int(time.time() * 1000) % 10**8:08d}"
    e.sched = f"gpufence-{e.run}"
    e.ns = k.namespace(k8s_cluster, f"ns-{e.run}")
    e.config.write_text(MIG_FENCE.format(run=e.run, sched=e.sched))
    try:
        yield e
    finally:
        for p in e.procs:
            p.stop()


def mig_node(env: Env, suffix: str, gpus: int = 1) -> str:
    """An H100 node whose GPUs are cut 7 x 1g.10gb each, as the device plugin advertises them
    (mixed strategy)."""
    labels = {"test.gpufence.io/run": env.run, "gpufence.io/fence": "mig"}
    node = k.gpu_node(env.kc, f"{env.run}-mig-{suffix}", gpus=gpus, labels=labels)
    res = {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": str(7 * gpus)}
    patch = {"status": {"capacity": res, "allocatable": res}}
    k.ok(env.kc, "PATCH", f"/api/v1/nodes/{node}/status", patch, content_type=MERGE)
    return node


def mig_pod(env: Env, profile: str, name: str | None = None) -> str:
    return env.pod(name, resources={f"nvidia.com/mig-{profile}": "1"})


def reason(env: Env, pod: str) -> str:
    cond = k.scheduled_condition(k.get_pod(env.kc, env.ns, pod)) or {}
    return str(cond.get("message", ""))


def labels_of(env: Env, node: str) -> dict[str, Any]:
    body = k.ok(env.kc, "GET", f"/api/v1/nodes/{node}")
    return dict(body["metadata"].get("labels") or {})


def asked(writes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The log with the note's timestamp reduced to its presence."""
    return [{k: (v is not None if k == "note" else v) for k, v in w.items()} for w in writes]


def log_of(mgr: FakeMigManager, node: str, expect: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The node's log once it holds as many changes as ``expect`` (its watch lags a second)."""
    k.wait(f"{len(expect)} changes on {node}", lambda: len(mgr.writes(node)) >= len(expect), 10)
    return asked(mgr.writes(node))


APPLIED = [
    {"config": CUT_3G, "note": True},  # gpufence: one patch, label and note
    {"state": "pending"},  # the MIG manager ...
    {"mig": {"nvidia.com/mig-1g.10gb": "4", "nvidia.com/mig-3g.40gb": "1"}},
    {"state": "success"},
]


def test_k8s_a_mig_recut_labels_only_the_idle_node_and_binds_after_success(
    mig_env: Env,
) -> None:
    env = mig_env
    busy, idle = mig_node(env, "a"), mig_node(env, "b")
    mgr = FakeMigManager(env.kc, CONFIGS, mode="hold")
    mgr.watch(busy)
    mgr.watch(idle)
    try:
        env.start().wait_ready()
        small = mig_pod(env, "1g.10gb")
        assert env.bound(small) == busy
        k.set_phase(env.kc, env.ns, small, "Running")
        big = mig_pod(env, "3g.40gb")
        # the re-cut is asked of the idle node only, and the pod says what it waits for
        k.wait("the re-cut pending", lambda: labels_of(env, idle).get(k.MIG_STATE) == "pending")
        # the reason written before the scheduler saw the MIG manager's "pending" says "state
        # asked", and stays on the pod until the next pass rewrites it: wait for the state the
        # node now has, then check the whole reason
        told = k.wait(
            "the reason naming the pending re-cut",
            lambda: "(state pending, " in (m := reason(env, big)) and m,
        )
        assert told.startswith(
            f"mig-reconfiguring: waiting for node {idle}'s MIG re-cut to "
            "3g.40gb x1 + 1g.10gb x4 (state pending, "
        ), told
        assert not k.node_of(env.kc, env.ns, big)
        mgr.release()
        assert env.bound(big) == idle
        assert log_of(mgr, idle, APPLIED) == APPLIED
        assert mgr.writes(busy) == []  # the node with a running pod is never relabelled
        assert k.MIG_CONFIG not in labels_of(env, busy)
    finally:
        mgr.close()


def test_k8s_a_failed_recut_is_named_and_not_retried(mig_env: Env) -> None:
    env = mig_env
    node = mig_node(env, "a")
    mgr = FakeMigManager(env.kc, CONFIGS, mode="fail", delay_s=0.5)
    mgr.watch(node)
    try:
        env.start().wait_ready()
        big = mig_pod(env, "3g.40gb")
        told = k.wait(
            "the failure in the reason", lambda: "failed" in (m := reason(env, big)) and m
        )
        assert told.startswith(
            f"node {node}'s MIG re-cut to 3g.40gb x1 + 1g.10gb x4 failed "
            f"(nvidia.com/mig.config.state=failed, config {CUT_3G}); its GPUs are out of "
            "placement until the MIG manager reports success for that config; "
        ), told
        events = k.wait(
            "a MigReconfigureFailed event",
            lambda: [
                e for e in k.events(env.kc, env.ns, big) if e["reason"] == "MigReconfigureFailed"
            ],
        )
        assert events[0]["message"] in told
        time.sleep(5)  # scheduling cycles go on: no second label, no second patch
        failed = [{"config": CUT_3G, "note": True}, {"state": "pending"}, {"state": "failed"}]
        assert log_of(mgr, node, failed) == failed
        assert not k.node_of(env.kc, env.ns, big)
    finally:
        mgr.close()


def test_k8s_a_restart_mid_recut_waits_for_it_and_does_not_relabel(mig_env: Env) -> None:
    env = mig_env
    node = mig_node(env, "a")
    mgr = FakeMigManager(env.kc, CONFIGS, mode="hold")
    mgr.watch(node)
    try:
        first = env.start()
        first.wait_ready()
        big = mig_pod(env, "3g.40gb")
        k.wait("the re-cut pending", lambda: labels_of(env, node).get(k.MIG_STATE) == "pending")
        first.kill()
        second = env.start()
        second.wait_ready()
        # the first scheduler's last reason ("state asked") stays on the pod until the second
        # one rewrites it: wait for the state the restarted scheduler read back from the node
        told = k.wait(
            "the restarted scheduler's reason",
            lambda: "(state pending, " in (m := reason(env, big)) and m,
        )
        assert f"node {node}'s MIG re-cut" in told, told
        time.sleep(3)
        assert log_of(mgr, node, APPLIED[:2]) == APPLIED[:2]  # nothing written again
        mgr.release()
        assert env.bound(big) == node
        assert log_of(mgr, node, APPLIED) == APPLIED
    finally:
        mgr.close()


def test_k8s_a_recut_on_a_node_keeps_its_busy_gpu_as_it_is(mig_env: Env) -> None:
    """One label per node: the config names both GPUs -- the busy one with the cut it has."""
    env = mig_env
    node = mig_node(env, "a", gpus=2)
    mgr = FakeMigManager(env.kc, CONFIGS, delay_s=0.5)
    mgr.watch(node)
    try:
        env.start().wait_ready()
        small = mig_pod(env, "1g.10gb")
        assert env.bound(small) == node
        k.set_phase(env.kc, env.ns, small, "Running")
        busy = int(k.get_pod(env.kc, env.ns, small)["metadata"]["annotations"]["gpufence.io/gpus"])
        cuts = [(("1g.10gb", 7),), (("1g.10gb", 7),)]
        cuts[1 - busy] = (("1g.10gb", 4), ("3g.40gb", 1))
        big = mig_pod(env, "3g.40gb")
        assert env.bound(big) == node
        both = [
            {"config": config_name(cuts), "note": True},
            {"state": "pending"},
            {"mig": {"nvidia.com/mig-1g.10gb": "11", "nvidia.com/mig-3g.40gb": "1"}},
            {"state": "success"},
        ]
        assert log_of(mgr, node, both) == both
        note = json.loads(
            k.ok(env.kc, "GET", f"/api/v1/nodes/{node}")["metadata"]["annotations"][
                "gpufence.io/mig-recut"
            ]
        )
        assert note["gpus"] == [1 - busy]
        assert sorted(note["layouts"][busy]) == [f"1g.10gb@{i}" for i in range(7)]
        placed = k.get_pod(env.kc, env.ns, big)["metadata"]["annotations"]["gpufence.io/gpus"]
        assert int(placed) == 1 - busy
    finally:
        mgr.close()


def test_k8s_success_alone_does_not_bind_before_the_instances_are_advertised(
    mig_env: Env,
) -> None:
    env = mig_env
    node = mig_node(env, "a")
    mgr = FakeMigManager(env.kc, CONFIGS, mode="lag", delay_s=0.2)
    mgr.watch(node)
    try:
        env.start().wait_ready()
        big = mig_pod(env, "3g.40gb")
        k.wait("state success", lambda: labels_of(env, node).get(k.MIG_STATE) == "success")
        told = k.wait(
            "the reason naming the missing instances",
            lambda: "(state success" in (m := reason(env, big)) and m,
        )
        assert "(state success, not yet advertised by the node, " in told, told
        time.sleep(2)
        assert not k.node_of(env.kc, env.ns, big)
        mgr.release()
        assert env.bound(big) == node
        lagged = [APPLIED[0], APPLIED[1], APPLIED[3], APPLIED[2]]
        assert log_of(mgr, node, lagged) == lagged
    finally:
        mgr.close()


def test_k8s_a_node_with_a_running_pod_is_never_relabelled(mig_env: Env) -> None:
    env = mig_env
    node = mig_node(env, "a")
    mgr = FakeMigManager(env.kc, CONFIGS, delay_s=0.2)
    mgr.watch(node)
    try:
        env.start().wait_ready()
        small = mig_pod(env, "1g.10gb")
        assert env.bound(small) == node
        k.set_phase(env.kc, env.ns, small, "Running")
        big = mig_pod(env, "3g.40gb")
        told = k.wait(
            "the reason naming the busy GPU", lambda: "no idle GPU" in (m := reason(env, big)) and m
        )
        assert told.endswith(
            "no idle GPU in mig to re-cut for 3g.40gb, a re-cut takes a whole GPU "
            f"(GPU 0 on {node} runs {env.ns}/{small})"
        ), told
        time.sleep(3)
        assert mgr.writes(node) == [] and k.MIG_CONFIG not in labels_of(env, node)
        # the small pod ends: the GPU is idle, and only now is it re-cut
        k.set_phase(env.kc, env.ns, small, "Succeeded")
        assert env.bound(big) == node
        assert log_of(mgr, node, APPLIED) == APPLIED
    finally:
        mgr.close()
