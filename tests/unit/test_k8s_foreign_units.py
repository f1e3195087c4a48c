"""Pods of other schedulers (kube/foreign.py): only an opted-in, bound, live one is adopted, on
GPUs of its node that gpufence's restored jobs do not hold, as a checkpointable job; the rest
stay used capacity, and a pending reason names what they hold."""

from __future__ import annotations

from dataclasses import replace

from test_k8s_translation import _world, pod

from gpufence.kube.foreign import adopt, foreign_note
from gpufence.model.decisions import Assignment
from gpufence.model.events import JobRestored
from gpufence.testing.builders import job

OPT_IN = {"gpufence.io/preemptible": "true"}


def _theirs(name: str, gpus: int, **kw: object) -> object:
    return replace(pod(name, gpus, **kw), scheduler_name="default-scheduler")  # type: ignore[arg-type]


def test_only_opted_in_live_bound_foreign_pods_are_adopted_on_gpus_nobody_holds() -> None:
    t, s = _world()
    ours = JobRestored(job("team/x").gpus(2).build(), "training", (Assignment(0, (0, 1)),))
    pods = [
        _theirs("opt", 2, node_name="n0", phase="Running", labels=OPT_IN),
        _theirs("plain", 2, node_name="n0", phase="Running"),
        _theirs("gone", 1, node_name="n1", phase="Succeeded", labels=OPT_IN),
        _theirs("leaving", 1, node_name="n1", phase="Running", labels=OPT_IN, deleting=True),
        _theirs("unbound", 1, labels=OPT_IN),
        replace(pod("mine", 1, node_name="n1", phase="Running"), labels=OPT_IN),
    ]
    got = adopt(t, s.cluster, pods, [ours])  # type: ignore[arg-type]
    assert got.refused == {}
    [ev] = got.events
    assert isinstance(ev, JobRestored)
    assert ev.job.id == "team/opt" and ev.job.checkpointable and ev.pool == "training"
    assert ev.assignments == (Assignment(0, (2, 3)),)  # not GPUs 0-1: team/x holds them
    assert t.pod_job == {"team/opt": "team/opt"} and t.jobs["team/opt"].phase == "running"


def test_a_foreign_pod_larger_than_what_is_left_on_its_node_is_refused() -> None:
    t, s = _world()
    ours = JobRestored(job("team/x").gpus(3).build(), "training", (Assignment(0, (0, 1, 2)),))
    opt = _theirs("opt", 2, node_name="n0", phase="Running", labels=OPT_IN)
    got = adopt(t, s.cluster, [opt], [ours])  # type: ignore[list-item]
    assert got.events == []
    assert got.refused == {"team/opt": "node n0 has 1 GPUs not held by gpufence's pods, it uses 2"}
    assert t.jobs == {}


def test_the_note_names_what_foreign_pods_hold_where_a_job_could_run() -> None:
    held = {"training": {"team/b": 2, "team/a": 1}, "other": {"team/c": 8}}
    assert foreign_note(held, ["serving", "training"]) == (
        "pods of other schedulers hold 3 GPUs of training (team/a: 1, team/b: 2), used "
        "capacity gpufence never preempts (unless labelled gpufence.io/preemptible=true)"
    )
    assert foreign_note(held, ["serving"]) == ""
