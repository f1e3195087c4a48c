"""The body of ``PATCH /v1/jobs/{ref}`` (``gpufence update``): what may change after submit.

Each field has the range it has at submit (``jobspec.SubmitRequest``); the job's stored spec
with the change is validated again as a whole submit would be (``apply_to``), so a rule that
ties two fields (a time limit shorter than the estimate, say) holds after an update too.

Who may change what (``rules``): a tenant may only lower a job's time limit (a job with none
may be given one), and may lower its priority, or raise it up to the default 0 -- as Slurm
lets a user only lower what the scheduler gives a job, and its admin raise it. Raising a time
limit or a priority past those needs the admin token. The admin may do anything a submit
allows.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpufence.control.base.jobspec import (
    MAX_TIME_LIMIT_S,
    Float,
    Int,
    Label,
    SubmitRequest,
    describe_errors,
)

FIELDS = ("priority", "time_limit_s", "partition", "queue")
DEFAULT_PRIORITY = 0


class UpdateRequest(BaseModel):
    """The fields to change (at least one); a field left out keeps its value."""

    priority: Int | None = Field(
        default=None,
        ge=-1000,
        le=1000,
        description="the job's priority within its partition's queue order; a tenant may "
        "lower it, or raise it up to the default 0 (higher needs the admin token)",
    )
    time_limit_s: Float | None = Field(
        default=None,
        gt=0.0,
        le=MAX_TIME_LIMIT_S,
        description="wall-clock limit of one attempt in seconds, counted from the attempt's "
        "start; a tenant may only lower it (raising needs the admin token)",
    )
    partition: Label | None = Field(
        default=None, description="a pending job only: the partition it moves to"
    )
    queue: Label | None = Field(default=None, description="a pending job only: its new queue")

    model_config = ConfigDict(
        extra="forbid", allow_inf_nan=False, json_schema_extra=lambda s, _m: _tight(s)
    )

    @model_validator(mode="after")
    def _something(self) -> UpdateRequest:
        if not self.changes():
            raise ValueError(
                "give at least one of priority, time_limit_s, partition, queue to change"
            )
        return self

    def changes(self) -> dict[str, Any]:
        """The fields given, by name."""
        return {f: v for f in FIELDS if (v := getattr(self, f)) is not None}


_BOUNDS = {"gt": "exclusiveMinimum", "ge": "minimum", "lt": "exclusiveMaximum", "le": "maximum"}


def _tight(schema: dict[str, Any]) -> None:
    """The document says what the model takes: a field given is a value, never null (null
    is no change, as leaving it out: the document offers the one way), at least one field,
    and numeric bounds by their JSON Schema names (pydantic writes ``le`` for a number whose
    type has a validator of its own, ``jobspec.Int``; no client reads it)."""
    schema["minProperties"] = 1
    for name, prop in list(schema.get("properties", {}).items()):
        alts = [a for a in prop.pop("anyOf", []) if a.get("type") != "null"]
        merged = {**(alts[0] if alts else {}), **prop}
        merged.pop("default", None)
        numeric = merged.get("type") in ("number", "integer")
        schema["properties"][name] = {
            (_BOUNDS[k] if numeric and k in _BOUNDS else k): v for k, v in merged.items()
        }


class UpdateInvalid(ValueError):
    """The job with the change would not pass a submit's validation: ``field`` names why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def apply_to(spec: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """The stored ``spec`` with ``changes``, validated as a submit (``UpdateInvalid`` naming
    the field otherwise). Returns the new spec to store."""
    new = {**spec, **changes}
    try:
        req = SubmitRequest.model_validate(new)
    except ValidationError as exc:
        locs = [str(e["loc"][0]) for e in exc.errors() if e["loc"]]
        field = next((f for f in locs if f in changes), next(iter(changes)))
        raise UpdateInvalid(field, describe_errors(exc)) from None
    return req.stored()


_DEFAULTS: dict[str, Any] = {"priority": DEFAULT_PRIORITY, "partition": "", "queue": ""}


def effective(spec: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """The ``changes`` that change something (a retried update is no second change)."""
    return {f: v for f, v in changes.items() if spec.get(f, _DEFAULTS.get(f)) != v}


def rule_broken(spec: dict[str, Any], changes: dict[str, Any]) -> str | None:
    """Why a tenant (not the admin) may not make ``changes`` to a job stored as ``spec``."""
    limit = changes.get("time_limit_s")
    now_limit = spec.get("time_limit_s")
    if limit is not None and now_limit is not None and limit > now_limit:
        return (
            f"a tenant may only lower a job's time limit (now {now_limit:g} s, asked "
            f"{limit:g} s): raising it needs the admin token"
        )
    prio = changes.get("priority")
    now_prio = int(spec.get("priority", DEFAULT_PRIORITY))
    if prio is not None and prio > max(now_prio, DEFAULT_PRIORITY):
        return (
            f"a tenant may lower a job's priority, or raise it up to the default "
            f"{DEFAULT_PRIORITY} (now {now_prio}, asked {prio}): higher needs the admin token"
        )
    return None


def describe(spec: dict[str, Any], changes: dict[str, Any]) -> str:
    """``priority 0 -> 5, time_limit_s 3600 -> 1800``: what the audit event says changed."""
    parts = []
    for f, v in changes.items():
        old = spec.get(f, _DEFAULTS.get(f))
        parts.append(f"{f} {_show(old)} -> {_show(v)}")
    return ", ".join(parts)


def _show(v: object) -> str:
    if v is None:
        return "none"
    if v == "":
        return "(default)"
    return f"{v:g}" if isinstance(v, float) else str(v)
