"""What breaks around the scheduler: the API server restarts, a watch answers 410 Gone, a
node fails or is cordoned -- against the real API server."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import kobjects as k
import pytest
from cluster import KubeCluster
from kenv import Env

from gpufence.kube.api import KubeApi
from gpufence.kube.informer import Change, Informer, Resync


def test_k8s_scheduler_keeps_working_through_an_apiserver_restart(env: Env) -> None:
    env.node("training", gpus=4)
    s = env.start()
    s.wait_ready()
    first = env.pod(gpus=2)
    env.bound(first)
    env.kc.restart_apiserver()
    # created after the restart: only a watch that came back (or a re-list) sees it
    second = env.pod(gpus=2)
    env.bound(second, timeout=40)
    third = env.pod(gpus=2)  # the node is full: it must wait, not double-book
    k.wait("a pending reason", lambda: k.scheduled_condition(k.get_pod(env.kc, env.ns, third)))
    assert not k.node_of(env.kc, env.ns, third)
    assert "watch broke" in s.log_path_text()


@pytest.fixture
def compacting_cluster(k8s_bin_dir: Path, tmp_path: Path) -> KubeCluster:
    # etcd compacts history every second and watches read etcd itself (no watch cache whose
    # window would still hold the old version), so an old resourceVersion soon gets 410 Gone
    kc = KubeCluster(
        k8s_bin_dir,
        tmp_path / "k8s",
        extra_apiserver_args=["--etcd-compaction-interval=1s", "--watch-cache=false"],
    )
    kc.start()
    yield kc  # type: ignore[misc]
    kc.close()


def test_k8s_informer_relists_after_410_gone(compacting_cluster: KubeCluster) -> None:
    kc = compacting_cluster
    ns = k.namespace(kc)
    api = KubeApi(str(kc.kubeconfig))
    _, old_version = api.list_pods()
    for _ in range(5):
        k.pod(kc, ns)  # history moves on, and is compacted away
    time.sleep(3)
    calls = {"n": 0}

    def lister() -> tuple[list[object], str]:
        items, version = api.list_pods()
        calls["n"] += 1
        # the first watch starts from a version etcd no longer keeps: the server says 410
        return items, old_version if calls["n"] == 1 else version

    out: queue.Queue[Resync | Change] = queue.Queue()
    stop = threading.Event()
    inf = Informer("pod", lister, api.watch_pods, out, stop, backoff_s=(0.1, 0.5))
    inf.start()
    try:
        resyncs = []
        deadline = time.monotonic() + 20
        while len(resyncs) < 2 and time.monotonic() < deadline:
            item = out.get(timeout=20)
            if isinstance(item, Resync):
                resyncs.append(item)
        assert len(resyncs) == 2 and inf.relists == 1
        assert len([p for p in resyncs[1].objects if p.metadata.namespace == ns]) == 5
        late = k.pod(kc, ns)  # and the new watch delivers what comes next
        got = k.wait("the watch event", lambda: _drain_for(out, late), timeout=10)
        assert got
    finally:
        stop.set()
        api.close()


def _drain_for(out: queue.Queue[Resync | Change], name: str) -> bool:
    while True:
        try:
            item = out.get_nowait()
        except queue.Empty:
            return False
        if isinstance(item, Change) and item.obj.metadata.name == name:
            return True


def test_k8s_failed_node_stops_its_pods_and_a_cordon_takes_no_new_work(env: Env) -> None:
    a = env.node("training", gpus=2)
    b = env.node("training", gpus=2)
    env.start().wait_ready()
    p = env.pod(gpus=2)
    where = env.bound(p)
    other = b if where == a else a
    # cordon the other node: a new pod must not go there although it is free
    k.ok(
        env.kc,
        "PATCH",
        f"/api/v1/nodes/{other}",
        {"spec": {"unschedulable": True}},
        content_type=k.MERGE,
    )
    q = env.pod(gpus=2)
    k.wait("a pending reason", lambda: k.scheduled_condition(k.get_pod(env.kc, env.ns, q)))
    time.sleep(1)
    assert not k.node_of(env.kc, env.ns, q)
    # the node under p fails: p is stopped (deleted; its owner would make a new one)
    k.set_node(env.kc, where, gpus=2, ready=False)
    k.wait(
        "p deleted",
        lambda: (
            k.get_pod_or_none(env.kc, env.ns, p) is None
            or k.get_pod(env.kc, env.ns, p)["metadata"].get("deletionTimestamp")
        ),
    )
    # uncordon: q runs there
    k.ok(
        env.kc,
        "PATCH",
        f"/api/v1/nodes/{other}",
        {"spec": {"unschedulable": False}},
        content_type=k.MERGE,
    )
    assert env.bound(q) == other
