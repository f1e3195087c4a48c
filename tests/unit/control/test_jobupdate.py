"""``control/base/jobupdate.py``: who may change what (a tenant only lowers), the job with the
change validated as a submit, the audit text, and the document the body's schema makes."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gpufence.control.base.jobupdate import (
    UpdateInvalid,
    UpdateRequest,
    apply_to,
    describe,
    effective,
    rule_broken,
)

SPEC: dict[str, Any] = {"command": ["true"], "priority": 0, "partition": "", "queue": "qa"}

# (the stored spec's extra fields, the change, a tenant may?)
RULES = [
    pytest.param({"time_limit_s": 600.0}, {"time_limit_s": 60.0}, True, id="limit-lowered"),
    pytest.param({"time_limit_s": 600.0}, {"time_limit_s": 601.0}, False, id="limit-raised"),
    pytest.param({}, {"time_limit_s": 99.0}, True, id="limit-given-to-a-job-without-one"),
    pytest.param({}, {"priority": -3}, True, id="priority-lowered"),
    pytest.param({}, {"priority": 1}, False, id="priority-above-default"),
    pytest.param({"priority": -5}, {"priority": 0}, True, id="priority-back-to-default"),
    pytest.param({"priority": 5}, {"priority": 3}, True, id="priority-lowered-from-above"),
    pytest.param({"priority": 5}, {"priority": 6}, False, id="priority-raised-above"),
    pytest.param({}, {"partition": "spare", "queue": "sa"}, True, id="move"),
]


@pytest.mark.parametrize(("extra", "changes", "may"), RULES)
def test_a_tenant_only_lowers(extra: dict[str, Any], changes: dict[str, Any], may: bool) -> None:
    broken = rule_broken({**SPEC, **extra}, changes)
    assert (broken is None) is may
    if not may:
        assert "admin token" in (broken or "")


def test_the_change_is_validated_as_a_submit() -> None:
    with pytest.raises(UpdateInvalid) as err:
        apply_to({**SPEC, "est_runtime_s": 100.0}, {"time_limit_s": 50.0})
    assert err.value.field == "time_limit_s" and "est_runtime_s (100)" in str(err.value)
    assert apply_to(SPEC, {"priority": -2})["priority"] == -2


def test_audit_text_and_no_op_changes() -> None:
    assert describe(SPEC, {"priority": -2, "partition": "spare", "time_limit_s": 60.0}) == (
        "priority 0 -> -2, partition (default) -> spare, time_limit_s none -> 60"
    )
    assert effective({**SPEC, "priority": 3}, {"priority": 3, "queue": "qa"}) == {}
    assert effective(SPEC, {"partition": ""}) == {}
    assert effective({"command": ["x"]}, {"priority": 0, "time_limit_s": 5.0}) == {
        "time_limit_s": 5.0
    }


def test_the_body_needs_a_field_and_refuses_others() -> None:
    with pytest.raises(ValidationError, match="give at least one of"):
        UpdateRequest.model_validate({})
    with pytest.raises(ValidationError):
        UpdateRequest.model_validate({"gpus": 2})
    with pytest.raises(ValidationError):
        UpdateRequest.model_validate({"time_limit_s": 0})


def test_the_document_says_what_the_model_takes() -> None:
    schema = UpdateRequest.model_json_schema()
    assert schema["minProperties"] == 1 and schema["additionalProperties"] is False
    props = schema["properties"]
    assert props["priority"] == {**props["priority"], "type": "integer", "minimum": -1000}
    assert props["time_limit_s"]["exclusiveMinimum"] == 0.0
    assert all("anyOf" not in p and "default" not in p for p in props.values())
