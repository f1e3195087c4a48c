"""GPU activity on Kubernetes (kube/activity.py): the sidecar's annotation and Prometheus' answer
read exactly, and turned into the core's Activity events for running notebooks of a reclaiming
fence -- then the core, not the front end, warns and releases (tests/k8s/test_k8s_idle.py runs it
through the real API server)."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

import pytest

from gpufence.kube.activity import (
    ActivityFeed,
    PrometheusPoller,
    parse_query_result,
    read_activity,
)
from gpufence.kube.fences import fence_spec_from_dict
from gpufence.kube.hardware import build_hardware
from gpufence.kube.objects import ObservedNode, ObservedPod
from gpufence.kube.tracker import Tracker
from gpufence.model.decisions import Notice, NoticeWithdrawn, Reason, Stop
from gpufence.model.events import Activity
from gpufence.sched.scheduler import Scheduler

FENCES = {
    "name": "t",
    "partitions": {
        "notebooks": {
            "node_selector": {"fence": "nb"},
            "admits": ["interactive"],
            "reclaim": {"idle_threshold": 0.2, "idle_after_s": 60, "warning_s": 30},
        },
        "open": {"node_selector": {"fence": "open"}, "admits": ["interactive"]},
    },
    "queues": [
        {"name": "nb", "partition": "notebooks", "tenant": "team"},
        {"name": "open", "partition": "open", "tenant": "team"},
    ],
}
ANN = "gpufence.io/gpu-activity"


def _pod(name: str, queue: str = "nb", annotations: dict[str, str] | None = None) -> ObservedPod:
    return ObservedPod(
        namespace="team",
        name=name,
        uid=f"uid-{name}",
        scheduler_name="gpufence",
        node="",
        phase="Pending",
        deleting=False,
        labels={"gpufence.io/class": "interactive", "gpufence.io/queue": queue},
        annotations=annotations or {},
        requests={"nvidia.com/gpu": Decimal(1)},
        created=100.0,
    )


class World:
    """Two notebooks bound at t=1000: ``nb`` in the reclaiming fence, ``free`` in the open one."""

    def __init__(self) -> None:
        spec = fence_spec_from_dict(FENCES)
        gpu = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        nodes = [
            ObservedNode(n, {**gpu, "fence": f}, 2, {}, 64000, 512 * 1024, True)
            for n, f in (("n0", "nb"), ("n1", "open"))
        ]
        self.cluster = build_hardware(spec, nodes).cluster
        self.tracker = Tracker("gpufence", spec.policy.queues)
        self.core = Scheduler(self.cluster)
        self.feed = ActivityFeed(max_age_s=120)
        for p in (_pod("nb"), _pod("free", "open")):
            self.tracker.pod_seen(p)
        self.step(1000.0)

    def step(self, now: float) -> list[object]:
        t = self.tracker
        t.submit_ready()
        events, _ = t.take()
        events += self.feed.events(t, self.cluster)
        decisions = self.core.step(events, now)
        t.decide(self.cluster, decisions, now)
        return [*events, *decisions]

    def annotate(self, name: str, value: str, now: float) -> None:
        node = "n0" if name == "nb" else "n1"
        pod = replace(_pod(name), node=node, phase="Running", annotations={ANN: value})
        self.feed.pod_seen(pod, now)


def test_the_annotation_is_read_exactly_and_a_bad_one_names_the_format() -> None:
    assert read_activity("0.42 1765000000") == (0.42, 1765000000.0)
    for bad in ("", "0.4", "high 1765000000", "1.5 1765000000", "0.4 0", "0.4 1 2"):
        with pytest.raises(ValueError, match=r"gpufence\.io/gpu-activity=.*<utilisation 0\.\.1>"):
            read_activity(bad)


def test_prometheus_answer_is_the_busiest_gpu_per_pod_in_0_to_1() -> None:
    body = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {"metric": {"namespace": "team", "pod": "nb"}, "value": [1.0, "87"]},
                {"metric": {"namespace": "team", "pod": "nb"}, "value": [1.0, "12"]},
                {"metric": {"namespace": "team", "pod": "free"}, "value": [1.0, "NaN"]},
                {"metric": {"gpu": "3"}, "value": [1.0, "99"]},  # a GPU no pod holds
            ],
        },
    }
    assert parse_query_result(body) == {"team/nb": 0.87}
    with pytest.raises(ValueError, match="bad_data"):
        parse_query_result({"status": "error", "error": "bad_data: parse error"})
    with pytest.raises(ValueError, match="instant vector"):
        parse_query_result({"status": "success", "data": {"resultType": "matrix", "result": []}})


def test_a_fresh_sample_is_activity_for_the_job_once_and_a_stale_one_is_not() -> None:
    w = World()
    w.annotate("nb", "0.9 1010", 1010.0)
    w.annotate("nb", "0.9 1010", 1011.0)  # the same value seen again: not a second sample
    assert w.feed.events(w.tracker, w.cluster) == [Activity("team/nb", 0.9)]
    assert w.feed.events(w.tracker, w.cluster) == []
    w.annotate("nb", "0.9 800", 1020.0)  # older than the newest one used
    w.annotate("nb", "0.9 1025", 1200.0)  # 175 s old when seen (a restart's leftover)
    assert w.feed.events(w.tracker, w.cluster) == []
    # the open fence reclaims nothing: its notebooks are not sampled (as on the local plane)
    w.annotate("free", "0.9 1030", 1030.0)
    assert w.feed.events(w.tracker, w.cluster) == []


def test_the_core_warns_an_idle_notebook_and_withdraws_when_it_is_active_again() -> None:
    w = World()
    w.annotate("nb", "0.05 1030", 1030.0)  # under the fence's threshold: still idle
    out = w.step(1061.0)
    notice = [d for d in out if isinstance(d, Notice)]
    assert [(n.job_id, n.reason, n.deadline) for n in notice] == [("team/nb", Reason.IDLE, 1091)]
    w.annotate("nb", "0.9 1070", 1070.0)
    out = w.step(1070.0)
    assert Activity("team/nb", 0.9) in out
    assert [d.job_id for d in out if isinstance(d, NoticeWithdrawn)] == ["team/nb"]
    # active at 1070: the next warning is due at 1130, not before
    assert not [d for d in w.step(1129.0) if isinstance(d, Notice | Stop)]
    assert [d.job_id for d in w.step(1130.0) if isinstance(d, Notice)] == ["team/nb"]


def test_prometheus_samples_join_the_annotations_busiest_first() -> None:
    poller = PrometheusPoller("http://127.0.0.1:9")
    w = World()
    w.feed = ActivityFeed(poller)
    poller._fresh = {"team/nb": 0.3, "team/free": 0.9, "other/x": 1.0}
    w.annotate("nb", "0.5 1010", 1010.0)
    assert w.feed.events(w.tracker, w.cluster) == [Activity("team/nb", 0.5)]
    assert poller.take() == {}  # each answer is taken once


def test_an_unreachable_prometheus_gives_no_samples_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    poller = PrometheusPoller("http://127.0.0.1:9")  # discard port: nothing listens
    poller.poll()
    poller.poll()
    assert poller.take() == {}
    said = [r.message for r in caplog.records if "Prometheus" in r.message]
    assert len(said) == 1 and "http://127.0.0.1:9" in said[0], said
