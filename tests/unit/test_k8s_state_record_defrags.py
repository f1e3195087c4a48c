"""The Kubernetes state record keeps the MIG defrag budget windows across scheduler restarts
(``gpufence.io/mig-defrags`` on the ``<lease>-state`` Lease), beside the incident budgets: the
restarted core hears ``DefragsRestored`` and does not hand the pool a fresh ``defrag_budget``.
Against an in-memory stand-in for the API server's Lease (tests/k8s runs the real one)."""

from __future__ import annotations

import json
from typing import Any, cast

from gpufence.kube.api import KubeApi
from gpufence.kube.state_record import ANN_DEFRAGS, ANN_PREEMPTIONS, StateRecord, decode, encode
from gpufence.model.events import DefragsRestored, PreemptionsRestored, UsageRestored

PATH = "/apis/coordination.k8s.io/v1/namespaces/gpufence/leases/sched-state"


class _LeaseApi:
    """The two raw calls StateRecord makes, on one Lease kept in memory."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.writes: list[str] = []

    def get_raw(self, path: str) -> dict[str, object] | None:
        assert path == PATH, path
        return json.loads(json.dumps(self.lease)) if self.lease is not None else None

    def write_raw(self, method: str, path: str, body: Any) -> None:
        assert path == (PATH.rsplit("/", 1)[0] if method == "POST" else PATH), (method, path)
        self.lease = json.loads(json.dumps(body))
        self.writes.append(method)


def _record(api: _LeaseApi) -> StateRecord:
    return StateRecord(cast(KubeApi, api), "gpufence", "sched-state")


def test_the_defrag_windows_round_trip_after_the_incident_budgets() -> None:
    body = encode({"serving": (900.0,)}, {"q": 1.5}, 1000.0, None, {"mig": (950.25, 990.0)})
    assert json.loads(body[ANN_DEFRAGS]) == {"mig": [950.25, 990.0]}
    assert decode(body).events() == [
        UsageRestored((("q", 1.5),), 1000.0),
        PreemptionsRestored((("serving", (900.0,)),)),
        DefragsRestored((("mig", (950.25, 990.0)),)),
    ]


def test_a_damaged_or_missing_defrag_annotation_is_a_whole_budget_and_nothing_else() -> None:
    """A damaged value is dropped alone (the incident budgets still come back); a record
    written before defrag windows were kept has none."""
    body = encode({"serving": (900.0,)}, {}, 1000.0, None, {"mig": (950.0,)})
    broken = decode({**body, ANN_DEFRAGS: '["not", "a", "mapping"]'})
    assert broken.defrags == {}
    assert broken.events() == [PreemptionsRestored((("serving", (900.0,)),))]
    older = decode({ANN_PREEMPTIONS: body[ANN_PREEMPTIONS]})
    assert older.defrags == {} and older.windows == {"serving": (900.0,)}


def test_a_defrag_stop_alone_is_written_and_a_restarted_record_hands_it_back() -> None:
    """The first save writes the record; a later one where only a defrag stop was added (fair
    share not due) is written too, so a crash right after it does not refill the budget."""
    api = _LeaseApi()
    rec = _record(api)
    assert rec.load().events() == []  # (no Lease yet: a first start)
    rec.maybe_save({}, {"q": 1.0}, 100.0)
    rec.maybe_save({}, {"q": 1.0}, 101.0, None, {})  # nothing changed: no write
    rec.maybe_save({}, {"q": 1.0}, 102.0, None, {"mig": (102.0,)})
    rec.close()
    assert api.writes == ["POST", "PUT"]

    restarted = _record(api)
    saved = restarted.load()
    assert saved.defrags == {"mig": (102.0,)}
    assert DefragsRestored((("mig", (102.0,)),)) in saved.events()
