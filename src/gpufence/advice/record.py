"""One piece of advice: which rule, how bad, where (the field path), why, the evidence, the fix.

Rules return these records and nothing else; the CLI, the API, ``metrics.json`` and the report
render them. ``evidence`` is plain JSON-able data (counts, time ranges, job ids, GPU numbers)
plus a one-line ``summary``; ``diff`` is a spec change in YAML terms when the fix can be
written as one (``-`` the line as it is, ``+`` the line as it should be).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from gpufence.spec.errors import Path, format_path


class Severity(StrEnum):
    INFO = "info"  # worth knowing; never fails --strict
    WARNING = "warning"  # an anti-pattern; --strict makes it an error


class Scope(StrEnum):
    CLUSTER = "cluster"  # about the spec or the cluster as a whole: admins only
    JOBS = "jobs"  # about particular jobs: their tenants see it too


@dataclass(frozen=True)
class Advice:
    rule: str  # stable id, e.g. "serving-shares-partition"
    severity: Severity
    path: Path  # the spec field to change, () when the advice is about jobs, not the spec
    why: str  # what is wrong and why it matters (quoting the operating wisdom it encodes)
    evidence: Mapping[str, Any]  # "summary" plus the numbers and jobs that make it true
    fix: str  # the change to make
    diff: str = ""  # the change as a spec diff, when it can be written as one
    scope: Scope = Scope.CLUSTER
    tenants: tuple[str, ...] = field(default=(), compare=False)  # whose jobs the evidence names
    line: int | None = field(default=None, compare=False)  # source line of ``path``, if known

    @property
    def where(self) -> str:
        return format_path(self.path) if self.path else ""

    @property
    def summary(self) -> str:
        return str(self.evidence.get("summary", ""))

    def located(self, lines: Mapping[Path, int]) -> Advice:
        """The same advice with the source line of its path (or of the nearest ancestor)."""
        path = self.path
        while path and path not in lines:
            path = path[:-1]
        return replace(self, line=lines.get(path)) if path else self

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rule": self.rule,
            "severity": str(self.severity),
            "path": self.where,
            "why": self.why,
            "evidence": dict(self.evidence),
            "fix": self.fix,
            "diff": self.diff,
            "scope": str(self.scope),
        }
        if self.line is not None:
            out["line"] = self.line
        return out


def gpus(x: float) -> str:
    """12 -> '12 GPUs', 1 -> '1 GPU', 2.5 -> '2.5 GPUs'."""
    return f"{x:g} GPU" + ("" if x == 1 else "s")


def pct(x: float) -> str:
    return f"{x:.0%}"


def hours(seconds: float) -> str:
    """A duration for a sentence: '45 s', '12 min', '3.5 h', '2.0 days'."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def job_list(ids: list[str], limit: int = 8) -> str:
    if len(ids) <= limit:
        return ", ".join(ids)
    return ", ".join(ids[:limit]) + f" and {len(ids) - limit} more"
