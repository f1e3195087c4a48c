"""Hold, dependencies and array caps survive a control-plane restart (real store, real
processes): a held job is still held, a dependent whose parent ended before the restart runs (or
is cancelled) as it would have, whether it was pending then or submitted after, and an array's
cap still counts its running tasks."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from gpufence.control.base.config import ADMIN, cluster_from_spec_dict, control_config
from gpufence.control.base.jobspec import SubmitRequest
from gpufence.control.gpus.discovery import fake_gpus, node_spec
from gpufence.control.plane import ControlPlane
from gpufence.control.store import database as st
from gpufence.testing.waiting import until, until_value

pytestmark = pytest.mark.slow  # two control planes one after the other (~15 s)


def _req(*command: str, **fields: Any) -> SubmitRequest:
    return SubmitRequest.model_validate({"command": list(command), **fields})


def _row(p: ControlPlane, jid: str) -> st.JobRow:
    row = p.job(jid, ADMIN)
    assert row is not None
    return row


def _why(p: ControlPlane, jid: str) -> dict[str, str]:
    return until_value(
        lambda: p.pending_reasons([jid]).get(jid) or {},
        lambda w: w.get("reason") not in (None, "queued"),
        10,
        f"why {jid} waits",
    )


def test_gates_survive_a_restart(tmp_path: Path) -> None:
    cfg = control_config({"stop_grace_s": 1}, tmp_path)
    spec = node_spec(fake_gpus(8))

    def start() -> ControlPlane:
        p = ControlPlane(cluster_from_spec_dict(spec), cfg, fake_gpus(8), tmp_path / "data")
        p.start()
        return p

    p = start()
    try:
        ok = p.submit(_req("true"), ADMIN).job_id
        bad = p.submit(_req(sys.executable, "-c", "raise SystemExit(6)"), ADMIN).job_id
        until(lambda: _row(p, ok).state == st.DONE and _row(p, bad).state == st.FAILED, 30, "ended")
        held = p.submit(_req("true", hold=True, after_ok=[ok]), ADMIN).job_id
        array = p.submit(_req("sleep", "30", array="0-2%1"), ADMIN)
        first, *rest = array.tasks
        until(lambda: _row(p, first).state == st.RUNNING, 30, f"{first} running")
        assert _why(p, held)["reason"] == "held"
        # held after submit / released after a submit on hold: the hold is state, not spec
        late = p.submit(_req("true", after_ok=[first]), ADMIN).job_id
        freed = p.submit(_req("true", hold=True, after_ok=[first]), ADMIN).job_id
        p.reconciler.action(late, "hold").result(10)
        p.reconciler.action(freed, "release").result(10)
        assert _why(p, late)["reason"] == "held" and _why(p, freed)["reason"] == "dependency"
    finally:
        p.close()  # the array's first task keeps running: adopted by the next start
    p = start()
    try:
        assert _row(p, held).held and _why(p, held)["reason"] == "held"
        assert _why(p, late)["reason"] == "held" and _why(p, freed)["reason"] == "dependency"
        assert _why(p, rest[0])["reason"] == "array-limit"  # the adopted task holds the slot
        p.reconciler.action(held, "release").result(10)
        until(lambda: _row(p, held).state == st.DONE, 30, f"{held} done after the restart")
        # a parent that ended before this start, named by a new submit
        doomed = p.submit(_req("true", after_ok=[bad]), ADMIN).job_id
        until(lambda: _row(p, doomed).state == st.CANCELLED, 30, f"{doomed} cancelled")
        assert _row(p, doomed).message == f"dependency can never be met: {bad} failed"
        p.cancel(first, ADMIN)
        until(lambda: _row(p, rest[0]).state == st.RUNNING, 30, "the next task starts")
        assert _row(p, rest[1]).state == st.PENDING
    finally:
        p.close(kill_jobs=True)
