"""Issue 11, cases 1 and 6: hostile requests get a 422 naming the field (or 413 / 404), never a
500, and never leave anything in the store that could break a later call or a restart.

Real server on 127.0.0.1 (``server`` fixture); bodies sent as raw bytes where JSON itself is the
attack (``1e400`` parses as infinity, ``NaN``, ``"\\ud800"``).
"""

from __future__ import annotations

import http.client
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from api_helpers import ADMIN, Server, call, submit, wait_state

from gpufence.cli.up import escape_control_characters
from gpufence.control.base.jobspec import escape

PROBLEM = "application/problem+json"


def post_raw(server: Server, raw: bytes, headers: dict[str, str] | None = None) -> Any:
    return call(server, "POST", "/v1/jobs", raw=raw, headers=headers)


def job_count(server: Server) -> int:
    status, out, _ = call(server, "GET", "/v1/jobs?limit=10000")
    assert status == 200, out
    return len(out["jobs"])


def invalid(out: Any, headers: Any, field: str) -> None:
    assert headers["content-type"] == PROBLEM, headers
    assert out["type"] == "urn:gpufence:problem:invalid" and out["status"] == 422, out
    assert out["field"].startswith(field), (field, out)
    assert set(out) >= {"type", "title", "status", "detail", "field", "errors"}


NUMBERS = [
    (b'{"command": ["true"], "est_runtime_s": 1e400}', "body.est_runtime_s"),
    (b'{"command": ["true"], "est_runtime_s": NaN}', "body.est_runtime_s"),
    (b'{"command": ["true"], "est_runtime_s": -Infinity}', "body.est_runtime_s"),
    (b'{"command": ["true"], "est_runtime_s": 1e300}', "body.est_runtime_s"),
    (b'{"command": ["true"], "gpu_fraction": 0.5, "gpu_mem_gib": 1e308}', "body.gpu_mem_gib"),
    (b'{"command": ["true"], "gpu_fraction": NaN}', "body.gpu_fraction"),
    (b'{"command": ["true"], "gpus": 1e400}', "body.gpus"),
    (b'{"command": ["true"], "priority": 100000000000000000000000}', "body.priority"),
    # JSON true/false is no number and 1 / "yes" no flag (lax parsing read "gpus": true as 1)
    (b'{"command": ["true"], "gpus": true}', "body.gpus"),
    (b'{"command": ["true"], "est_runtime_s": false}', "body.est_runtime_s"),
    (b'{"command": ["true"], "checkpointable": 1}', "body.checkpointable"),
    (b'{"command": ["true"], "hold": "yes"}', "body.hold"),
    # a string is no number either ("5_0" was read as 50, "1e3" as 1000)
    (b'{"command": ["true"], "priority": "5_0"}', "body.priority"),
    (b'{"command": ["true"], "gpus": "2"}', "body.gpus"),
    (b'{"command": ["true"], "est_runtime_s": "1e3"}', "body.est_runtime_s"),
]


@pytest.mark.parametrize(("raw", "field"), NUMBERS, ids=[f for _r, f in NUMBERS])
def test_non_finite_and_out_of_range_numbers_are_422(
    server: Server, raw: bytes, field: str
) -> None:
    before = job_count(server)
    status, out, headers = post_raw(server, raw)
    assert status == 422, out
    invalid(out, headers, field)
    assert job_count(server) == before, "nothing was stored"


STRINGS = [
    ({"command": ["\ud800"]}, "body.command.0", "surrogate"),
    ({"command": ["echo", "a\x00b"]}, "body.command.1", "NUL"),
    ({"command": ["echo", "\x1b[2J"]}, "body.command.1", "control"),
    ({"command": [""]}, "body.command", "empty"),
    ({"command": ["true"], "cwd": "relative/dir"}, "body.cwd", "absolute"),
    ({"command": ["true"], "cwd": "/tmp\nFORGED LOG LINE"}, "body.cwd", "control"),
    ({"command": ["true"], "cwd": "/nonexistent/gpufence-test"}, "body.cwd", "not a directory"),
    ({"command": ["true"], "env": {"FOO\n": "x"}}, "body.env", "'FOO\\x0a' is not a valid"),
    ({"command": ["true"], "env": {"FOO": "a\x00b"}}, "body.env.FOO", "NUL"),
    ({"command": ["true"], "env": {"\ud800": "x"}}, "body.env", "surrogate"),
    ({"command": ["true"], "name": "bad\nname"}, "body.name", "control"),
    ({"command": ["true"], "queue": "\ud800"}, "body.queue", "surrogate"),
    ({"command": ["true"] * 5000}, "body.command", "at most"),
    # names are read by people and are parts of URLs
    ({"command": ["true"], "name": ""}, "body.name", "empty"),
    ({"command": ["true"], "name": "a/b"}, "body.name", "'/'"),
    ({"command": ["true"], "name": "invoice\u202etxt.exe"}, "body.name", "U+202E"),
    ({"command": ["true"], "name": "two\u2028lines"}, "body.name", "U+2028"),
    ({"command": ["true"], "name": "\u3164"}, "body.name", "U+3164"),  # a blank-looking letter
    ({"command": ["true"], "name": "a\u00adb"}, "body.name", "U+00AD"),
    ({"command": ["true"], "name": "e\u0301"}, "body.name", "NFC"),
    ({"command": ["true"], "name": "j1 "}, "body.name", "start or end with a space"),
    ({"command": ["true"], "name": ".."}, "body.name", "'..'"),
    ({"command": ["true"], "name": "J1"}, "body.name", "looks like a job id"),
    ({"command": ["true"], "name": "j\u0663"}, "body.name", "looks like a job id"),
    ({"command": ["true"], "queue": "q\u200b"}, "body.queue", "U+200B"),
    ({"command": ["true"], "after_ok": ["x/y"]}, "body.after_ok.0", "'/'"),
    # array specs: ASCII digits, a cap that is a number in range
    ({"command": ["true"], "array": "0-3%"}, "body.array", "cap"),
    ({"command": ["true"], "array": "0-3%99999999999"}, "body.array", "cap"),
    ({"command": ["true"], "array": "\u0663"}, "body.array", "not an index"),
    ({"command": ["true"], "array": "0-4:0"}, "body.array", "step of '0-4:0' must be at least 1"),
]


@pytest.mark.parametrize(("body", "field", "words"), STRINGS, ids=[w for _b, _f, w in STRINGS])
def test_bad_strings_are_422_naming_the_field(
    server: Server, body: dict[str, Any], field: str, words: str
) -> None:
    before = job_count(server)
    # json.dumps escapes a lone surrogate as \ud800: exactly what a hostile client sends
    status, out, headers = post_raw(server, json.dumps(body).encode())
    assert status == 422, out
    invalid(out, headers, field)
    said = " ".join(e["message"] for e in out["errors"])
    assert not said.startswith("Value error"), said  # our words, not pydantic's wrapper
    assert words in said or (words == "surrogate" and "unicode" in said), out
    assert job_count(server) == before


def test_lists_and_cli_keep_working_after_hostile_submits(server: Server) -> None:
    post_raw(server, json.dumps({"command": ["\ud800"], "name": "\ud800"}).encode())
    for path in ("/v1/jobs", "/v1/jobs?state=pending", "/v1/events"):
        status, out, _ = call(server, "GET", path)
        assert status == 200, (path, out)


def test_a_spec_stored_by_an_older_version_does_not_break_reads(server: Server) -> None:
    """Before validation existed a lone surrogate and an infinite estimate got stored; every
    list call then answered 500 for good. Reads must survive such a row."""
    with server.plane.store.transaction() as tx:
        jid = tx.add_job(
            tenant="admin",
            spec={"command": ["\ud800"], "est_runtime_s": float("inf"), "name": "\ud800"},
            workload_class="training",
            partition="",
            queue="",
            submitted_at=1.0,
        )
        tx.set_job(jid, state="failed")
    status, out, _ = call(server, "GET", "/v1/jobs?limit=10000")
    assert status == 200, out
    row = next(j for j in out["jobs"] if j["id"] == jid)
    assert row["spec"]["command"] == ["\\ud800"] and row["spec"]["est_runtime_s"] is None
    assert call(server, "GET", f"/v1/jobs/{jid}")[0] == 200


def test_request_size_limit_is_413(server: Server) -> None:
    big = json.dumps({"command": ["echo", "x" * (2 << 20)]}).encode()
    status, out, headers = post_raw(server, big)
    assert status == 413, out
    assert headers["content-type"] == PROBLEM and "larger than" in out["detail"]
    status, out, _ = post_raw(server, json.dumps({"command": ["echo", "x" * 1000]}).encode())
    assert status == 201, out


@pytest.mark.parametrize(
    ("path", "status_code"),
    [
        ("/v1/jobs?after=9223372036854775808", 422),
        ("/v1/jobs?after=99999999999999999999999", 422),
        ("/v1/jobs?after=9223372036854775807", 200),
        ("/v1/events?after=9223372036854775808", 422),
        ("/v1/jobs/j1/logs?offset=9223372036854775808", 422),
        ("/v1/jobs/j1/logs?attempt=99999999999999999999", 422),
        ("/v1/jobs?partition=%ED%A0%80", 200),  # invalid UTF-8 decodes to U+FFFD
        ("/v1/jobs?partition=a%00b", 422),
        ("/v1/jobs/%ED%A0%80", 404),
        ("/v1/jobs/j99999999999999999999999", 404),
        ("/v1/jobs/..%2F..%2Fetc", 404),
        ("/v1/events?job=%00", 422),
    ],
)
def test_hostile_queries_and_paths(server: Server, path: str, status_code: int) -> None:
    status, out, headers = call(server, "GET", path)
    assert status == status_code, (path, out)
    if status >= 400:
        assert headers["content-type"] == PROBLEM and out["status"] == status


def test_several_authorization_headers_are_refused_by_every_route(server: Server) -> None:
    """One route read the first header and the submit route the last: a request could be one
    tenant for one and another for the other. Now none reads either."""
    for method, path, body in (
        ("POST", "/v1/jobs", b'{"command": ["true"]}'),
        ("GET", "/v1/jobs", None),
    ):
        conn = http.client.HTTPConnection(server.url.removeprefix("http://"), timeout=30)
        conn.putrequest(method, path)
        conn.putheader("Authorization", f"Bearer {ADMIN}")
        conn.putheader("Authorization", "Bearer someone-else")
        if body is not None:
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        out = json.loads(resp.read())
        conn.close()
        assert resp.status == 401 and "one Authorization header" in out["detail"], (path, out)


def test_log_lines_escape_user_text() -> None:
    assert escape("name\u202eexe.txt\u2028x") == "name\\u202eexe.txt\\u2028x"
    assert escape("/tmp\n2025-01-01 INFO forged") == "/tmp\\x0a2025-01-01 INFO forged"
    assert escape("\ud800x") == "\\ud800x"
    assert escape("naïve é") == "naïve é"
    record = logging.LogRecord("gpufence", logging.ERROR, "f", 1, "cwd %s", ("/a\nb",), None)
    assert escape_control_characters(record)
    assert record.getMessage() == "cwd /a\\x0ab"


def test_idempotency_key_returns_the_same_job(server: Server) -> None:
    body = json.dumps({"command": ["true"], "name": "idem"}).encode()
    key = {"Idempotency-Key": "test-key-0001"}
    status, first, _ = post_raw(server, body, key)
    assert status == 201, first
    status, again, _ = post_raw(server, body, key)
    assert status == 200 and again["id"] == first["id"], again
    other = json.dumps({"command": ["false"]}).encode()
    status, out, _ = post_raw(server, other, key)
    assert status == 422 and out["field"] == "header.Idempotency-Key", out
    status, out, _ = post_raw(server, body, {"Idempotency-Key": "bad key with spaces"})
    assert status == 422 and out["field"] == "header.Idempotency-Key"
    wait_state(server, first["id"], ("done",))
    listed = call(server, "GET", "/v1/jobs?limit=10000", ADMIN)[1]["jobs"]
    assert sum(j["name"] == "idem" for j in listed) == 1


def test_two_idempotency_keys_are_refused(server: Server) -> None:
    """One code path kept the first header, the other the last: refused, as for Authorization."""
    before = job_count(server)
    conn = http.client.HTTPConnection(server.url.removeprefix("http://"), timeout=30)
    body = b'{"command": ["true"]}'
    conn.putrequest("POST", "/v1/jobs")
    for name, value in (
        ("Authorization", f"Bearer {ADMIN}"),
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(body))),
        ("Idempotency-Key", "k-first"),
        ("Idempotency-Key", "k-second"),
    ):
        conn.putheader(name, value)
    conn.endheaders(body)
    resp = conn.getresponse()
    out = json.loads(resp.read())
    conn.close()
    assert resp.status == 422 and out["field"] == "header.Idempotency-Key", out
    assert job_count(server) == before


def test_a_retry_gets_its_job_even_if_its_cwd_is_gone_since(server: Server, tmp_path: Path) -> None:
    """The key is looked up before the machine's state: the retry of an accepted submit is told
    about the job it made, not that its directory no longer exists."""
    cwd = tmp_path / "work"
    cwd.mkdir()
    body = json.dumps({"command": ["true"], "cwd": str(cwd), "hold": True}).encode()
    key = {"Idempotency-Key": "cwd-gone-0001"}
    status, first, _ = post_raw(server, body, key)
    assert status == 201, first
    cwd.rmdir()
    status, again, _ = post_raw(server, body, key)
    assert status == 200 and again["id"] == first["id"], again
    status, out, _ = post_raw(server, body)  # without the key: a new submit, checked
    assert status == 422 and out["field"] == "body.cwd", out
    call(server, "POST", f"/v1/jobs/{first['id']}/cancel")


def test_deeply_nested_and_non_utf8_bodies_are_422(server: Server) -> None:
    before = job_count(server)
    deep = b'{"command": ' + b"[" * 5000 + b"]" * 5000 + b"}"  # the decoder's recursion limit
    bom = b"\xef\xbb\xbf" + json.dumps({"command": ["true"]}).encode()
    utf16 = json.dumps({"command": ["true"]}).encode("utf-16")
    for raw in (deep, bom, utf16):
        status, out, headers = post_raw(server, raw)
        assert status == 422, (raw[:20], out)
        invalid(out, headers, "body")
    assert job_count(server) == before


def test_dependencies_past_the_limit_once_arrays_expand_are_refused_at_submit(
    server: Server,
) -> None:
    """A name expanding to 101 array tasks: refused with 422 at submit. Stored, the spec
    failed its own 100-item check when the job was to start (and at every restart)."""
    status, arr = submit(
        server, {"command": ["true"], "name": "wide", "array": "0-100", "hold": True}
    )
    assert status == 201, arr
    before = job_count(server)
    status, out, headers = call(
        server, "POST", "/v1/jobs", body={"command": ["true"], "after_ok": ["wide"]}
    )
    assert status == 422, out
    invalid(out, headers, "body.after_ok")
    assert "more than 100" in out["detail"], out
    assert job_count(server) == before
    # within the limit it is taken, and the same tasks named twice count once
    task = arr["tasks"][0]  # (the array's own id stands for all 101 tasks)
    status, out = submit(server, {"command": ["true"], "after_any": [task] * 2, "hold": True})
    assert status == 201, out
    status, job, _ = call(server, "GET", f"/v1/jobs/{out['id']}")
    assert job["spec"]["after_any"] == [task], job["spec"]


@pytest.mark.parametrize(
    "query",
    ["step=inf", "step=nan", "since=-1.7e308&until=1.7e308", "since=-1e308&until=1e308&step=1e308",
     "until=inf", "since=nan"],
)  # fmt: skip
def test_series_range_out_of_bounds_is_422(server: Server, query: str) -> None:
    status, out, headers = call(server, "GET", f"/v1/series?{query}")
    assert status == 422, (query, out)
    invalid(out, headers, "query.")
