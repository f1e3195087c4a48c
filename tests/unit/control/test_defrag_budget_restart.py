"""The MIG defrag budget survives a restart of the local control plane: the stops noticed in the
window are saved in the store with each notice (``Tx.save_defrags``) and handed back to the
rebuilt core (``DefragsRestored``), as the incident preemption budget is. Without it a crash
loop would hand every MIG pool a fresh ``defrag_budget`` each start.

Through a real SQLite store and the fake NVML (the GPUs, and so their MIG instances, outlive
the plane); restart = a new reconciler on the same data directory, rebuilt by ``recover``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufence.control.gpus.discovery import discover
from gpufence.control.store import database as st
from gpufence.testing.fake_nvml import FakeNvml, hgx_h100
from gpufence.testing.reconciler_rig import ReconcilerRig

WINDOW_S = 3600.0


def spec() -> dict[str, Any]:
    """3 MIG GPUs, dynamic, a defrag budget of 1 stop an hour (min_runtime_s: the default 600)."""
    mig = {
        "layout": [],
        "dynamic": True,
        "reconfigure_delay_s": 30,
        "defrag_budget": 1,
        "defrag_window_s": WINDOW_S,
    }
    return {
        "name": "box",
        "node_groups": [{"name": "box", "count": 1, "gpus_per_node": 3, "gpu_type": "H100-80GB"}],
        "partitions": {
            "m": {"nodes": ["box"], "admits": ["batch", "training"], "sharing": "mig", "mig": mig}
        },
    }


def _run(rig: ReconcilerRig, seconds: float) -> None:
    rig.advance(seconds)
    rig.cycle()


def test_a_spent_defrag_budget_stays_spent_after_a_restart(tmp_path: Path) -> None:
    """Checkpointable 4g jobs a, b, e on one GPU each; the 7g job c stops a (the hour's one
    defrag stop) and runs on its GPU; a gives up. The plane restarts. The 7g job d then waits
    (budget spent) instead of stopping b or e at once, and stops one when the window has slid
    past a's stop."""
    nvml = FakeNvml(hgx_h100(3, mig=3))
    rig = ReconcilerRig.make(tmp_path, spec(), discovery=discover(nvml), nvml=nvml)
    rig.rec.boot(rig.rec.mig.startup(), [])  # what ControlPlane.start does before recovery
    t0 = rig.now
    a, b, e = (rig.submit(command=[x], mig="4g.40gb", checkpointable=True).job_id for x in "abe")
    _run(rig, 1)
    assert [rig.job(j).state for j in (a, b, e)] == [st.RUNNING] * 3
    rig.advance(700 - (rig.now - t0))  # past min_runtime_s: they may be stopped
    c = rig.submit(command=["c"], mig="7g.80gb").job_id
    assert [(n.job_id, n.reason) for n in rig.ex.notices] == [(a, "mig-defrag")]
    stopped_at = rig.now
    rig.ex.ack(a)
    rig.cycle()
    rig.ex.exit(a, 1, (-15,))
    rig.cycle()
    _run(rig, 1)  # (the GPU re-cut for c through the fake NVML)
    assert rig.job(c).state == st.RUNNING
    assert rig.cancel(a) == st.CANCELLED
    assert rig.preemptions(a) == 1  # (the store's accounting counts a defrag stop as one)
    with rig.store.reader() as r:
        assert r.defrags() == {"m": [stopped_at]}  # saved with the notice
    rig.advance(60)

    new, counts = rig.restart(spec(), adopt={(b, 1): True, (c, 1): True, (e, 1): True}, nvml=nvml)
    assert counts["adopted"] == 3
    new.cycle()
    d = new.submit(command=["d"], mig="7g.80gb").job_id
    _run(new, 1)
    assert new.ex.notices == []  # was: b noticed at once, a second stop in the hour
    why = new.rec.scheduler.why_pending(d)
    assert why is not None and str(why.reason) == "preemption-budget", why
    assert "MIG defrag budget spent (1 of 1 in 3600 s" in why.message
    assert new.rec.scheduler.query.defrag_windows() == {"m": (stopped_at,)}

    new.advance(stopped_at + WINDOW_S - new.now)  # the window slides past a's stop
    new.cycle()
    assert [(n.job_id, n.reason) for n in new.ex.notices] == [(b, "mig-defrag")]
