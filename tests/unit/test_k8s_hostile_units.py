"""A hostile tenant and a clumsy operator against the Kubernetes front end's readers: values a
tenant may write on its own pod, a state Lease edited by hand, a cluster YAML with typos. Each
is refused (or dropped) with a message naming the field -- never a crash of the scheduler, which
would take every tenant's scheduling down with it (and crash-loop on the same pod)."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from decimal import Decimal
from typing import Any, cast

import pytest
from test_k8s_translation import FENCES, _world

from gpufence.kube.actions import PodEvent, ShowPending
from gpufence.kube.activity import ActivityFeed, read_activity
from gpufence.kube.api import KubeApi
from gpufence.kube.core_jobs import CoreJob, notice_value, read_notice
from gpufence.kube.fences import fence_spec_from_dict
from gpufence.kube.foreign import adopt
from gpufence.kube.hardware import build_hardware
from gpufence.kube.loop import KubeScheduler
from gpufence.kube.mig_parted import config_name, full_layouts, missing, read_configs
from gpufence.kube.mig_recut import Recut
from gpufence.kube.names import ANN_CHECKPOINTED
from gpufence.kube.objects import ObservedNode, ObservedPod
from gpufence.kube.placement_notes import BindNote, MemberPlan
from gpufence.kube.pods import PodProblem, changeable, read_pod
from gpufence.kube.state_record import ANN_FAIR_SHARE, ANN_PREEMPTIONS, ANN_REQUEUED, decode
from gpufence.kube.waits import waiting_reason
from gpufence.model.decisions import Reason
from gpufence.model.events import CheckpointAck, JobUpdated
from gpufence.spec import SpecError
from gpufence.testing.builders import job

ACTIVITY = "gpufence.io/gpu-activity"
HUGE = "1" + "0" * 400  # an integer Python reads, too large for a float


def _pod(annotations: dict[str, str], **labels: str) -> ObservedPod:
    return ObservedPod(
        namespace="team",
        name="p",
        uid="uid-p",
        scheduler_name="gpufence",
        node="",
        phase="Pending",
        deleting=False,
        labels=labels,
        annotations=annotations,
        requests={"nvidia.com/gpu": Decimal(1)},
        created=100.0,
    )


# -- values a tenant writes on its own pod ----------------------------------------------------


@pytest.mark.parametrize(
    "annotations",
    [
        {"gpufence.io/priority": HUGE},
        {"gpufence.io/priority": "-" + HUGE},
        {"gpufence.io/gang-name": "g", "gpufence.io/gang-size": HUGE},
        {"gpufence.io/gpu-fraction": "0.5", "gpufence.io/gpu-memory-mib": HUGE},
    ],
)
def test_an_integer_too_large_for_a_float_is_refused_naming_the_key(
    annotations: dict[str, str],
) -> None:
    """It raised OverflowError out of read_pod: the loop does not catch it, so one tenant's
    pod stopped the scheduler (and every restart met the same pod again)."""
    key = next(k for k, v in annotations.items() if HUGE in v)
    got = read_pod(_pod(annotations), {})
    assert isinstance(got, PodProblem) and key in got.message, got


def test_a_running_job_annotated_with_a_huge_priority_changes_nothing() -> None:
    with pytest.raises(ValueError, match=r"gpufence\.io/priority"):
        changeable(_pod({"gpufence.io/priority": HUGE}))


def test_a_huge_annotation_value_is_not_repeated_whole_in_the_pods_condition() -> None:
    """The refusal is written on the pod (a condition, an Event): a 200 KB value is cut."""
    for key in ("gpufence.io/priority", "gpufence.io/time-limit-s", "gpufence.io/checkpointable"):
        got = read_pod(_pod({key: "9x" * 100_000}), {})
        assert isinstance(got, PodProblem) and key in got.message
        assert len(got.message) < 400, (key, len(got.message))


# -- the notebook's activity annotation -------------------------------------------------------


@pytest.mark.parametrize("value", ["0.5 inf", "0.5 nan", "0.5 1e400", "nan 1e30", "-1 x"])
def test_an_activity_stamp_that_is_not_a_time_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match=r"gpufence\.io/gpu-activity"):
        read_activity(value)


def test_an_unreadable_activity_value_is_cut_in_the_message() -> None:
    with pytest.raises(ValueError) as got:
        read_activity("x" * (1 << 20))
    assert len(str(got.value)) < 400


def test_a_far_future_activity_stamp_does_not_silence_the_samples_after_it() -> None:
    """A sidecar that once wrote milliseconds (or a clock years ahead) stamped the pod with a
    time no later sample could pass: every real sample after it was taken for "the same one
    again", and the busy notebook looked idle to the core until its GPUs were taken back."""
    feed = ActivityFeed(max_age_s=120)
    pod = replace(_pod({}), node="n0", phase="Running")
    feed.pod_seen(replace(pod, annotations={ACTIVITY: "0.9 1765000000000"}), 1000.0)
    assert feed._pending == {}  # not recent: not a sample
    feed.pod_seen(replace(pod, annotations={ACTIVITY: "0.8 1001"}), 1001.0)
    assert feed._pending == {"team/p": 0.8}


# -- the state Lease, edited by hand ----------------------------------------------------------


@pytest.mark.parametrize(
    "annotations",
    [
        {ANN_PREEMPTIONS: "[" * 100_000},
        {ANN_REQUEUED: "[" * 100_000},
        {ANN_FAIR_SHARE: '{"at": 1, "usage": ' + "[" * 100_000 + "}"},
        {ANN_REQUEUED: '{"Job/u": ["team/j", 1e999]}'},
    ],
)
def test_a_garbage_state_record_is_dropped_and_said_never_a_crash(
    annotations: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="gpufence.kube"):
        saved = decode(annotations)
    assert (saved.windows, saved.usage, saved.awaiting) == ({}, None, {})
    (key,) = annotations
    assert any(key in r.getMessage() for r in caplog.records), caplog.text


@pytest.mark.parametrize(
    "annotations",
    [
        {ANN_REQUEUED: '{"Job/u": ["team/j", -3]}'},
        {ANN_REQUEUED: '{"Job/u": ["team/j", 0]}'},
        {ANN_REQUEUED: '{"Job/u": [{"x": 1}, 2]}'},
        {ANN_PREEMPTIONS: '{"training": "1765000000"}'},
        {ANN_FAIR_SHARE: '{"at": 1, "usage": {"q": "12"}}'},
    ],
)
def test_a_state_record_of_the_wrong_shape_is_dropped_not_guessed(
    annotations: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """An attempt below 1, a job id that is not a string, a time list that is a string (read
    before as its characters: times 1, 7, 6, ...) are not what gpufence wrote."""
    with caplog.at_level(logging.ERROR, logger="gpufence.kube"):
        saved = decode(annotations)
    assert (saved.windows, saved.usage, saved.awaiting) == ({}, None, {})
    (key,) = annotations
    assert any(key in r.getMessage() for r in caplog.records), caplog.text


# -- the cluster YAML with typos --------------------------------------------------------------

_PART = {"node_selector": {"f": "t"}, "admits": ["training"]}


def _spec_error(data: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as got:
        fence_spec_from_dict(data)
    return str(got.value)


def test_partitions_written_as_a_list_is_an_error_naming_the_field() -> None:
    msg = _spec_error({"name": "t", "partitions": [{"name": "train", **_PART}]})
    assert "partitions" in msg and "mapping" in msg, msg


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_nominal_quota_that_is_not_a_number_is_an_error_naming_the_field(value: float) -> None:
    queues = [{"name": "a", "partition": "train", "nominal_gpus": value}]
    msg = _spec_error({"name": "t", "partitions": {"train": _PART}, "queues": queues})
    assert "queues[0].nominal_gpus" in msg, msg


def test_a_lending_cap_of_inf_is_an_error_naming_the_field() -> None:
    part = {**_PART, "lending": [{"to": ["other"], "cap_gpus": float("inf")}]}
    other = {"node_selector": {"f": "o"}, "admits": ["training"]}
    msg = _spec_error({"name": "t", "partitions": {"train": part, "other": other}})
    assert "partitions.train.lending[0].cap_gpus" in msg, msg


def test_a_nominal_quota_with_extra_zeros_is_refused_at_once_not_built() -> None:
    """``nominal_gpus: 100000000`` (a typo) built a virtual node of that many GPUs to check
    the file: minutes and gigabytes, then the out-of-memory killer."""
    queues = [{"name": "a", "partition": "train", "nominal_gpus": 100_000_000}]
    t0 = time.monotonic()
    msg = _spec_error({"name": "t", "partitions": {"train": _PART}, "queues": queues})
    assert time.monotonic() - t0 < 5
    assert "queues[0].nominal_gpus" in msg and "100000000" in msg, msg


@pytest.mark.parametrize("typo", ["node_selecter", "nodeSelector", "node_selectors"])
def test_a_misspelt_node_selector_is_named_with_the_kubernetes_fields(typo: str) -> None:
    """The local schema's 'unknown field' listed nodes and gpus (refused on Kubernetes) and
    not node_selector, so the typo got no 'did you mean': the allowed fields are Kubernetes'."""
    part = {typo: {"f": "t"}, "admits": ["training"]}
    msg = _spec_error({"name": "t", "partitions": {"train": part}})
    line = next(x for x in msg.splitlines() if f"partitions.train.{typo}" in x)
    assert "did you mean 'node_selector'?" in line, msg
    allowed = line.split("allowed: ", 1)[1].split(")", 1)[0].split(", ")
    assert "node_selector" in allowed and "nodes" not in allowed and "gpus" not in allowed, line


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("scheduler_name", "GPUfence"),
        ("scheduler_name", "gpufence "),
        ("rack_label", "my rack"),
        ("nvlink_label", "gpufence.io/nvlink domains"),
        ("tolerated_taints", ["gpu only"]),
    ],
)
def test_a_kubernetes_name_no_object_can_carry_is_an_error(field: str, value: object) -> None:
    """A pod's spec.schedulerName must be a DNS subdomain and label/taint keys follow the label
    key rule: a name outside them matches nothing, and the scheduler waited, silently, for pods
    that could never name it."""
    msg = _spec_error({"name": "t", "kubernetes": {field: value}, "partitions": {"train": _PART}})
    assert f"kubernetes.{field}" in msg, msg


# -- foreign pods that opt in to preemption ---------------------------------------------------


@pytest.mark.parametrize("gang", ["annotations", "podgroup"])
def test_members_of_a_foreign_gang_are_not_adopted_under_one_job_id(gang: str) -> None:
    """Each adopted pod became a job with its gang's id ("team/@g"): the second member's
    JobRestored clashed with the first's (RestoreConflict), the loop disowned the id -- and the
    tracker forgot the first member while the core kept its GPUs booked, so its notice, its
    eviction and its end were never carried out. A gang member is refused: evicting one
    member alone would break the gang the other scheduler placed whole."""
    t, s = _world()
    members = []
    for name in ("a", "b"):
        p = replace(
            _pod({}, **{"gpufence.io/preemptible": "true"}),
            name=name,
            uid=f"uid-{name}",
            scheduler_name="default-scheduler",
            node="n0",
            phase="Running",
        )
        if gang == "podgroup":
            p = replace(p, group="pg")
        else:
            ann = {"gpufence.io/gang-name": "g", "gpufence.io/gang-size": "2"}
            p = replace(p, annotations=ann)
        members.append(p)
    got = adopt(t, s.cluster, members, [])
    assert got.events == [] and t.jobs == {}
    assert set(got.refused) == {"team/a", "team/b"}
    assert all("gang" in why for why in got.refused.values()), got.refused


# -- what the core refuses, in the pod's words --------------------------------------------------


@pytest.mark.parametrize(
    ("annotations", "key"),
    [
        ({"gpufence.io/est-runtime-s": "1e300"}, "gpufence.io/est-runtime-s"),
        ({"gpufence.io/time-limit-s": "1e300"}, "gpufence.io/time-limit-s"),
        ({"gpufence.io/priority": "99999999999"}, "gpufence.io/priority"),
    ],
)
def test_a_value_the_core_refuses_is_named_by_its_annotation(
    annotations: dict[str, str], key: str
) -> None:
    """The core names its own fields ("est_runtime_s must be between 0 and 1e12"): on a pod
    the user wrote an annotation, and is told which."""
    t, s = _world()
    t.pod_seen(_pod(annotations))
    t.submit_ready()
    events, _ = t.take()
    t.decide(s.cluster, s.step(events, 1000.0), 1000.0)
    [shown] = [a for a in t.take()[1] if isinstance(a, ShowPending)]
    assert shown.reason == "gpufence/Rejected" and f"annotation {key}" in shown.message, shown


# -- notices and their acks -------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", ["incident-preemption nan", "incident-preemption inf", "idle -inf", "idle 1e999"]
)
def test_a_notice_whose_deadline_is_no_time_is_not_one_gpufence_wrote(value: str) -> None:
    """A restart takes a notice back from the pod (Tracker._restored_notice); one with a NaN
    or infinite deadline (a forged one, where deploy/07's policy is not installed) became a
    notice the core's deadline never reached: the victim never stopped and the job waiting
    for its GPUs waited for ever."""
    assert read_notice(value) is None


def test_an_ack_with_a_trailing_newline_acknowledges_the_notice() -> None:
    """A workload that copies the notice through a file or ``echo`` adds a newline: the copy
    is still of the notice in flight (an older notice's value still acknowledges nothing)."""
    t, _ = _world()
    value = notice_value(Reason.INCIDENT_PREEMPTION, 1120.0)
    running = replace(_pod({}), node="n0", phase="Running")
    t.pods[running.key] = running
    t.jobs["team/p"] = CoreJob(job("team/p").build(), "team", ("p",), {"p": running.uid})
    t.pod_job[running.key] = "team/p"
    t.jobs["team/p"].phase, t.jobs["team/p"].notice = "running", value
    t.pod_seen(replace(running, annotations={ANN_CHECKPOINTED: "incident-preemption 999\n"}))
    assert t.take()[0] == []
    t.pod_seen(replace(running, annotations={ANN_CHECKPOINTED: f" {value}\n"}))
    assert t.take()[0] == [CheckpointAck("team/p")]


# -- placement notes the scheduler did not write ----------------------------------------------


@pytest.mark.parametrize(
    "damage",
    [
        {"gpufence.io/gang-plan": "[" * 100_000},  # RecursionError out of the restore
        {"gpufence.io/gang-plan": "[]"},  # a job of no pods
        {"gpufence.io/bound-at": "nan"},  # a start no clock reaches: its limits never end
        {"gpufence.io/bound-at": "inf"},
        {"gpufence.io/attempt": "0"},
        {"gpufence.io/attempt": "-4"},
    ],
)
def test_a_placement_note_gpufence_could_not_have_written_is_no_note(
    damage: dict[str, str],
) -> None:
    """deploy/06's policy keeps tenants from writing notes; without it (or by an operator
    re-creating a pod from another's YAML) a note is read at every restart: a damaged one is
    left alone (the pod counts as foreign usage), never a crash of the restore."""
    note = BindNote("team/p", "training", None, 1, 1000.0, (MemberPlan("p", "n0", (0,)),))
    assert BindNote.read(note.annotations("p")) == note
    assert BindNote.read({**note.annotations("p"), **damage}) is None


@pytest.mark.parametrize(
    "value",
    [
        "[" * 100_000,
        '{"config":"c","layouts":[["1g.10gb@0"]],"gpus":[1e999],"at":1,"job":""}',
    ],
)
def test_a_hand_edited_mig_recut_note_on_a_node_is_dropped(value: str) -> None:
    """gpufence.io/mig-recut (gpufence's record of a re-cut it asked for) is read from every
    node at start-up: RecursionError / OverflowError escaped Recut.read and stopped it."""
    assert Recut.read("n0", value) is None


# -- nodes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mig", [False, True])
def test_a_node_reporting_more_gpus_than_a_node_holds_is_left_out_and_named(mig: bool) -> None:
    """A fake node patched with nvidia.com/gpu: 200000 (or, with MIG's mixed strategy, a
    nvidia.com/gpu.count label with extra zeros) was modelled GPU by GPU: at 10^8 the
    scheduler ran out of memory. It is left out, named with the figure, as a node in no
    fence is."""
    spec = fence_spec_from_dict(
        {"name": "t", "partitions": {"train": {**_PART, "node_selector": {}}}}
    )
    labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    sane = ObservedNode("n0", labels, 8, {}, 64000, 512 * 1024, True)
    if mig:
        big = ObservedNode(
            "big",
            {**labels, "nvidia.com/gpu.count": "200000"},
            0,
            {"1g.10gb": 7},
            64000,
            512 * 1024,
            True,
        )
    else:
        big = ObservedNode("big", labels, 200_000, {}, 64000, 512 * 1024, True)
    hw = build_hardware(spec, [sane, big])
    assert [n.name for n in hw.cluster.nodes] == ["n0"] and len(hw.cluster.gpus) == 8
    assert any("big" in p and "200000" in p for p in hw.problems), hw.problems


def test_a_mig_parted_config_entry_without_mig_devices_is_checked_not_a_traceback() -> None:
    """An entry that turns MIG off carries no mig-devices (NVIDIA's own all-disabled config
    is written so): read_configs accepts it, and the check of a hand-edited file under one of
    gpufence's config names then raised KeyError ('gpufence k8s mig-configs --check' printed
    a traceback). It is a config that does not cut the GPU: reported as missing."""
    combo = (full_layouts("A100-40GB")[0],)
    name = config_name(combo)
    data = {"version": "v1", "mig-configs": {name: [{"devices": "all", "mig-enabled": False}]}}
    lacking = missing(read_configs(data), "A100-40GB", [1])
    assert any(line.startswith(name) for line in lacking), lacking


# -- changes annotated on a running pod -------------------------------------------------------


def test_a_change_a_running_pod_cannot_take_is_said_on_it_once() -> None:
    """``kubectl annotate --overwrite`` of time-limit-s "10m" or priority 99999999999 on a
    running pod changed nothing and said nothing (the core drops an update it refuses, and an
    unreadable value was skipped): the user believed the new limit was in force. Now an Event
    on the pod names the annotation, once per value (not at every other change of the pod)."""
    t, s = _world()
    t.pod_seen(_pod({}))
    t.submit_ready()
    events, _ = t.take()
    t.decide(s.cluster, s.step(events, 1000.0), 1000.0)
    t.take()
    running = replace(_pod({}), node="n0", phase="Running")
    t.pod_seen(running)
    for ann, key in (
        ({"gpufence.io/time-limit-s": "10m"}, "gpufence.io/time-limit-s"),
        ({"gpufence.io/priority": "99999999999"}, "gpufence.io/priority"),
    ):
        t.pod_seen(replace(running, annotations=ann))
        events, actions = t.take()
        assert events == []  # the job keeps what it had
        [said] = [a for a in actions if isinstance(a, PodEvent)]
        assert (said.pod, said.reason) == ("p", "UpdateRefused") and key in said.message, said
        t.pod_seen(replace(running, annotations={**ann, ACTIVITY: "0.5 1001"}))
        assert t.take() == ([], [])  # the same refusal is not said again
    t.pod_seen(replace(running, annotations={"gpufence.io/priority": "7"}))
    assert t.take() == ([JobUpdated("team/p", priority=7)], [])


@pytest.mark.parametrize("deadline", [1e12, 1e20])
def test_a_deadline_past_the_calendar_is_said_not_a_crash(deadline: float) -> None:
    """A fence whose grace_s or reclaim_deadline_s is huge ('never force it': 1e12) gives
    notices with such deadlines; the waiting job's reason formatted the deadline as a clock
    time and datetime raised (year 33658 is out of range) in the loop, every cycle."""
    t, _ = _world()
    said, gist = waiting_reason({"team/a": deadline}, t, {}, 1000.0) or ("", "")
    assert said.startswith("waiting for team/a to checkpoint, deadline in ")
    assert "team/a" in gist


# -- the loop ---------------------------------------------------------------------------------


class _NoApi:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"api.{name} called")


def test_a_preemptible_pod_that_cannot_be_adopted_does_not_rebuild_the_model_for_ever(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Any pod in the cluster labelled gpufence.io/preemptible=true that cannot be adopted (a
    web server on a CPU node, say) was refused at every rebuild, and each refusal asked for
    another: a fresh core built and restored from every pod every 2 s, for as long as the pod
    lived (the refusal logged each time). It is refused once and stays used capacity."""
    now = [1000.0]
    api = cast(KubeApi, _NoApi())
    loop = KubeScheduler(api, fence_spec_from_dict(FENCES), clock=lambda: now[0])
    loop.runner.run = lambda actions: None  # type: ignore[method-assign]
    gpu = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    for name, gpus in (("n0", 4), ("cpu", 0)):
        loop.nodes[name] = ObservedNode(
            name, gpu if gpus else {}, gpus, {}, 64000, 512 * 1024, True
        )
    web = replace(
        _pod({}, **{"gpufence.io/preemptible": "true"}),
        scheduler_name="default-scheduler",
        node="cpu",
        phase="Running",
        requests={},
    )
    with caplog.at_level(logging.INFO, logger="gpufence.kube"):
        loop._pod_seen(web)
        for _ in range(20):
            loop.cycle()
            now[0] += 1.0
    assert loop.stats.rebuilds <= 2, loop.stats.rebuilds
    assert sum("not adopting team/p" in r.getMessage() for r in caplog.records) == 1


def test_a_pod_bound_by_hand_rebuilds_the_model_when_its_usage_changes_not_at_each_write() -> None:
    """A tenant's pod naming gpufence but created with spec.nodeName (bound by hand) is used
    capacity; each change of it rebuilt the model -- a sidecar refreshing an annotation every
    second kept the scheduler rebuilding every 2 s. Now: when it starts or stops being used
    capacity, or what it uses changes (and when it is gone: its GPUs are free again)."""
    now = [1000.0]
    api = cast(KubeApi, _NoApi())
    loop = KubeScheduler(api, fence_spec_from_dict(FENCES), clock=lambda: now[0])
    loop.runner.run = lambda actions: None  # type: ignore[method-assign]
    gpu = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    loop.nodes["n0"] = ObservedNode("n0", gpu, 4, {}, 64000, 512 * 1024, True)
    by_hand = replace(_pod({}), node="n0", phase="Running")
    for _ in range(20):
        loop._pod_seen(replace(by_hand, annotations={ACTIVITY: f"0.5 {now[0]:.0f}"}))
        loop.cycle()
        now[0] += 1.0
    assert loop.stats.rebuilds == 1, loop.stats.rebuilds
    assert loop.hardware is not None and len(loop.hardware.cluster.gpus) == 3  # 1 is its
    loop._pod_gone(by_hand.key)
    for _ in range(3):
        loop.cycle()
        now[0] += 1.0
    assert loop.stats.rebuilds == 2 and len(loop.hardware.cluster.gpus) == 4
