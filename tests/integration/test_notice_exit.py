"""A checkpointable job killed by its own time-limit notice ends ``failed (time-limit)``.

``sleep`` does not handle SIGUSR1 (the notice signal): the notice kills it. The core takes an
exit during a notice as a stop the job did itself and, for a time limit, ends the job in the
same step; no JobStopped follows, since nothing is left to stop. The store stayed in
``stopping`` for good (its GPUs released in the core, but the job never ended for its owner).
"""

from __future__ import annotations

from pathlib import Path

from api_helpers import CONFIG, TOKEN_A, call, run_server, submit

from gpufence.testing.waiting import until


def test_a_job_killed_by_its_time_limit_notice_ends_failed(tmp_path: Path) -> None:
    cfg = CONFIG.replace(
        "    sharing: exclusive\n", "    sharing: exclusive\n    preemption: {grace_s: 2}\n"
    )
    srv = run_server(tmp_path, cfg)
    server = next(srv)
    try:
        spec = {"command": ["sleep", "100"], "gpus": 8, "checkpointable": True}
        status, job = submit(server, {**spec, "time_limit_s": 4}, TOKEN_A)
        assert status == 201, job

        def row() -> dict[str, object]:
            code, out, _ = call(server, "GET", f"/v1/jobs/{job['id']}", TOKEN_A)
            assert code == 200, out
            return dict(out)

        until(lambda: row()["ended_at"] is not None, 30, "ended")
        got = row()
        assert (got["state"], got["reason"]) == ("failed", "time-limit"), got
        # and its GPUs are free: a job of the whole node starts
        status, nxt = submit(server, {"command": ["true"], "gpus": 8}, TOKEN_A)
        assert status == 201, nxt
        until(
            lambda: call(server, "GET", f"/v1/jobs/{nxt['id']}", TOKEN_A)[1]["state"] == "done",
            30,
            "the next job done",
        )
    finally:
        next(srv, None)
