"""``gpufence history`` and ``gpufence usage`` through a real server after real jobs ran (8 fake
GPUs fenced into whole GPUs, fractional shares and MIG instances; two tenants), ``-o json``
parsed and checked: states, exit codes, attempts, GPU-equivalents, GPU-hours = elapsed x GPUs,
elapsed against what the jobs themselves slept; a tenant never sees another's rows."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from api_helpers import ADMIN, TOKEN_A, TOKEN_B, Server, call, run_server, submit, wait_state
from typer.testing import CliRunner

from gpufence.cli.main import app

CONFIG = f"""
name: accounting-test
node_groups:
  - {{name: local, count: 1, gpus_per_node: 8, gpu_type: H100-80GB, nvlink_domains: [8]}}
partitions:
  train: {{gpus: ["local:0-3"], admits: [training, batch], sharing: exclusive}}
  share: {{gpus: ["local:4-5"], admits: [interactive], sharing: fractional}}
  slices:
    gpus: ["local:6-7"]
    admits: [serving]
    sharing: mig
    mig: {{layout: ["3g.40gb", "3g.40gb"]}}
control:
  auth:
    admin_token: "{ADMIN}"
    tenants:
      team-a: {{token: "{TOKEN_A}"}}
      team-b: {{token: "{TOKEN_B}"}}
  # test servers under pytest's 0700 tmp dirs, jobs from root's venv: explicitly root
  tenants:
    team-a: {{run_as: root, allow_root: true}}
    team-b: {{run_as: root, allow_root: true}}
  stop_grace_s: 2
"""


def _sleep_then(seconds: float, code: int) -> list[str]:
    return [sys.executable, "-c", f"import time, sys; time.sleep({seconds}); sys.exit({code})"]


# name, token, request, slept (s), expected state, exit code, GPU-equivalents held
JOBS: list[tuple[str, str, dict[str, Any], float, str, int | None, float]] = [
    ("a-two", TOKEN_A, {"gpus": 2, "class": "training"}, 1.5, "done", 0, 2.0),
    ("a-fail", TOKEN_A, {"gpus": 1, "class": "batch"}, 0.5, "failed", 3, 1.0),
    ("b-half", TOKEN_B, {"gpu_fraction": 0.5, "class": "interactive"}, 1.0, "done", 0, 0.5),
    ("b-mig", TOKEN_B, {"mig": "3g.40gb", "class": "serving"}, 1.0, "done", 0, 0.429),
    ("b-cancel", TOKEN_B, {"gpus": 1, "class": "training"}, 60.0, "cancelled", None, 1.0),
]
EXIT = {"a-fail": 3}
TENANT = {TOKEN_A: "team-a", TOKEN_B: "team-b"}


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, str]]]:
    """The server, after every job of ``JOBS`` ended; name -> job id."""
    for srv in run_server(tmp_path_factory.mktemp("acct"), CONFIG):
        ids: dict[str, str] = {}
        for name, token, req, slept, _state, _code, _gpus in JOBS:
            body = {"command": _sleep_then(slept, EXIT.get(name, 0)), "name": name, **req}
            status, out = submit(srv, body, token)
            assert status == 201, out
            ids[name] = out["id"]
        wait_state(srv, ids["b-cancel"], ("running",))
        time.sleep(1.0)  # it holds its GPU a while before it is cancelled
        status, out, _ = call(srv, "POST", f"/v1/jobs/{ids['b-cancel']}/cancel", ADMIN)
        assert status == 200, out
        for jid in ids.values():
            wait_state(srv, jid, ("done", "failed", "cancelled"), timeout=60)
        yield srv, ids


def _cli(srv: Server, token: str, *args: str) -> Any:
    env = {"GPUFENCE_URL": srv.url, "GPUFENCE_TOKEN": token, "GPUFENCE_DATA": None}
    return CliRunner().invoke(app, list(args), env={**env, "COLUMNS": "80"})


def _history(srv: Server, token: str, *args: str) -> dict[str, dict[str, Any]]:
    r = _cli(srv, token, "history", "-o", "json", *args)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["more"] == 0
    return {j["name"]: j for j in doc["jobs"]}


@pytest.mark.parametrize("row", JOBS, ids=[j[0] for j in JOBS])
def test_history_shows_each_job_as_it_ran(
    ran: tuple[Server, dict[str, str]], row: tuple[Any, ...]
) -> None:
    srv, ids = ran
    name, token, _req, slept, state, code, gpus = row
    job = _history(srv, ADMIN, "--since", "1h")[name]
    assert job["id"] == ids[name] and job["tenant"] == TENANT[token]
    assert (job["state"], job["attempts"], job["preemptions"]) == (state, 1, 0)
    if code is not None:
        assert job["exit_code"] == code
    assert job["gpus"] == pytest.approx(gpus)
    if state != "cancelled":  # it slept this long, plus its start-up; never less
        assert slept <= job["elapsed_s"] < slept + 10
    else:  # held its GPU from the bind to the cancel, far less than its 60 s
        assert 1.0 <= job["elapsed_s"] < 30
    assert job["gpu_hours"] == pytest.approx(job["elapsed_s"] * gpus / 3600, rel=1e-6)
    assert job["submitted_at"] <= job["started_at"] <= job["ended_at"]
    # times are JSON numbers of 15 significant digits (SQLite's): 10 us at today's epoch
    delay = job["started_at"] - job["submitted_at"]
    assert job["queue_delay_s"] == pytest.approx(delay, abs=1e-4)


def test_history_filters_and_formats(ran: tuple[Server, dict[str, str]]) -> None:
    srv, ids = ran
    assert set(_history(srv, ADMIN, "--state", "failed")) == {"a-fail"}
    assert set(_history(srv, ADMIN, "--partition", "share")) == {"b-half"}
    assert set(_history(srv, ADMIN, "--tenant", "team-a")) == {"a-two", "a-fail"}
    assert _history(srv, ADMIN, "--since", "2000-01-01", "--until", "2000-01-02") == {}
    r = _cli(srv, ADMIN, "history", "-o", "json", "--limit", "2")
    doc = json.loads(r.stdout)
    assert (len(doc["jobs"]), doc["more"]) == (2, len(JOBS) - 2)
    r = _cli(srv, ADMIN, "history", "-o", "yaml")
    assert {j["name"] for j in yaml.safe_load(r.stdout)["jobs"]} == {j[0] for j in JOBS}
    table = _cli(srv, ADMIN, "history", "--limit", "2")
    assert table.exit_code == 0 and "GPU-h" in table.stdout
    assert max(len(line) for line in table.stdout.splitlines()) <= 80
    assert all(ids[n] in table.stdout for n in ("a-two", "a-fail"))  # the first two, whole
    assert f"{len(JOBS) - 2} more" in table.stderr
    for bad in (["--since", "yesterday"], ["--partition", "nope"], ["-o", "csv"]):
        assert _cli(srv, ADMIN, "history", *bad).exit_code == 2, bad


def test_a_tenant_sees_only_its_own_history_and_usage(ran: tuple[Server, dict[str, str]]) -> None:
    srv, _ = ran
    for token, mine in ((TOKEN_A, {"a-two", "a-fail"}), (TOKEN_B, {"b-half", "b-mig", "b-cancel"})):
        jobs = _history(srv, token)
        assert set(jobs) == mine and {j["tenant"] for j in jobs.values()} == {TENANT[token]}
        other = "team-b" if token == TOKEN_A else "team-a"
        r = _cli(srv, token, "history", "--tenant", other)
        assert r.exit_code == 1 and "forbidden" in r.output
        status, _, _ = call(srv, "GET", f"/v1/usage?tenant={other}", token)
        assert status == 403
        r = _cli(srv, token, "usage", "--by", "partition", "-o", "json")
        doc = json.loads(r.stdout)
        mine_hours = sum(j["gpu_hours"] for j in jobs.values())
        assert doc["total"]["gpu_hours"] == pytest.approx(mine_hours, rel=1e-6)
        assert doc["total"]["jobs"] == len(mine)


# --by, expected keys and which jobs make each
USAGE = [
    ("tenant", {"team-a": {"a-two", "a-fail"}, "team-b": {"b-half", "b-mig", "b-cancel"}}),
    ("partition", {"train": {"a-two", "a-fail", "b-cancel"}, "share": {"b-half"},
                   "slices": {"b-mig"}}),
    ("class", {"training": {"a-two", "b-cancel"}, "batch": {"a-fail"},
               "interactive": {"b-half"}, "serving": {"b-mig"}}),
]  # fmt: skip


@pytest.mark.parametrize(("by", "groups"), USAGE, ids=[u[0] for u in USAGE])
def test_usage_adds_up_the_jobs_gpu_hours(
    ran: tuple[Server, dict[str, str]], by: str, groups: dict[str, set[str]]
) -> None:
    srv, _ = ran
    jobs = _history(srv, ADMIN)
    r = _cli(srv, ADMIN, "usage", "--by", by, "--since", "1h", "-o", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["by"] == by
    got = {g["key"]: g for g in doc["groups"]}
    assert set(got) == set(groups)
    for key, names in groups.items():
        want = sum(jobs[n]["gpu_hours"] for n in names)
        assert got[key]["gpu_hours"] == pytest.approx(want, rel=1e-6), key
        assert got[key]["jobs"] == got[key]["started"] == len(names)
        delays = sorted(jobs[n]["queue_delay_s"] for n in names)
        assert min(delays) <= got[key]["queue_delay_p50_s"] <= max(delays)
        assert got[key]["queue_delay_p50_s"] <= got[key]["queue_delay_p95_s"] <= max(delays)
    assert doc["total"]["jobs"] == len(JOBS)
    table = _cli(srv, ADMIN, "usage", "--by", by)
    assert table.exit_code == 0 and "total" in table.stdout


def test_usage_of_a_window_before_the_jobs_is_empty(ran: tuple[Server, dict[str, str]]) -> None:
    srv, _ = ran
    r = _cli(srv, ADMIN, "usage", "--since", "2000-01-01", "--until", "2000-02-01", "-o", "json")
    doc = json.loads(r.stdout)
    assert doc["groups"] == [] and doc["total"]["gpu_hours"] == 0.0
    assert _cli(srv, ADMIN, "usage", "--by", "queue").exit_code == 2
