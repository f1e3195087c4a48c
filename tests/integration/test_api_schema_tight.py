"""Issue 30 item 10: the OpenAPI document is as tight as the validation.

schemathesis generates requests the document calls valid (positive mode) for every operation;
the server must not refuse one of them for its shape (422). Before, it did for control
characters in strings, an empty ``command[0]``, numbers past their bounds (pydantic wrote
``le``/``gt``, no JSON Schema keywords, for the submit body's numbers), ``until`` before
``since``, a latency out of range and an unknown class or state. What no JSON Schema can say is
listed in ``STATE_OR_CROSS_FIELD``: refusals that depend on the server's state (a name taken, a
reference to no job, a key reused, a job that can never fit) or on two fields together.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from api_helpers import TOKEN_A, Server, run_server, submit, wait_state
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

EXAMPLES = int(os.environ.get("GPUFENCE_FUZZ_EXAMPLES", "40"))

STATE_OR_CROSS_FIELD = [
    ("header.Idempotency-Key", "was used for a different request"),  # the same key, twice
    ("body.name", "is the name of"),  # taken by a job that has not ended
    ("body.name", "looks like a job id"),  # j + digits: a lookahead no generator takes
    ("body.after_", "no job"),  # a reference to no job of the tenant
    ("body.after_", "brings the jobs it names to more than"),
    ("body.array", "is empty"),  # 5-3: ranges are read, not matched
    ("body.array", "at most"),
    ("body.array", "the cap after %"),
    ("body.metrics_url", "scrape_hosts"),  # the server's configuration
    ("body.cwd", "is not a directory the job's user"),  # the machine's file system
    ("body", ""),  # a rule on two fields (gpu_mem_gib goes with gpu_fraction, ...)
    ("query.since", "since must be before until"),  # /v1/series: two parameters
    ("query.step", "buckets"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    for srv in run_server(tmp_path_factory.mktemp("tight")):
        status, blocker = submit(srv, {"command": ["sleep", "3600"], "gpus": 8})
        assert status == 201, blocker
        wait_state(srv, blocker["id"], ("running",))
        yield srv


def _allowed(problem: dict[str, Any]) -> bool:
    if problem.get("type") == "urn:gpufence:problem:rejected":  # the scheduler: never fits
        return True
    errors = problem.get("errors") or [{"field": "body", "message": problem.get("detail", "")}]
    return all(
        any(
            (e["field"] == field if field in ("body",) else e["field"].startswith(field))
            and words in e["message"]
            for field, words in STATE_OR_CROSS_FIELD
        )
        for e in errors
    )


def _refusals(server: Server, op: Any) -> set[str]:
    """What the server refused for its shape among ``EXAMPLES`` valid requests to ``op``."""
    found: set[str] = set()

    @given(case=op.as_strategy(generation_mode=GenerationMode.POSITIVE))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def run(case: Any) -> None:
        resp = case.call(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN_A}"})
        if resp.status_code == 422 and not _allowed(resp.json()):
            found.add(resp.json()["detail"][:160])

    run()
    return found


def test_requests_the_document_calls_valid_are_not_refused_for_their_shape(
    server: Server,
) -> None:
    loaded = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    refused = {}
    for result in loaded.get_all_operations():
        op = result.ok()
        found = _refusals(server, op)
        if found:
            refused[op.label] = sorted(found)[:5]
    assert not refused, "\n".join(f"{op}: {d}" for op, d in refused.items())
