"""The OpenAPI document is the API's contract: every response is typed (no ``{}`` or free-form
object a generated client would see as ``Dict[str, Any]``), every error is a Problem, each route
documents the error statuses it can give; every route's real answer round-trips through its
response model unchanged; ``/docs`` and ``/redoc`` work offline (local assets only, served)."""

from __future__ import annotations

import json
import re
import sys
import urllib.request
from typing import Any

import pytest
from api_helpers import ADMIN, TOKEN_A, Server, call, submit, wait_state
from pydantic import BaseModel

from gpufence.control.http import job_actions, schemas
from gpufence.control.http.docs import ASSETS_URL

PROBLEM = "application/problem+json"


def _resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    node: Any = doc
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    assert isinstance(node, dict)
    return node


def untyped(doc: dict[str, Any], schema: Any, where: str, seen: set[str]) -> list[str]:
    """Every place under ``schema`` a generated client could not type: an empty schema, an
    object with no properties and no typed values, ``additionalProperties: true``."""
    if not isinstance(schema, dict) or not schema:
        return [f"{where}: empty schema"]
    ref = schema.get("$ref")
    if ref is not None:
        if ref in seen:
            return []
        return untyped(doc, _resolve(doc, schema), f"{where}->{ref}", seen | {ref})
    bad: list[str] = []
    for key in ("anyOf", "oneOf", "allOf"):
        for i, sub in enumerate(schema.get(key, ())):
            bad += untyped(doc, sub, f"{where}.{key}[{i}]", seen)
    if any(k in schema for k in ("anyOf", "oneOf", "allOf", "enum", "const")):
        return bad
    kind = schema.get("type")
    if kind is None:
        return [*bad, f"{where}: no type"]
    extra = schema.get("additionalProperties")
    if extra is True or (extra == {}):
        bad.append(f"{where}: additionalProperties: true")
    if kind == "object":
        if not schema.get("properties") and not isinstance(extra, dict):
            bad.append(f"{where}: object without properties")
        for name, sub in schema.get("properties", {}).items():
            bad += untyped(doc, sub, f"{where}.{name}", seen)
        if isinstance(extra, dict) and extra:
            bad += untyped(doc, extra, f"{where}.*", seen)
    if kind == "array":
        bad += untyped(doc, schema.get("items"), f"{where}[]", seen)
    return bad


def test_no_response_is_untyped_and_every_error_is_a_problem(server: Server) -> None:
    status, doc, _ = call(server, "GET", "/openapi.json", token=None)
    assert status == 200
    bad: list[str] = []
    operations = 0
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            operations += 1
            for code, resp in op["responses"].items():
                where = f"{method.upper()} {path} {code}"
                content = resp.get("content")
                if not content:
                    bad.append(f"{where}: no content")
                    continue
                if int(code) >= 400 and list(content) != [PROBLEM]:
                    bad.append(f"{where}: not only {PROBLEM}: {sorted(content)}")
                for media, body in content.items():
                    bad += untyped(doc, body.get("schema"), f"{where} {media}", set())
            if path.startswith("/v1/"):
                codes = set(op["responses"])
                if not {"401", "503"} <= codes:
                    bad.append(f"{method.upper()} {path}: 401 and 503 not documented")
    assert operations >= 14
    assert bad == [], "\n".join(bad)


# the error statuses each route documents: those it can give, no more
STATUSES = [
    ("post", "/v1/jobs", {"401", "403", "413", "422", "429", "503", "507"}),
    ("get", "/v1/jobs", {"401", "403", "422", "503"}),
    ("get", "/v1/jobs/{job_id}", {"401", "403", "404", "422", "503"}),
    ("post", "/v1/jobs/{job_id}/cancel", {"401", "403", "404", "409", "413", "422", "503"}),
    ("get", "/v1/nodes", {"401", "503"}),
    ("get", "/v1/history", {"401", "403", "422", "503"}),
    ("get", "/v1/usage", {"401", "403", "422", "503"}),
    ("get", "/v1/dashboard/whoami", {"401", "503"}),
    ("get", "/v1/dashboard/queue", {"401", "403", "422", "503"}),
    ("get", "/v1/dashboard/fairshare", {"401", "503"}),
    ("get", "/v1/dashboard/gpus", {"401", "503"}),
    ("post", "/v1/jobs/{ref}/hold", {"401", "404", "409", "413", "422", "503"}),
    ("post", "/v1/jobs/{ref}/release", {"401", "403", "404", "409", "413", "422", "503"}),
    ("patch", "/v1/jobs/{job_id}", {"401", "403", "404", "409", "413", "422", "503"}),
    ("get", "/v1/names/{ref}", {"401", "404", "422", "503"}),
]


@pytest.mark.parametrize(("method", "path", "errors"), STATUSES)
def test_each_route_documents_its_error_statuses(
    server: Server, method: str, path: str, errors: set[str]
) -> None:
    _, doc, _ = call(server, "GET", "/openapi.json", token=None)
    codes = {c for c in doc["paths"][path][method]["responses"] if int(c) >= 400}
    assert codes == errors


def _roundtrip(model: type[BaseModel], body: Any) -> None:
    """``body`` parses as ``model`` and dumps back the same: the model lacks no field."""
    parsed = model.model_validate(body).model_dump(mode="json", by_alias=True, exclude_unset=True)
    assert json.dumps(parsed, indent=1, sort_keys=True) == json.dumps(
        body, indent=1, sort_keys=True
    )


def test_every_route_answers_in_its_model(server: Server) -> None:
    ok = [sys.executable, "-c", "print('hi')"]
    status, done = submit(server, {"command": ok, "gpus": 1, "name": "contract"})
    assert status == 201, done
    wait_state(server, done["id"], ("done",))
    status, mine = submit(server, {"command": ok, "gpus": 1}, TOKEN_A)
    assert status == 201, mine
    wait_state(server, mine["id"], ("done",))
    jid = done["id"]
    routes: list[tuple[str, str, type[BaseModel]]] = [
        (ADMIN, "/v1/jobs?state=done", schemas.JobList),
        (ADMIN, f"/v1/jobs/{jid}", schemas.JobDetail),
        (ADMIN, f"/v1/jobs/{jid}/explain", schemas.Explanation),
        (ADMIN, "/v1/nodes", schemas.NodeList),
        (TOKEN_A, "/v1/nodes", schemas.NodeList),
        (ADMIN, "/v1/partitions", schemas.PartitionList),
        (ADMIN, "/v1/events", schemas.EventList),
        (ADMIN, "/v1/advice", schemas.AdviceList),
        (TOKEN_A, "/v1/advice", schemas.AdviceList),
        (ADMIN, "/v1/history", schemas.HistoryPage),
        (ADMIN, "/v1/usage?by=partition", schemas.UsageReport),
        (ADMIN, "/healthz", schemas.Health),
        (ADMIN, "/readyz", schemas.Health),
        (ADMIN, "/v1/dashboard/whoami", schemas.Whoami),
        (TOKEN_A, "/v1/dashboard/whoami", schemas.Whoami),
        (ADMIN, "/v1/dashboard/queue?state=done", schemas.QueuePage),
        (TOKEN_A, "/v1/dashboard/queue?state=done", schemas.QueuePage),
        (ADMIN, "/v1/dashboard/fairshare", schemas.FairShareTables),
        (ADMIN, "/v1/dashboard/gpus", schemas.GpuMap),
        (TOKEN_A, "/v1/dashboard/gpus", schemas.GpuMap),
        (ADMIN, "/v1/names/contract", job_actions.NameResponse),
        (ADMIN, f"/v1/names/{jid}", job_actions.NameResponse),
    ]
    for token, path, model in routes:
        status, body, _ = call(server, "GET", path, token)
        assert status == 200, (path, body)
        _roundtrip(model, body)
    # the cluster file's path is the server's: the admin's to see, not a tenant's
    assert call(server, "GET", "/v1/advice", TOKEN_A)[1]["spec"] is None


REF = re.compile(r"""(?:src|href)=["']([^"']+)["']|url:\s*['"]([^'"]+)['"]""")


@pytest.mark.parametrize("path", ["/", "/ui/app.js", "/ui/nothing.js"])
def test_the_dashboard_page_and_assets_are_not_api(server: Server, path: str) -> None:
    """Served without a token, left out of the document; an unknown asset is a Problem."""
    _, doc, _ = call(server, "GET", "/openapi.json", token=None)
    assert not any(p == "/" or p.startswith("/ui/") for p in doc["paths"])
    status, body, headers = call(server, "GET", path, token=None)
    if path == "/ui/nothing.js":
        assert status == 404 and headers["content-type"] == PROBLEM, body
        assert body["type"] == "urn:gpufence:problem:not-found", body
    else:
        assert status == 200, body


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_load_only_local_assets_and_they_are_served(server: Server, page: str) -> None:
    status, html, headers = call(server, "GET", page, token=None)
    assert status == 200 and "text/html" in headers["content-type"]
    refs = [a or b for a, b in REF.findall(html)]
    assert refs, html
    assert "http" not in html.replace("http-equiv", ""), "the page names a remote URL"
    for ref in refs:
        assert ref.startswith("/") and not ref.startswith("//"), ref
        with urllib.request.urlopen(server.url + ref, timeout=30) as resp:
            assert resp.status == 200, ref
            assert len(resp.read()) > 100, ref
    assert any(r.startswith(ASSETS_URL) and r.endswith(".js") for r in refs)


def test_issue_15_answers_are_in_their_models(server: Server) -> None:
    """An array submitted on hold after another job, hold / release answers, and the held
    job's document: each round-trips through its model (``held``, ``tasks``)."""
    from gpufence.control.http.api import SubmitResponse

    ok = [sys.executable, "-c", "print('hi')"]
    slow = [sys.executable, "-c", "import time; time.sleep(60)"]  # its dependents stay pending
    status, first = submit(server, {"command": slow, "gpus": 1, "name": "contract-parent"})
    assert status == 201, first
    _roundtrip(SubmitResponse, first)
    assert "tasks" not in first, first
    body = {"command": ok, "gpus": 1, "array": "0-2", "hold": True, "after_ok": [first["id"]]}
    status, arr = submit(server, body)
    assert status == 201, arr
    _roundtrip(SubmitResponse, arr)
    assert len(arr["tasks"]) == 3, arr
    assert arr["id"] not in arr["tasks"], arr  # the array's own id
    status, page, _ = call(server, "GET", f"/v1/jobs/{arr['tasks'][0]}", ADMIN)
    assert status == 200 and page["held"] is True, page
    _roundtrip(schemas.JobDetail, page)
    for action in ("release", "hold"):
        status, res, _ = call(server, "POST", f"/v1/jobs/{arr['tasks'][1]}/{action}", ADMIN)
        assert status == 200, res
        _roundtrip(job_actions.ActionResponse, res)
    status, listed, _ = call(server, "GET", "/v1/jobs?state=pending", ADMIN)
    assert status == 200 and any(j["held"] for j in listed["jobs"]), listed
    _roundtrip(schemas.JobList, listed)
    for jid in [*arr["tasks"], first["id"]]:
        status, res, _ = call(server, "POST", f"/v1/jobs/{jid}/cancel", ADMIN)
        assert status == 200, res


@pytest.mark.parametrize(
    ("path", "allow"),
    [
        ("/v1/jobs", "GET, OPTIONS, POST"),  # two routes: Starlette's own 405 named POST only
        ("/v1/jobs/j1", "GET, OPTIONS, PATCH"),  # PATCH: gpufence update (issue 32)
        ("/v1/jobs/j1/cancel", "OPTIONS, POST"),
    ],
)
def test_options_and_405_name_every_method_of_the_path(
    server: Server, path: str, allow: str
) -> None:
    """RFC 9110: OPTIONS says which methods a path has (no token needed: it tells nothing
    else), and a 405 carries the same ``Allow``."""
    status, body, headers = call(server, "OPTIONS", path, token=None)
    assert (status, headers.get("allow"), body) == (204, allow, "")
    status, out, headers = call(server, "PUT", path)
    assert status == 405 and headers.get("allow") == allow, (status, out)
    assert out["detail"] == f"PUT is not a method of this path; use one of: {allow}"
