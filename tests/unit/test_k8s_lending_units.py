"""The Kubernetes front end's word on a reclaim of lent GPUs (issue 31): a job waiting for
borrowers to give back what a fence lent them is told how many lent GPUs of which fence are
being reclaimed, and from whom, before the countdown."""

from __future__ import annotations

from test_k8s_translation import _world

from gpufence.kube.core_jobs import CoreJob, notice_value
from gpufence.kube.placement_notes import BindNote
from gpufence.kube.waits import waiting_reason
from gpufence.model.decisions import Reason
from gpufence.testing.builders import job


def _borrower(name: str, gpus: int, reason: Reason, deadline: float) -> CoreJob:
    core = CoreJob(job(f"team/{name}").gpus(gpus).build(), "team", (name,), {})
    core.phase, core.notice = "running", notice_value(reason, deadline)
    core.note = BindNote(f"team/{name}", "serving", "serving", 1, 900.0, ())
    return core


def test_the_waiting_reason_names_the_lent_gpus_a_reclaim_takes_back() -> None:
    t, _ = _world()
    t.jobs["team/a"] = _borrower("a", 2, Reason.LENT_RECLAIM, 1042.0)
    t.jobs["team/b"] = _borrower("b", 1, Reason.LENT_RECLAIM, 1042.0)
    said, gist = waiting_reason({"team/a": 1042.0, "team/b": None}, t, {}, 1000.2) or ("", "")
    assert said == (
        "reclaiming 3 lent GPUs of serving from team/a, team/b; "
        "waiting for team/a to checkpoint, deadline in 42 s (at 00:17:22 UTC); "
        "waiting for team/b to stop"
    )
    assert gist.startswith("reclaiming 3 lent GPUs of serving from team/a, team/b; ")


def test_an_incident_notice_is_no_reclaim() -> None:
    t, _ = _world()
    t.jobs["team/a"] = _borrower("a", 1, Reason.INCIDENT_PREEMPTION, 1042.0)
    said, _ = waiting_reason({"team/a": 1042.0}, t, {}, 1000.2) or ("", "")
    assert said == "waiting for team/a to checkpoint, deadline in 42 s (at 00:17:22 UTC)"
