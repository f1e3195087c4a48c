"""A tenant's job naming no queue lands in that tenant's queue, never in another tenant's quota
(a real server on 127.0.0.1, 8 fake GPUs): the queue shown by the API is the one charged."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from api_helpers import (
    ADMIN,
    NODES,
    TOKEN_A,
    TOKEN_B,
    Server,
    call,
    run_server,
    submit,
    wait_state,
)

TOKEN_C = "tenant-c-token-0123"

# team-b's queue comes first: the partition's first queue was everyone's default before
CONFIG = f"""
name: default-queue-test
{NODES}
partitions:
  training:
    nodes: [h100]
    admits: [training, batch]
    sharing: exclusive
queues:
  - {{name: b-queue, partition: training, tenant: team-b, nominal_gpus: 4}}
  - {{name: a-queue, partition: training, tenant: team-a, nominal_gpus: 4}}
control:
  auth:
    admin_token: "{ADMIN}"
    tenants:
      team-a: {{token: "{TOKEN_A}"}}
      team-b: {{token: "{TOKEN_B}"}}
      team-c: {{token: "{TOKEN_C}"}}
  # test servers under pytest's 0700 tmp dirs, jobs from root's venv: explicitly root
  tenants: {{team-a: {{run_as: root, allow_root: true}}, team-b: {{run_as: root, allow_root: true}},
            team-c: {{run_as: root, allow_root: true}}}}
  stop_grace_s: 2
"""


@pytest.fixture(scope="module")
def tenants_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from run_server(tmp_path_factory.mktemp("default-queue"), CONFIG)


@pytest.mark.parametrize(("token", "queue"), [(TOKEN_A, "a-queue"), (TOKEN_B, "b-queue")])
def test_a_job_naming_no_queue_is_charged_to_its_tenants_queue(
    tenants_server: Server, token: str, queue: str
) -> None:
    status, out = submit(tenants_server, {"command": ["true"], "gpus": 1}, token)
    assert status == 201, out
    job = wait_state(tenants_server, out["id"], ("done",))
    assert job["queue"] == queue


def test_a_tenant_owning_no_queue_there_is_told_to_name_one(tenants_server: Server) -> None:
    status, out = submit(tenants_server, {"command": ["true"], "gpus": 1}, TOKEN_C)
    assert status == 422, out
    assert "no queue of tenant team-c" in out["detail"] and "--queue" in out["detail"], out
    stored = call(tenants_server, "GET", f"/v1/jobs/{out['job']['id']}", TOKEN_C)[1]
    assert stored["state"] == "rejected"


def test_the_admins_job_keeps_the_partitions_first_queue(tenants_server: Server) -> None:
    status, out = submit(tenants_server, {"command": ["true"], "gpus": 1})
    assert status == 201, out
    assert wait_state(tenants_server, out["id"], ("done",))["queue"] == "b-queue"
