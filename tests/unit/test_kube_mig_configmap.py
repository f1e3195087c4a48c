"""kube/mig_configmap.py: a re-cut's config written into the MIG manager's ConfigMap before its
label -- others' configs kept, gpufence's unused ones dropped, 409s read again, and the label
held back until the MIG manager's mounted file can hold a new config."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from gpufence.kube import mig_parted as mp
from gpufence.kube import names
from gpufence.kube.api import CallFailed
from gpufence.kube.mig_configmap import KEY, MigConfigMap, merged
from gpufence.kube.mig_recut import MigRecuts
from gpufence.kube.objects import ObservedNode
from gpufence.model.decisions import MigReconfigure, Reason
from gpufence.testing.builders import ClusterBuilder, MigConfig, SharingMode

CUT_3G: mp.Counts = (("1g.10gb", 4), ("3g.40gb", 1))
SEVEN: mp.Counts = (("1g.10gb", 7),)
THEIRS = {"all-disabled": [{"devices": "all", "mig-enabled": False}]}


def _write(gpus: list[mp.Counts], keep: frozenset[str] = frozenset()) -> mp.ConfigWrite:
    return mp.ConfigWrite(mp.config_name(gpus), tuple(mp.entries(gpus)), frozenset(keep))


def _file(configs: dict[str, Any]) -> str:
    return yaml.safe_dump({"version": "v1", "mig-configs": configs})


def test_the_config_is_added_beside_others_and_unused_gpufence_configs_go() -> None:
    old = mp.config_name([SEVEN, SEVEN])  # what node a's label names: kept
    gone = mp.config_name([CUT_3G, CUT_3G])  # no node names it: dropped
    w = _write([SEVEN, CUT_3G], frozenset({old}))
    text = merged(_file({**THEIRS, old: mp.entries([SEVEN, SEVEN]), gone: []}), w, "cm")
    assert text is not None
    configs = yaml.safe_load(text)["mig-configs"]
    assert sorted(configs) == sorted(["all-disabled", old, w.name])
    assert configs["all-disabled"] == THEIRS["all-disabled"]
    assert mp.node_counts(configs[w.name], 2) == (SEVEN, CUT_3G)
    # written again: nothing to change
    assert merged(text, w, "cm") is None


def test_an_empty_or_unreadable_file() -> None:
    w = _write([CUT_3G])
    text = merged("", w, "cm")
    assert text is not None and list(yaml.safe_load(text)["mig-configs"]) == [w.name]
    with pytest.raises(mp.MigPartedError, match=r"cm config\.yaml: expected a mapping"):
        merged("- a list", w, "cm")
    # an operator's config gpufence would not write itself is kept as it is
    odd = {"custom": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": "7"}}]}
    text = merged(_file(odd), w, "cm")
    assert text is not None and yaml.safe_load(text)["mig-configs"]["custom"] == odd["custom"]


class FakeApi:
    """A ConfigMap with a resourceVersion; ``race`` writes land between a read and a PUT."""

    def __init__(self, configs: dict[str, Any] | None) -> None:
        self.obj: dict[str, Any] | None = None
        if configs is not None:
            meta = {"name": "cm", "resourceVersion": "1"}
            self.obj = {"metadata": meta, "data": {KEY: _file(configs)}}
        self.race: list[dict[str, Any]] = []
        self.puts = 0

    def get_raw(self, path: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.obj)

    def write_raw(self, method: str, path: str, body: dict[str, Any]) -> None:
        assert self.obj is not None and method == "PUT"
        if self.race:  # another writer's update first: this one's resourceVersion is stale
            theirs = yaml.safe_load(self.obj["data"][KEY])
            theirs["mig-configs"].update(self.race.pop())
            self.obj["data"][KEY] = yaml.safe_dump(theirs)
            self.obj["metadata"]["resourceVersion"] += "1"
        if body["metadata"]["resourceVersion"] != self.obj["metadata"]["resourceVersion"]:
            raise CallFailed(409, "the object has been modified")
        self.obj = copy.deepcopy(body)
        self.obj["metadata"]["resourceVersion"] += "1"
        self.puts += 1


def test_a_conflict_is_read_again_and_the_other_writers_config_survives() -> None:
    api = FakeApi(THEIRS)
    api.race = [{"operator-added": [{"devices": "all", "mig-enabled": False}]}]
    now = [1000.0]
    cm = MigConfigMap(api, "gpu-operator", "cm", settle_s=70, clock=lambda: now[0])  # type: ignore[arg-type]
    w = _write([CUT_3G])
    assert cm.ensure(w) == 70.0  # new: the label waits for the kubelet's sync
    assert api.obj is not None and api.puts == 1
    held = yaml.safe_load(api.obj["data"][KEY])["mig-configs"]
    assert sorted(held) == sorted(["all-disabled", "operator-added", w.name])
    # a new leader (another writer): the ConfigMap says when the config was written, so the
    # label still waits for the rest of the settle; nothing is written again
    again = MigConfigMap(api, "gpu-operator", "cm", settle_s=70, clock=lambda: now[0])  # type: ignore[arg-type]
    now[0] += 30
    assert again.ensure(w) == 40.0 and api.puts == 1
    assert again.written_ago(w.name) == 30.0
    now[0] += 60
    assert again.ensure(w) == 0.0


def test_a_missing_configmap_names_the_fix() -> None:
    cm = MigConfigMap(FakeApi(None), "gpu-operator", "cm")  # type: ignore[arg-type]
    with pytest.raises(CallFailed, match="gpu-operator/cm not found: create it"):
        cm.ensure(_write([CUT_3G]))


def test_a_recut_carries_its_config_and_the_configs_in_use() -> None:
    mig = MigConfig(layout=("1g.10gb",) * 7, dynamic=True, reconfigure_delay_s=1.0)
    cluster = (
        ClusterBuilder()
        .nodes("n", 2, gpus=8)
        .partition("m", ["n"], sharing=SharingMode.MIG, mig=mig)
        .build()
    )
    seven = tuple(f"1g.10gb@{i}" for i in range(7))
    cut = ("1g.10gb@0", "1g.10gb@1", "1g.10gb@2", "1g.10gb@3", "3g.40gb@4")
    other = mp.config_name([SEVEN] * 8)
    nodes = {
        "n-0": ObservedNode("n-0", {}, 8, {"1g.10gb": 56}, 1000, 1000, True),
        "n-1": ObservedNode("n-1", {names.NODE_MIG_CONFIG: other}, 8, {}, 1000, 1000, True),
    }
    current = {g: seven for g in range(16)}
    recuts = MigRecuts(write_configs=True)
    d = MigReconfigure(3, cut, Reason.MIG_LAYOUT, 1.0)
    assert recuts.decide(cluster, d, current, nodes, "ns/big", 100.0) == []
    _, (label,) = recuts.take(cluster, current, nodes, 100.0)
    gpus = [SEVEN] * 8
    gpus[3] = CUT_3G
    want = mp.config_name(gpus)
    assert label.config == mp.ConfigWrite(  # type: ignore[union-attr]
        want, tuple(mp.entries(gpus)), frozenset({other, want})
    )
    recuts.config_written("n-0", 70.0, 70.0)
    assert recuts.asked["n-0"].state == "config written, label in 70 s"
    # without the flag: the label alone (the catalogue holds the config)
    plain = MigRecuts()
    plain.decide(cluster, d, current, nodes, "ns/big", 100.0)
    _, (label,) = plain.take(cluster, current, nodes, 100.0)
    assert label.config is None  # type: ignore[union-attr]
