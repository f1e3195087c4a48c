"""Arrays have an id of their own (issue 32, item 9), through the CLI and a real server on
127.0.0.1: ``submit --array 0-5%2`` answers the array's id, its tasks are shown as ``jA_0 …
jA_5`` and stay jobs of their own; ``--after-ok`` on the array's id waits for every task (the
dependent never starts before the last task has ended); ``status``, ``hold``, ``release`` and
``cancel`` take the array's id as the whole array, ``jA_3`` as its task 3.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from cli_server import Cli, CliServer, cli_for, cli_server

from gpufence.control.gpus.discovery import fake_gpus
from gpufence.control.http.client import ClientError
from gpufence.demo.live import fenced_spec
from gpufence.testing.waiting import until_value

ADMIN = "array-ids-admin-token-0123456789"
PY = sys.executable
# each task runs a while, so that a dependent waiting for the first task only would start
# long before the last one (6 tasks, 2 at a time: 3 rounds)
TASK = "import time; time.sleep(1.0)"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliServer]:
    spec = fenced_spec(fake_gpus(8))
    spec["control"] = {"auth": {"admin_token": ADMIN}, "stop_grace_s": 1}
    yield from cli_server(tmp_path_factory.mktemp("array-ids"), spec, ADMIN)


@pytest.fixture
def cli(server: CliServer) -> Cli:
    return cli_for(server, ADMIN)


def ok(r: Any) -> str:
    assert r.exit_code == 0, r.output
    return str(r.stdout)


def ended(srv: CliServer, jid: str) -> dict[str, Any]:
    return until_value(lambda: srv.client.job(jid), lambda j: j["ended_at"] is not None, 60, jid)


def tasks_of(srv: CliServer, array: str) -> list[dict[str, Any]]:
    return srv.client.named(array)


def test_after_ok_on_an_array_id_waits_for_every_task(cli: Cli, server: CliServer) -> None:
    r = cli("submit", "--array", "0-5%2", "--name", "waited-for", "--", PY, "-c", TASK)
    array = ok(r).strip()
    dep = ok(cli("submit", "--after-ok", array, "--", PY, "-c", "pass")).strip()
    tasks = tasks_of(server, "waited-for")
    ids = [t["id"] for t in tasks]
    assert len(ids) == 6, tasks
    job = ended(server, dep)
    assert job["state"] == "done", job
    last_end = max(ended(server, jid)["ended_at"] for jid in ids)
    assert job["started_at"] >= last_end, (job["started_at"], last_end)
    assert array not in ids and [t["id"] for t in tasks_of(server, array)] == ids
    assert [t["index"] for t in tasks] == list(range(6))
    assert f"array {array}: 6 task(s) {array}_0..{array}_5 (jobs {ids[0]}..{ids[-1]})" in (r.stderr)
    # every task saw the array's id as its GPUFENCE_ARRAY_JOB_ID
    assert {server.client.job(jid)["spec"]["array_task"]["job"] for jid in ids} == {array}
    doc = json.loads(ok(cli("status", array, "-o", "json")))
    assert doc["array"] == array and doc["states"] == {"done": 6}, doc
    assert [t["task"] for t in doc["tasks"]] == [f"{array}_{i}" for i in range(6)]
    table = ok(cli("status", array))
    assert f"array {array}: 6 task(s), 6 done" in table and f"{array}_5" in table, table
    # a task stays a job of its own, by its id or as jA_3
    one = json.loads(ok(cli("status", f"{array}_3", "-o", "json")))
    assert one["id"] == ids[3] and one["state"] == "done", one
    assert json.loads(ok(cli("status", ids[3], "-o", "json")))["id"] == ids[3]


def test_hold_release_and_cancel_take_the_array_id(cli: Cli, server: CliServer) -> None:
    array = ok(cli("submit", "--array", "0-3", "--hold", "--", PY, "-c", TASK)).strip()
    ids = [t["id"] for t in tasks_of(server, array)]
    assert len(ids) == 4 and array not in ids, ids
    out = ok(cli("hold", array))
    assert all(f"{jid}: pending (held)" in out for jid in ids), out
    out = ok(cli("release", array))
    assert all(f"{jid}: pending" in out and f"{jid}: pending (held)" not in out for jid in ids)
    assert {ended(server, jid)["state"] for jid in ids} == {"done"}
    array = ok(cli("submit", "--array", "0-3", "--hold", "--", PY, "-c", TASK)).strip()
    ids = [t["id"] for t in tasks_of(server, array)]
    out = ok(cli("cancel", array))
    assert all(f"{jid}: cancelled" in out for jid in ids), out
    assert {ended(server, jid)["state"] for jid in ids} == {"cancelled"}


def test_an_unknown_array_task_is_named(cli: Cli, server: CliServer) -> None:
    array = ok(cli("submit", "--array", "0-1", "--", "true")).strip()
    r = cli("status", f"{array}_7")
    assert r.exit_code == 2 and f"no task 7 in an array {array}" in r.output, r.output
    with pytest.raises(ClientError) as err:  # the API's job routes: the array is no job
        server.client.job(array)
    assert err.value.status == 404 and f"{array} is an array of 2 task(s)" in str(err.value)
    r = cli("submit", "--name", "j3_1", "--", "true")
    assert r.exit_code == 2 and "array task" in r.output, r.output
