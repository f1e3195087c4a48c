"""Dynamic MIG on a node of any GPU count: ``k8s run --mig-configmap`` writes the config a re-cut
names into the MIG manager's ConfigMap, then labels the node (kube/mig_configmap.py), on the
real API server.

The scheduler runs as its own user and the API server's audit log (tests/k8s/audit.py) is the
record of its writes, so the order of the ConfigMap update and the node patch is asserted
exactly. The fake MIG manager (tests/k8s/mig_manager.py) reads the configs from the ConfigMap
through the API, optionally as it was some seconds ago (the kubelet's lagging volume).
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import audit
import kobjects as k
import pytest
import yaml
from cluster import KubeCluster
from kenv import Env
from mig_manager import FakeMigManager
from scheduler_proc import SchedulerProc
from test_k8s_mig import MIG_FENCE, labels_of, log_of, mig_node, mig_pod, reason

from gpufence.kube.mig_parted import config_name, entries, node_counts

CM = "gpufence-mig-parted"
SEVEN = (("1g.10gb", 7),)
CUT = (("1g.10gb", 4), ("3g.40gb", 1))
THEIRS = [{"devices": "all", "mig-enabled": False}]  # an operator's own config


@pytest.fixture(scope="module")
def audited(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    """An API server of this module's own that logs gpufence-scheduler's writes."""
    work = tmp_path_factory.mktemp("k8s-mig-configmap")
    kc = KubeCluster(k8s_bin_dir, work, extra_apiserver_args=audit.apiserver_args(work))
    kc.start()
    try:
        audit.grant_scheduler(kc)
        yield kc
    finally:
        kc.close()


@pytest.fixture
def menv(audited: KubeCluster, tmp_path: Path) -> Iterator[Env]:
    run = f"c{secrets.token_hex(3)}"
    e = Env(audited, "", run, f"gpufence-{run}", tmp_path / "cluster.yaml", tmp_path, [])
    e.ns = k.namespace(audited, f"ns-{run}")
    e.config.write_text(MIG_FENCE.format(run=run, sched=e.sched))
    try:
        yield e
    finally:
        for p in e.procs:
            p.stop()


def configmap(env: Env, configs: dict[str, Any]) -> str:
    """The MIG manager's ConfigMap, in a namespace of its own (the GPU operator's)."""
    ns = k.namespace(env.kc, f"gpu-operator-{env.run}")
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CM, "namespace": ns},
        "data": {"config.yaml": yaml.safe_dump({"version": "v1", "mig-configs": configs})},
    }
    k.ok(env.kc, "POST", f"/api/v1/namespaces/{ns}/configmaps", body, 201)
    return ns


def held(env: Env, ns: str) -> dict[str, Any]:
    body = k.ok(env.kc, "GET", f"/api/v1/namespaces/{ns}/configmaps/{CM}")
    return dict(yaml.safe_load(body["data"]["config.yaml"])["mig-configs"])


def start(env: Env, ns: str, settle_s: float) -> SchedulerProc:
    extra = ["--mig-configmap", f"{ns}/{CM}", "--mig-config-settle", str(settle_s)]
    p = SchedulerProc(
        env.kc.gpufence_scheduler_kubeconfig,
        env.config,
        env.tmp / f"sched-{len(env.procs)}.log",
        extra=extra,
    )
    env.procs.append(p)
    p.wait_ready()
    return p


def writes_for(env: Env, ns: str, node: str) -> list[audit.Write]:
    """The scheduler's writes to the MIG manager's ConfigMap and to ``node``, in order."""
    return [
        w
        for w in audit.all_writes(env.kc)
        if (w.resource == "configmaps" and w.namespace == ns)
        or (w.resource, w.name) == ("nodes", node)
    ]


def test_k8s_an_8_gpu_node_is_recut_through_a_config_written_before_its_label(
    menv: Env,
) -> None:
    env = menv
    # a node outside the fence already runs a gpufence config: it stays in the ConfigMap; one
    # no node names any more goes; the operator's own config is left alone
    in_use, stale = config_name([SEVEN, SEVEN]), config_name([CUT, SEVEN, SEVEN])
    ns = configmap(
        env, {"all-disabled": THEIRS, in_use: entries([SEVEN, SEVEN]), stale: entries([CUT] * 3)}
    )
    k.gpu_node(env.kc, f"{env.run}-other", gpus=2, labels={k.MIG_CONFIG: in_use})
    node = mig_node(env, "a", gpus=8)
    mgr = FakeMigManager(env.kc, {}, configmap=f"{ns}/{CM}", mode="hold")
    mgr.watch(node)
    try:
        start(env, ns, settle_s=0)
        # 8 small pods fill GPU 0 (7 x 1g) and take one instance of another GPU: both busy
        small = [mig_pod(env, "1g.10gb", f"small-{i}") for i in range(8)]
        for p in small:
            assert env.bound(p) == node
            k.set_phase(env.kc, env.ns, p, "Running")
        busy = {
            int(k.get_pod(env.kc, env.ns, p)["metadata"]["annotations"]["gpufence.io/gpus"])
            for p in small
        }
        assert len(busy) == 2, busy
        big = mig_pod(env, "3g.40gb", "big")
        # the MIG manager holds the re-cut in pending: the pod is not bound before success
        k.wait("the re-cut pending", lambda: labels_of(env, node).get(k.MIG_STATE) == "pending")
        # (an audit entry may land a moment after the write's effect was seen)
        seq = k.wait(
            "the two writes audited", lambda: len(w := writes_for(env, ns, node)) >= 2 and w
        )
        assert [(w.verb, w.resource) for w in seq] == [("update", "configmaps"), ("patch", "nodes")]
        recut = json.loads(seq[1].body["metadata"]["annotations"]["gpufence.io/mig-recut"])
        (chosen,) = recut["gpus"]
        assert chosen not in busy
        cuts = [CUT if g == chosen else SEVEN for g in range(8)]
        config = config_name(cuts)
        time.sleep(2)
        assert not k.node_of(env.kc, env.ns, big)
        mgr.release()
        assert env.bound(big, timeout=40) == node
        placed = int(k.get_pod(env.kc, env.ns, big)["metadata"]["annotations"]["gpufence.io/gpus"])
        assert placed == chosen
        # the ConfigMap: the new config (the busy GPUs keep their cut, the chosen idle one gets
        # the new one), the operator's config and the one in use kept, the stale one gone
        configs = held(env, ns)
        assert sorted(configs) == sorted(["all-disabled", in_use, config])
        assert configs["all-disabled"] == THEIRS
        assert node_counts(configs[config], 8) == tuple(cuts)
        # the exact writes: the ConfigMap update, then the node patch naming the config
        seq = writes_for(env, ns, node)
        assert [(w.verb, w.resource, w.code) for w in seq] == [
            ("update", "configmaps", 200),
            ("patch", "nodes", 200),
        ], [str(w) for w in seq]
        assert seq[1].body["metadata"]["labels"] == {k.MIG_CONFIG: config, k.MIG_STATE: None}
        applied = [
            {"config": config, "note": True},
            {"state": "pending"},
            {"mig": {"nvidia.com/mig-1g.10gb": "53", "nvidia.com/mig-3g.40gb": "1"}},
            {"state": "success"},
        ]
        assert log_of(mgr, node, applied) == applied
    finally:
        mgr.close()


def lagging(env: Env, lag_s: float) -> tuple[str, str, FakeMigManager]:
    """The MIG manager's ConfigMap (the operator's config only), a 1-GPU MIG node, and a MIG
    manager watching it that reads the ConfigMap through a file ``lag_s`` late."""
    ns = configmap(env, {"all-disabled": THEIRS})
    node = mig_node(env, "a")
    mgr = FakeMigManager(env.kc, {}, configmap=f"{ns}/{CM}", delay_s=0.3, file_lag_s=lag_s)
    mgr.start_file()
    mgr.watch(node)
    return ns, node, mgr


def test_k8s_the_label_waits_for_the_mig_managers_lagging_file(menv: Env) -> None:
    """The MIG manager sees the ConfigMap 2 s late: with a settle of 4 s the re-cut succeeds,
    the label 4 s after the ConfigMap write and the pod told why it waits."""
    env = menv
    ns, node, mgr = lagging(env, 2.0)
    try:
        start(env, ns, settle_s=4)
        big = mig_pod(env, "3g.40gb", "big")
        told = k.wait(
            "the settle in the reason", lambda: "config written" in (m := reason(env, big)) and m
        )
        assert (
            f"waiting for node {node}'s MIG re-cut to 3g.40gb x1 + 1g.10gb x4 (state config "
            "written, label in 4 s" in told
        ), told
        assert env.bound(big, timeout=40) == node
        seq = writes_for(env, ns, node)
        assert [(w.verb, w.resource) for w in seq] == [("update", "configmaps"), ("patch", "nodes")]
        assert seq[1].at - seq[0].at >= 3.5, [w.at for w in seq]
    finally:
        mgr.close()


def test_k8s_a_failure_after_a_fresh_config_names_the_lag(menv: Env) -> None:
    """No settle against a file 3 s late: the MIG manager fails the label, and the pod's reason
    says the config was new and which flag to raise."""
    env = menv
    ns, _, mgr = lagging(env, 3.0)
    try:
        start(env, ns, settle_s=0)
        big = mig_pod(env, "3g.40gb", "big")
        told = k.wait(
            "the failure in the reason", lambda: "failed" in (m := reason(env, big)) and m
        )
        # (the write is stamped when sent: a slow PUT on a loaded machine reads 1-2 s)
        assert re.search(
            r"\(the config was new in the ConfigMap, [012] s before the label: ", told
        ), told
        assert "raise --mig-config-settle" in told, told
        assert not k.node_of(env.kc, env.ns, big)
    finally:
        mgr.close()


def test_k8s_kill_9_between_the_config_write_and_the_label_keeps_the_settle(menv: Env) -> None:
    """The scheduler dies after writing the config, before its label: the next one finds the
    config there and written moments ago, so it neither writes it again nor labels the node
    before the MIG manager's lagging file can hold it (the settle is counted from the first
    write, read back from the ConfigMap), and the re-cut succeeds."""
    env = menv
    ns, node, mgr = lagging(env, 5.0)
    try:
        first = start(env, ns, settle_s=8)
        big = mig_pod(env, "3g.40gb", "big")
        k.wait("the config written", lambda: writes_for(env, ns, node), 30)
        first.kill()
        assert [(w.verb, w.resource) for w in writes_for(env, ns, node)] == [
            ("update", "configmaps")
        ]
        start(env, ns, settle_s=8)
        assert env.bound(big, timeout=60) == node
        seq = writes_for(env, ns, node)
        assert [(w.verb, w.resource, w.code) for w in seq] == [
            ("update", "configmaps", 200),
            ("patch", "nodes", 200),
        ], [str(w) for w in seq]
        assert seq[1].at - seq[0].at >= 7.5, [w.at for w in seq]
        assert {"state": "failed"} not in mgr.log.get(node, []), mgr.log
    finally:
        mgr.close()
