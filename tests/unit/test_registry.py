"""The plugin registry (sched/registry.py) is the only list of names the spec accepts."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from gpufence.model.job import RequestKind
from gpufence.model.partition import Partition, SharingMode
from gpufence.sched import registry
from gpufence.sched.backfill import EasyBackfill
from gpufence.sched.jobs import JobRecord
from gpufence.sched.ordering import PriorityFairShare
from gpufence.spec import SpecError, cluster_from_dict

DOC: dict[str, Any] = {
    "name": "r",
    "node_groups": [{"name": "g", "count": 1, "gpus_per_node": 4, "gpu_type": "H100-80GB"}],
    "partitions": {"p": {"nodes": ["g"], "admits": ["training"]}},
}


def _with(**fields: object) -> dict[str, Any]:
    return {**DOC, "partitions": {"p": {**DOC["partitions"]["p"], **fields}}}


def test_spec_accepts_every_registered_name() -> None:
    for name in registry.QUEUE_ORDERS:
        assert cluster_from_dict(_with(queue_order=name)).partitions["p"].queue_order == name
    for name in registry.SCORERS:
        c = cluster_from_dict(_with(sharing="fractional", placement=name))
        assert c.partitions["p"].placement == name


def test_unknown_queue_order_names_the_registered_ones() -> None:
    with pytest.raises(SpecError) as e:
        cluster_from_dict(_with(queue_order="lifo"))
    msg = str(e.value)
    assert "partitions.p.queue_order: 'lifo' is not valid (expected one of: fair-share, las)" in msg


class _Newest:
    """A queue order nobody ships: one registry line is all the spec needs to accept it."""

    def rank(self, rec: JobRecord) -> int:
        return -int(rec.job.submit_time)


def test_a_new_queue_order_is_one_registry_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SpecError):
        cluster_from_dict(_with(queue_order="newest"))
    monkeypatch.setitem(registry.QUEUE_ORDERS, "newest", _Newest)
    c = cluster_from_dict(_with(queue_order="newest"))
    assert isinstance(registry.make_queue_order(c.partitions["p"].queue_order), _Newest)
    assert isinstance(registry.make_queue_order("fair-share"), PriorityFairShare)


def test_every_sharing_mode_has_a_placer_that_offers_its_requests() -> None:
    assert set(registry.PLACERS) == set(SharingMode)
    offers = {
        mode: registry.make_placer(Partition("p", frozenset(), sharing=mode), 0).offers
        for mode in SharingMode
    }
    assert offers[SharingMode.MIG] == {RequestKind.MIG}
    assert offers[SharingMode.FRACTIONAL] == {RequestKind.WHOLE, RequestKind.FRACTION}
    assert offers[SharingMode.EXCLUSIVE] == offers[SharingMode.TIME_SLICE] == {RequestKind.WHOLE}


def test_unknown_names_fail_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown queue order 'x' \(known: fair-share, las\)"):
        registry.make_queue_order("x")
    assert registry.names("placement policy") == ("best-fit", "fgd", "fence-pack", "random")
    assert [type(r).__name__ for r in registry.admission_rules()] == ["CohortQuota"]


def test_reservation_rules_are_registered_by_name() -> None:
    assert isinstance(registry.make_reservations(), EasyBackfill)
    with pytest.raises(ValueError, match="unknown reservation rule 'slurm' \\(known: easy\\)"):
        registry.make_reservations("slurm")


def test_the_registry_imports_no_numpy() -> None:
    # `gpufence validate` asks the registry for valid names on the base install (no numpy):
    # the plugins that need the core are imported when a scheduler makes them
    code = "import sys, gpufence.sched.registry as r; r.names('queue order'); "
    code += "print('numpy' in sys.modules)"
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert got.stdout.strip() == "False"
