"""The dashboard's own read-only routes (``/v1/dashboard/*``) and its assets, over HTTP on a real
``gpufence up --fake-gpus 8`` (no browser needed: these run where Chromium is missing too).

* ``queue``: pages of the matching jobs with their total, in submission order, filters, pending
  reasons; a tenant's own only (403 for another's), 422 naming a bad state or class;
* ``gpus``: the map's job labels and the tenant's view of other tenants' GPUs;
* ``fairshare`` and ``whoami``; assets: unknown names 404, unchanged ones 304 on revalidation.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from tenant_server import JOB_PY, Server, gpufence_up

from gpufence.control.http import schemas

pytestmark = pytest.mark.skipif(not Path(JOB_PY).exists(), reason=f"needs {JOB_PY}")

VISION = "vision-dash-api-token-0123456789"
NLP = "nlp-dash-api-token-0123456789"
SLEEP = "import time; time.sleep(120)"
CONFIG = """
name: dashboard-api
node_groups:
  - {name: local, count: 1, gpus_per_node: 8, gpu_type: H100-80GB, nvlink_domains: [8]}
partitions:
  serving: {gpus: ["local:0-3"], admits: [serving], sharing: exclusive}
  training: {gpus: ["local:4-7"], admits: [training], sharing: exclusive}
queues:
  - {name: vision, partition: training, tenant: vision}
  - {name: nlp, partition: training, tenant: nlp}
control:
  auth:
    tenants:
      vision: {token_env: GFT_DAPI_VISION}
      nlp: {token_env: GFT_DAPI_NLP}
  # test servers under pytest's 0700 tmp dirs, jobs from root's venv: explicitly root
  tenants: {vision: {run_as: root, allow_root: true}, nlp: {run_as: root, allow_root: true}}
  stop_grace_s: 2
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("dashboard-api")
    env = {**os.environ, "GFT_DAPI_VISION": VISION, "GFT_DAPI_NLP": NLP}
    with gpufence_up(root, CONFIG, env, {"vision": VISION, "nlp": NLP}, gpus=8) as srv:
        yield srv


@pytest.fixture(scope="module")
def jobs(server: Server) -> dict[str, Any]:
    """nlp holds all of training; then vision queues 3 jobs and nlp 2 (all pending)."""
    blocker = server.submit("nlp", SLEEP, name="blocker", queue="nlp", gpus=4)
    server.wait(blocker, ("running",))
    vision = [server.submit("vision", SLEEP, name=f"v{i}", queue="vision") for i in range(3)]
    nlp = [server.submit("nlp", SLEEP, name=f"n{i}", queue="nlp") for i in range(2)]
    return {"blocker": blocker, "vision": vision, "nlp": nlp}


def ok(server: Server, path: str, tenant: str = "admin") -> Any:
    status, body, _ = server.call("GET", path, tenant)
    assert status == 200, body
    return body


def test_queue_pages_the_pending_jobs_with_their_total_and_reasons(
    server: Server, jobs: dict[str, Any]
) -> None:
    pending = [*jobs["vision"], *jobs["nlp"]]
    page = ok(server, "/v1/dashboard/queue?limit=2&offset=2")
    assert page["total"] == 5
    assert [j["id"] for j in page["jobs"]] == pending[2:4]
    for j in page["jobs"]:
        assert j["state"] == "pending" and "free" in j["pending"]["message"]
        assert "spec" not in j  # lists carry no job spec (commands, environments)
    assert ok(server, "/v1/dashboard/queue?state=running")["jobs"][0]["id"] == jobs["blocker"]
    assert ok(server, "/v1/dashboard/queue?queue=nlp")["total"] == 2
    assert ok(server, "/v1/dashboard/queue?class=serving")["total"] == 0
    assert ok(server, "/v1/dashboard/queue?tenant=vision&partition=training")["total"] == 3


def test_a_tenant_pages_only_its_own_jobs(server: Server, jobs: dict[str, Any]) -> None:
    page = ok(server, "/v1/dashboard/queue", "vision")
    assert [j["id"] for j in page["jobs"]] == jobs["vision"] and page["total"] == 3
    assert ok(server, "/v1/dashboard/queue?queue=nlp", "vision")["total"] == 0
    status, body, _ = server.call("GET", "/v1/dashboard/queue?tenant=nlp", "vision")
    assert status == 403, body


@pytest.mark.parametrize(
    ("query", "field", "words"),
    [("state=queued", "state", "unknown state 'queued'"), ("class=gpu", "class", "valid:")],
)
def test_a_bad_filter_is_a_422_naming_it(
    server: Server, query: str, field: str, words: str
) -> None:
    status, body, _ = server.call("GET", f"/v1/dashboard/queue?{query}")
    assert status == 422
    assert body["type"] == "urn:gpufence:problem:invalid", body  # an RFC 7807 problem
    assert body["field"] == f"query.{field}" and words in body["detail"], body


def test_gpu_map_labels_jobs_and_hides_other_tenants(server: Server, jobs: dict[str, Any]) -> None:
    admin = ok(server, "/v1/dashboard/gpus")
    held = {g["index"] for n in admin["nodes"] for g in n["gpus"] if jobs["blocker"] in g["jobs"]}
    assert held == {4, 5, 6, 7}
    assert admin["jobs"][jobs["blocker"]] == {
        "tenant": "nlp",
        "name": "blocker",
        "class": "training",
        "partition": "training",
        "state": "running",
    }
    mine = ok(server, "/v1/dashboard/gpus", "vision")
    assert mine["jobs"] == {} and mine["other_tenants_gpus"] == 4
    assert all(not g["jobs"] for n in mine["nodes"] for g in n["gpus"])


def test_fair_share_and_whoami(server: Server, jobs: dict[str, Any]) -> None:
    tables = ok(server, "/v1/dashboard/fairshare")["partitions"]
    training = {t["queue"]: t for t in tables["training"]}
    assert set(training) == {"vision", "nlp"}
    assert training["nlp"]["holding_gpus"] == 4 and training["vision"]["rank"] == 1
    admin = ok(server, "/v1/dashboard/whoami")
    assert admin["admin"] is True and set(admin["tenants"]) == {"admin", "vision", "nlp"}
    who = ok(server, "/v1/dashboard/whoami", "vision")
    assert who["tenant"] == "vision" and who["admin"] is False and "tenants" not in who
    assert who["partitions"] == ["serving", "training"]


@pytest.mark.parametrize(
    ("path", "tenant", "model"),
    [
        ("/v1/dashboard/queue", "admin", schemas.QueuePage),
        ("/v1/dashboard/queue?state=running", "nlp", schemas.QueuePage),
        ("/v1/dashboard/gpus", "admin", schemas.GpuMap),
        ("/v1/dashboard/gpus", "vision", schemas.GpuMap),
        ("/v1/dashboard/fairshare", "vision", schemas.FairShareTables),
        ("/v1/dashboard/whoami", "admin", schemas.Whoami),
    ],
)
def test_answers_round_trip_through_their_documented_models(
    server: Server, jobs: dict[str, Any], path: str, tenant: str, model: type[BaseModel]
) -> None:
    """With pending jobs (their reasons) and a tenant's view (other tenants' GPUs): the
    OpenAPI document's model lacks no field the route sends."""
    body = ok(server, path, tenant)
    parsed = model.model_validate(body).model_dump(mode="json", by_alias=True, exclude_unset=True)
    assert json.dumps(parsed, sort_keys=True) == json.dumps(body, sort_keys=True)


def test_assets_unknown_names_404_and_unchanged_ones_revalidate(server: Server) -> None:
    status, _, _ = server.call("GET", "/ui/secrets.py")
    assert status == 404
    with urllib.request.urlopen(server.url + "/ui/app.js", timeout=10) as resp:
        etag = resp.headers["ETag"]
        assert resp.headers["Content-Type"].startswith("text/javascript")
    req = urllib.request.Request(server.url + "/ui/app.js", headers={"If-None-Match": etag})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 304
