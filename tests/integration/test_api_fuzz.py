"""A bounded schemathesis run over ``/openapi.json``: valid and invalid requests for every
operation, against a real server on 127.0.0.1. No request may get a server error (5xx other than
the documented 503), and every response must match what the OpenAPI document says.

The fuzzer submits jobs with generated argv: as a tenant (so it cannot cancel the admin's
blocker) on a cluster whose GPUs one admin job holds for the whole run, so nothing it submits
ever executes. ``GPUFENCE_FUZZ_EXAMPLES`` sets the examples per operation (default 25).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from api_helpers import ADMIN, TOKEN_A, Server, run_server, submit, wait_state
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

EXAMPLES = int(os.environ.get("GPUFENCE_FUZZ_EXAMPLES", "25"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    for srv in run_server(tmp_path_factory.mktemp("fuzz")):
        status, blocker = submit(srv, {"command": ["sleep", "3600"], "gpus": 8})
        assert status == 201, blocker
        wait_state(srv, blocker["id"], ("running",))
        yield srv


def _operations(url: str) -> list[Any]:
    loaded = schemathesis.openapi.from_url(f"{url}/openapi.json")
    return [result.ok() for result in loaded.get_all_operations()]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_server_errors_and_responses_match_the_schema(
    fuzz_server: Server, mode: GenerationMode
) -> None:
    """Every operation, valid (positive) and invalid (negative) requests. (Driven through
    hypothesis directly: schemathesis' pytest plugin does not run under pytest 9.)"""
    failures: list[str] = []
    operations = _operations(fuzz_server.url)
    assert len(operations) >= 10, [op.label for op in operations]
    for op in operations:

        @given(case=op.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def run(case: Any) -> None:
            case.call_and_validate(
                base_url=fuzz_server.url,
                headers={"Authorization": f"Bearer {TOKEN_A}"},
                checks=CHECKS,
            )

        try:
            run()
        except Unsatisfiable:  # no parameters to make invalid (negative mode): nothing to send
            continue
        except Exception as exc:  # collect all, report together
            failures.append(f"{op.label}: {str(exc)[:2000]}")
    assert not failures, "\n\n".join(failures)


def test_the_blocker_still_holds_every_gpu(fuzz_server: Server) -> None:
    """Nothing the fuzzer sent ran (or freed the GPUs for something that would)."""
    from api_helpers import call

    status, body, _ = call(fuzz_server, "GET", "/v1/nodes", ADMIN)
    assert status == 200
    (node,) = body["nodes"]
    assert {tuple(g["jobs"]) for g in node["gpus"]} == {("j1",)}
