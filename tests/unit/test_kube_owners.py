"""kube/owners.py: which controllers of requeued jobs will make no next attempt, and when
they are looked at (the API server itself: tests/k8s/test_k8s_controllers.py)."""

from __future__ import annotations

from typing import Any

import pytest

from gpufence.kube.api import CallFailed
from gpufence.kube.owners import OwnerCheck, why_finished


def _cond(kind: str, status: str = "True", reason: str = "") -> dict[str, Any]:
    return {"status": {"conditions": [{"type": kind, "status": status, "reason": reason}]}}


@pytest.mark.parametrize(
    ("kind", "obj", "why"),
    [
        ("Job", {}, ""),
        ("Job", _cond("Failed", reason="BackoffLimitExceeded"), "failed (BackoffLimitExceeded)"),
        ("Job", _cond("Complete"), "complete"),
        ("Job", _cond("Failed", status="False"), ""),
        ("Job", _cond("Suspended"), ""),  # suspended: it makes pods again once resumed
        ("JobSet", _cond("Completed"), "completed"),
        ("ReplicaSet", {"spec": {"replicas": 0}}, "scaled to 0 replicas"),
        ("ReplicaSet", {"spec": {"replicas": 2}}, ""),
        ("StatefulSet", {"spec": {"replicas": 0}}, "scaled to 0 replicas"),
    ],
)
def test_why_a_controller_makes_no_more_pods(kind: str, obj: dict[str, Any], why: str) -> None:
    assert why_finished(kind, obj) == why


class _Api:
    """What the API server holds, by path; counts the reads."""

    def __init__(self, objects: dict[str, dict[str, object]]) -> None:
        self.objects, self.reads = objects, 0
        self.fail = False

    def get_raw(self, path: str) -> dict[str, object] | None:
        self.reads += 1
        if self.fail:
            raise CallFailed(403, "forbidden")
        return self.objects.get(path)


JOBS = "/apis/batch/v1/namespaces/ns/jobs"


def test_owners_are_judged_after_their_grace_at_most_every_period() -> None:
    api = _Api({JOBS: {"items": [{"metadata": {"uid": "u1"}}]}})
    check = OwnerCheck(api, every_s=10.0, grace_s=5.0)
    awaiting = {"Job/u1": ("ns/a", 2), "Job/u2": ("ns/b", 2)}
    assert check.gone(awaiting, 100.0) == {}  # in their grace: not read
    assert api.reads == 0
    assert check.gone(awaiting, 105.0) == {"Job/u2": "deleted"}
    assert api.reads == 1  # one list for the namespace, both judged from it
    assert check.gone(awaiting, 110.0) == {}  # the period has not passed
    assert check.gone({}, 120.0) == {}  # nothing awaited: nothing read
    assert api.reads == 1
    assert check.gone({"Job/u2": ("ns/b", 3)}, 121.0) == {}  # awaited anew: a grace of its own


def test_a_refused_read_judges_nothing() -> None:
    api = _Api({})
    api.fail = True
    check = OwnerCheck(api, every_s=0.0, grace_s=0.0)
    assert check.gone({"Job/u1": ("ns/a", 2), "JobSet/ns/x": ("ns/b", 2)}, 1.0) == {}


class _Flaky(_Api):
    def get_raw(self, path: str) -> dict[str, object] | None:
        self.reads += 1
        if self.fail:
            raise ConnectionError("the API server is away")
        return self.objects.get(path)


def test_any_read_error_judges_nothing_and_the_next_period_looks_again() -> None:
    api = _Flaky({})
    api.fail = True
    check = OwnerCheck(api, every_s=10.0, grace_s=0.0)
    awaiting = {"Job/u1": ("ns/a", 2)}
    assert check.gone(awaiting, 1.0) == {}  # not raised into the scheduler's loop
    api.fail = False
    api.objects[JOBS] = {"items": []}
    assert check.gone(awaiting, 5.0) == {}  # (within the period)
    assert check.gone(awaiting, 11.0) == {"Job/u1": "deleted"}


def test_a_collection_or_api_not_served_says_nothing_of_the_controller() -> None:
    """A 404 for the JobSet API itself (not served at this version, its CRD gone) or a LIST
    without items is no proof that a controller is gone."""
    jobset = "/apis/jobset.x-k8s.io/v1alpha2"
    api = _Api({})
    check = OwnerCheck(api, every_s=0.0, grace_s=0.0)
    awaiting = {"JobSet/ns/x": ("ns/a", 2), "Job/u1": ("ns/b", 2)}
    assert check.gone(awaiting, 1.0) == {}
    api.objects[jobset] = {"kind": "APIResourceList"}
    api.objects[JOBS] = {"items": []}
    assert check.gone(awaiting, 2.0) == {"JobSet/ns/x": "deleted", "Job/u1": "deleted"}


@pytest.mark.parametrize(
    ("kind", "obj", "why"),
    [
        ("JobSet", _cond("Failed", reason="FailedJobs"), "failed (FailedJobs)"),
        ("ReplicaSet", {"spec": {}}, ""),  # replicas left out: the default, 1
    ],
)
def test_more_controllers_that_may_or_may_not_make_pods(
    kind: str, obj: dict[str, Any], why: str
) -> None:
    assert why_finished(kind, obj) == why
