"""Issue 30 case 7 (its last part): a tenant's pending jobs have a cap.

Without it one tenant can queue job after job (or 10,000-task arrays) until every restart reads
back millions of rows. The cap (``control.max_pending_jobs``, per tenant under
``control.tenants.<name>``) counts pending jobs, held ones and every task of an array; a
submit past it is 429 naming the cap and the fix, and nothing of it is stored. The admin has
no cap; other tenants are not affected.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from api_helpers import ADMIN, CONFIG, TOKEN_A, TOKEN_B, Server, call, run_server, submit

CAPPED = CONFIG.replace(
    "  stop_grace_s: 2\n", "  stop_grace_s: 2\n  max_pending_jobs: 5\n"
).replace(
    "team-b: {run_as: root, allow_root: true}",
    "team-b: {run_as: root, allow_root: true, max_pending_jobs: 12}",
)
HELD = {"command": ["true"], "hold": True}  # stays pending until released


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    assert CAPPED != CONFIG
    yield from run_server(Path(tmp_path_factory.mktemp("cap")), CAPPED)


def _pending(srv: Server, token: str) -> int:
    status, out, _ = call(srv, "GET", "/v1/jobs?state=pending&limit=1000", token)
    assert status == 200, out
    return len(out["jobs"] if isinstance(out, dict) else out)


def test_a_tenant_past_its_cap_gets_429_naming_it(server: Server) -> None:
    for _ in range(5):
        status, out = submit(server, HELD, TOKEN_A)
        assert status == 201, out
    status, out = submit(server, HELD, TOKEN_A)
    assert status == 429, out
    assert out["type"] == "urn:gpufence:problem:too-many-pending"
    assert "cap of 5" in out["detail"] and "control.max_pending_jobs" in out["detail"]
    assert "cancel some" in out["detail"]
    assert _pending(server, TOKEN_A) == 5  # nothing of the refused submit was stored
    # others are not affected: the admin has no cap, team-b its own
    assert submit(server, HELD, ADMIN)[0] == 201
    assert submit(server, HELD, TOKEN_B)[0] == 201
    # a cancel makes room again
    status, jobs, _ = call(server, "GET", "/v1/jobs?state=pending&limit=1", TOKEN_A)
    first = (jobs["jobs"] if isinstance(jobs, dict) else jobs)[0]["id"]
    assert call(server, "POST", f"/v1/jobs/{first}/cancel", TOKEN_A)[0] == 200
    assert submit(server, HELD, TOKEN_A)[0] == 201


def test_an_array_counts_every_task(server: Server) -> None:
    status, out = submit(server, {**HELD, "array": "0-11"}, TOKEN_B)  # 1 pending + 12 > 12
    assert status == 429, out
    assert "12 more would pass its cap of 12" in out["detail"], out
    assert "control.tenants.team-b.max_pending_jobs" in out["detail"]
    status, out = submit(server, {**HELD, "array": "0-10"}, TOKEN_B)  # 1 + 11 = 12: fits
    assert status == 201, out
    assert len(out["tasks"]) == 11
    assert submit(server, HELD, TOKEN_B)[0] == 429
