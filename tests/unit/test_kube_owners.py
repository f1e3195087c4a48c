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
