"""The incident path's pure pieces on Kubernetes: which ack counts, the notice annotation read
back, the state record's encoding, the waiting reason's words, and the eviction retries (against
a fake API) -- tests/k8s/test_k8s_incident.py runs them all through the real API server."""

from __future__ import annotations

import threading
import time

from test_k8s_translation import _world, pod

from gpufence.kube.actions import EvictPod
from gpufence.kube.api import CallFailed
from gpufence.kube.core_jobs import CoreJob, notice_value, read_notice
from gpufence.kube.evictions import Evictions
from gpufence.kube.state_record import ANN_FAIR_SHARE, ANN_PREEMPTIONS, decode, encode
from gpufence.kube.waits import waiting_reason
from gpufence.model.decisions import Reason
from gpufence.model.events import CheckpointAck, PreemptionsRestored, UsageRestored
from gpufence.testing.builders import job


def test_only_an_ack_of_the_notice_in_flight_counts_and_only_once() -> None:
    t, _ = _world()
    value = notice_value(Reason.INCIDENT_PREEMPTION, 1120.4)
    assert value == "incident-preemption 1120"
    assert read_notice(value) == (Reason.INCIDENT_PREEMPTION, 1120.0)
    assert read_notice("made-up 12") is None and read_notice("incident-preemption x") is None
    running = pod("a", node_name="n0")
    t.pods[running.key] = running
    t.jobs["team/a"] = CoreJob(job("team/a").build(), "team", ("a",), {"a": running.uid})
    t.pod_job[running.key] = "team/a"
    t.jobs["team/a"].phase, t.jobs["team/a"].notice = "running", value
    for ack in ("incident-preemption 999", value, value):  # a stale ack, the ack, a repeat
        t.pod_seen(pod("a", node_name="n0", annotations={"gpufence.io/checkpointed": ack}))
    assert t.take()[0] == [CheckpointAck("team/a")]


def test_the_state_record_round_trips_and_drops_what_it_cannot_read() -> None:
    awaiting = {"Job/u1": ("team/train-abc", 2)}
    saved = decode(encode({"serving": (900.0, 1000.5)}, {"research": 12.5}, 1234.0, awaiting))
    assert saved.awaiting == awaiting
    assert saved.events() == [
        UsageRestored((("research", 12.5),), 1234.0),
        PreemptionsRestored((("serving", (900.0, 1000.5)),)),
    ]
    broken = decode({ANN_PREEMPTIONS: "[1, 2]", ANN_FAIR_SHARE: '{"at": "x"}'})
    assert broken.events() == []


def test_the_waiting_reason_counts_down_and_names_a_refused_eviction() -> None:
    t, _ = _world()
    t.jobs["team/b"] = CoreJob(job("team/b").build(), "team", ("b",), {})
    said, gist = waiting_reason({"team/a": 1042.0}, t, {}, 1000.2) or ("", "")
    assert said == "waiting for team/a to checkpoint, deadline in 42 s (at 00:17:22 UTC)"
    assert gist == "waiting for team/a to checkpoint, deadline at 00:17:22 UTC"
    refused = {"team/b": "Cannot evict pod as it would violate the pod's disruption budget."}
    said, gist = waiting_reason({"team/b": None}, t, refused, 1000.0) or ("", "")
    assert (
        said
        == gist
        == (
            "waiting for team/b to stop; its eviction is refused and retried until allowed "
            "(team/b: Cannot evict pod as it would violate the pod's disruption budget.)"
        )
    )
    assert waiting_reason({}, t, {}, 0.0) is None


class _Api:
    """Refuses the first ``refusals`` evictions with 429, then evicts."""

    def __init__(self, refusals: int) -> None:
        self.refusals, self.calls, self.events = refusals, 0, []
        self.done = threading.Event()

    def evict_pod(self, namespace: str, pod: str) -> None:
        self.calls += 1
        if self.calls <= self.refusals:
            raise CallFailed(
                429, "Cannot evict pod as it would violate the pod's disruption budget."
            )
        self.done.set()

    def record_event(self, ns: str, pod: str, uid: str, reason: str, message: str) -> None:
        self.events.append(reason)


def test_a_refused_eviction_is_retried_with_growing_pauses_never_deleted() -> None:
    api = _Api(refusals=3)
    ev = Evictions(api, lambda ns, p: "uid", first_retry_s=0.05, max_retry_s=0.2)  # type: ignore[arg-type]
    try:
        t0 = time.monotonic()
        ev.submit(EvictPod("team", "a", "incident-preemption"))
        ev.submit(EvictPod("team", "a", "incident-preemption"))  # a repeat changes nothing
        assert api.done.wait(5)
        # pauses of 0.05, 0.1 and 0.2 s before the fourth try
        assert time.monotonic() - t0 >= 0.3
        assert api.calls == 4
        assert api.events == ["Preempted", "EvictionRefused"]  # the same refusal said once
        time.sleep(0.05)
        assert ev.refused() == {}  # evicted: nothing is refused any more
        ev.forget("team", "a")  # the pod is seen terminating: no more tries
    finally:
        ev.close()
