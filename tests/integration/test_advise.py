"""``gpufence advise`` against a real server (8 fake GPUs, real processes, real SQLite).

The demo's fenced machine (serving GPUs 0-1, training 2-5, interactive 6-7) runs its serving
surge three times in a short window; the advice period is shortened to 2 s so that three surges
are three "days". ``gpufence advise`` must then say the serving reserve is too small and give
the size: the observed peak of 4 serving GPUs (2 replicas + a surge of 2), on a one-node machine
(no failure margin possible), so 4 GPUs: serving ``local:0-3``, training ``local:4-5``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpufence.cli.main import app
from gpufence.control.base.config import SERVER_FILE
from gpufence.control.base.jobspec import SubmitRequest
from gpufence.control.gpus.discovery import fake_gpus
from gpufence.control.http.client import Client
from gpufence.control.http.server import build_plane, serve
from gpufence.control.plane import ControlPlane
from gpufence.control.store import database as st
from gpufence.demo.live import fenced_spec
from gpufence.testing.waiting import until

ADMIN = "admin-token-advise-0123"
TENANT = "tenant-token-advise-01"
JOB = [sys.executable, "-m", "gpufence.demo.programs"]
PERIOD_S = 2.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, ControlPlane]]:
    spec: dict[str, Any] = fenced_spec(fake_gpus(8))
    spec["partitions"]["serving"]["preemption"].update(budget=10, grace_s=5)
    spec["control"] = {
        "auth": {"admin_token": ADMIN, "tenants": {"team-a": {"token": TENANT}}},
        # jobs from root's venv under pytest's 0700 tmp dirs: the tenant is explicitly root
        "tenants": {"team-a": {"run_as": "root", "allow_root": True}},
        "stop_grace_s": 3,
        "advice": {"chronic_preemption": {"more_than": 2, "of_last": 30, "period_s": PERIOD_S}},
    }
    cfg = tmp_path / "fenced.yaml"
    cfg.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    data = tmp_path / "data"
    plane = build_plane(cfg, data, 8, "H100-80GB")
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=serve,
        args=(plane, "127.0.0.1", 0, ready, stop),
        kwargs={"kill_jobs": True, "log_level": "warning"},
        daemon=True,
    )
    thread.start()
    assert ready.wait(30), "server did not start"
    url = json.loads((data / SERVER_FILE).read_text())["url"]
    yield url, plane
    stop.set()
    thread.join(30)


def _req(*args: str, **fields: Any) -> dict[str, Any]:
    return SubmitRequest.model_validate({"command": [*JOB, *args], **fields}).stored()


def _all_done(client: Client, job_ids: list[str]) -> bool:
    return all(client.job(j)["state"] == st.DONE for j in job_ids)


def _preempted(plane: ControlPlane, times: int) -> bool:
    return _preemptions(plane) >= times


def _handler_ready(plane: ControlPlane, job_id: str) -> bool:
    """The gang's current attempt runs and has its notice handler in place."""
    with plane.store.reader() as r:
        row = r.job(job_id)
    if row is None or row.state != st.RUNNING:
        return False
    log = plane.log_path(job_id, row.attempt)
    return log.exists() and '"resume"' in log.read_text()


def _preemptions(plane: ControlPlane) -> int:
    with plane.store.reader() as r:
        return sum(
            1
            for e in r.events(limit=100_000)
            if (e["kind"], e["reason"]) == ("stop", "incident-preemption")
        )


def test_three_surges_make_advise_grow_the_serving_fence(
    server: tuple[str, ControlPlane],
) -> None:
    url, plane = server
    client = Client(url=url, token=ADMIN)
    for _ in range(2):  # the serving deployment: two replicas that run until scaled down
        client.submit(_req("serve", **{"class": "serving"}))
    train = client.submit(
        _req(
            "train",
            "--steps",
            "100000",
            "--step-s",
            "0.05",
            "--ckpt-every",
            "20",
            replicas=2,
            gpus=2,
            checkpointable=True,
        )
    )["id"]
    for n in range(1, 4):
        until(lambda: _handler_ready(plane, train), 30, f"the gang running before surge {n}")
        surge = [
            client.submit(_req("serve", "--seconds", "1", **{"class": "serving"}))["id"]
            for _ in range(2)
        ]
        until(partial(_all_done, client, surge), 40, f"surge {n} done")
        until(partial(_preempted, plane, n), 10, f"preemption {n}")
        until(lambda: _handler_ready(plane, train), 30, f"the gang back after surge {n}")
        if n < 3:
            time.sleep(PERIOD_S)  # the next surge falls into the next advice period

    res = CliRunner().invoke(app, ["advise", "--url", url, "--token", ADMIN])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "[chronic-preemption]" in out
    assert "3 preemptions for serving on 3 of the last" in out
    assert "fenced.yaml:" in out  # file:line of the field to change
    assert "Grow the serving reserve serving from 2 to 4 GPUs" in out
    assert '+     gpus: ["local:0-3"]' in out  # the spec diff: serving takes GPUs 2-3
    assert '+     gpus: ["local:4-5"]' in out  # ... from training
    advice = client.advice()["advice"]
    chronic = next(a for a in advice if a["rule"] == "chronic-preemption")
    assert chronic["evidence"]["recommended_gpus"] == 4
    assert chronic["evidence"]["peak_serving_gpus"] == 4
    assert chronic["evidence"]["preemptions"] == 3
    assert chronic["evidence"]["victims"] == [train]
    # the same peak is not reported twice (serving-no-failure-margin is folded into it)
    assert [a["rule"] for a in advice].count("serving-no-failure-margin") == 0
    # --strict: a warning is an exit code for cron / CI
    strict = CliRunner().invoke(app, ["advise", "--url", url, "--token", ADMIN, "--strict"])
    assert strict.exit_code == 2
    # a tenant sees advice about its own jobs only: it has none, and the cluster's is hidden
    mine = Client(url=url, token=TENANT).advice()
    assert mine["advice"] == [] and mine["scope"] == "jobs of tenant team-a"
