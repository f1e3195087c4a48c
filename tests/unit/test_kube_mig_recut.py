"""The re-cut bookkeeping of kube/mig_recut.py: what is asked of a node, what counts as done,
what a restarted scheduler reads back, and a node that is not relabelled."""

from __future__ import annotations

from gpufence.kube import mig_parted as mp
from gpufence.kube import names
from gpufence.kube.mig_recut import MigRecuts, Recut
from gpufence.kube.objects import ObservedNode
from gpufence.model.cluster import Cluster
from gpufence.model.decisions import MigReconfigure, Reason
from gpufence.model.events import MigLayoutRead, MigReconfigured
from gpufence.testing.builders import ClusterBuilder, MigConfig, SharingMode

CUT_3G: mp.Counts = (("1g.10gb", 4), ("3g.40gb", 1))


def _cluster() -> Cluster:
    mig = MigConfig(layout=("1g.10gb",) * 7, dynamic=True, reconfigure_delay_s=1.0)
    return (
        ClusterBuilder()
        .nodes("n", 1, gpus=1)
        .partition("m", ["n"], sharing=SharingMode.MIG, mig=mig)
        .build()
    )


def _node(labels: dict[str, str], mig: dict[str, int], note: str = "") -> ObservedNode:
    return ObservedNode("n-0", labels, 0, mig, 1000, 1000, True, mig_recut=note)


SEVEN = tuple(f"1g.10gb@{i}" for i in range(7))
CUT = ("1g.10gb@0", "1g.10gb@1", "1g.10gb@2", "1g.10gb@3", "3g.40gb@4")


def test_a_stale_success_is_not_taken_and_a_restart_reads_the_recut_back() -> None:
    cluster = _cluster()
    name = cluster.nodes[0].name
    recuts = MigRecuts()
    node = _node({}, {"1g.10gb": 7})
    d = MigReconfigure(0, CUT, Reason.MIG_LAYOUT, 1.0)
    assert recuts.decide(cluster, d, {0: SEVEN}, {name: node}, "ns/big", 100.0) == []
    _, (label,) = recuts.take(cluster, {}, {}, 100.0)
    config = mp.config_name([CUT_3G])
    assert label.labels == {names.NODE_MIG_CONFIG: config, names.NODE_MIG_STATE: None}  # type: ignore[union-attr]
    note = str(label.annotations[names.ANN_MIG_RECUT])  # type: ignore[union-attr]
    # "success" with the old instances still advertised: not this config's success yet
    recuts.node_seen(
        _node(
            {names.NODE_MIG_CONFIG: config, "nvidia.com/mig.config.state": "success"},
            {"1g.10gb": 7},
        )
    )
    assert recuts.take(cluster, {}, {}, 101.0) == ([], [])
    # a restart meanwhile: the node's note says what is in flight, and the fresh core hears it
    fresh = MigRecuts()
    fresh.load(
        [
            _node(
                {names.NODE_MIG_CONFIG: config, names.NODE_MIG_STATE: "pending"},
                {"1g.10gb": 7},
                note,
            )
        ]
    )
    assert fresh.restore_events(cluster) == [MigLayoutRead(0, CUT, recutting=True)]
    assert fresh.asked[name].at == 100.0 and fresh.asked[name].job == "ns/big"
    assert Recut.read(name, "{not json") is None
    applied = _node(
        {names.NODE_MIG_CONFIG: config, names.NODE_MIG_STATE: "success"},
        {"1g.10gb": 4, "3g.40gb": 1},
    )
    fresh.node_seen(applied)
    assert fresh.take(cluster, {}, {}, 102.0) == ([MigReconfigured(0)], [])


def test_a_node_advertising_other_instances_is_not_relabelled() -> None:
    cluster = _cluster()
    recuts = MigRecuts()
    d = MigReconfigure(0, CUT, Reason.MIG_LAYOUT, 1.0)
    got = recuts.decide(
        cluster, d, {0: SEVEN}, {cluster.nodes[0].name: _node({}, {"3g.40gb": 2})}, "j", 0.0
    )
    assert [(e.gpu, e.usable) for e in got] == [(0, False)]  # type: ignore[union-attr]
    assert recuts.take(cluster, {}, {}, 0.0) == ([], [])


def test_a_refused_node_patch_fails_the_recut_naming_why() -> None:
    cluster = _cluster()
    name = cluster.nodes[0].name
    recuts = MigRecuts()
    d = MigReconfigure(0, CUT, Reason.MIG_LAYOUT, 1.0)
    recuts.decide(cluster, d, {0: SEVEN}, {name: _node({}, {"1g.10gb": 7})}, "ns/big", 0.0)
    recuts.take(cluster, {}, {}, 0.0)
    recuts.refused(name, "403: nodes is forbidden")
    events, _ = recuts.take(cluster, {}, {}, 1.0)
    assert [(e.gpu, e.usable) for e in events] == [(0, False)]  # type: ignore[union-attr]
    assert recuts.failure_for("ns/big").startswith(
        f"node {name}'s MIG re-cut to 3g.40gb x1 + 1g.10gb x4 failed (not written: 403: nodes "
        "is forbidden, config "
    )
    assert [r.node for r in recuts.newly_failed] == [name]


def test_a_second_gpu_of_the_node_waits_and_is_asked_with_the_first_ones_new_cut() -> None:
    mig = MigConfig(layout=("1g.10gb",) * 7, dynamic=True, reconfigure_delay_s=1.0)
    cluster = (
        ClusterBuilder()
        .nodes("n", 1, gpus=2)
        .partition("m", ["n"], sharing=SharingMode.MIG, mig=mig)
        .build()
    )
    name = cluster.nodes[0].name
    recuts = MigRecuts()
    before = {name: _node({}, {"1g.10gb": 14})}
    both = {0: SEVEN, 1: SEVEN}
    recuts.decide(cluster, MigReconfigure(0, CUT, Reason.MIG_LAYOUT, 1.0), both, before, "a", 0)
    recuts.decide(cluster, MigReconfigure(1, CUT, Reason.MIG_LAYOUT, 1.0), both, before, "b", 0)
    _, (first,) = recuts.take(cluster, both, before, 0.0)  # the second waits for the node
    one = mp.config_name([CUT_3G, (("1g.10gb", 7),)])
    assert first.labels[names.NODE_MIG_CONFIG] == one  # type: ignore[union-attr]
    after = _node(
        {names.NODE_MIG_CONFIG: one, names.NODE_MIG_STATE: "success"},
        {"1g.10gb": 11, "3g.40gb": 1},
    )
    recuts.node_seen(after)
    # the batch that tells the core GPU 0 is cut asks nothing yet: the core's cut is still old
    assert recuts.take(cluster, both, {name: after}, 1.0) == ([MigReconfigured(0)], [])
    _, (second,) = recuts.take(cluster, {0: CUT, 1: SEVEN}, {name: after}, 2.0)
    two = mp.config_name([CUT_3G, CUT_3G])
    assert second.labels[names.NODE_MIG_CONFIG] == two  # type: ignore[union-attr]
    assert recuts.asked[name].gpus == (1,) and recuts.asked[name].job == "b"
