"""Advice as text (CLI) and as HTML (the simulator's report); the JSON form is
``Advice.to_json``."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpufence.advice.record import Advice, Severity


def failing(advice: Iterable[Advice]) -> list[Advice]:
    """What ``--strict`` turns into errors: every warning."""
    return [a for a in advice if a.severity is Severity.WARNING]


def text(a: Advice, source: str | None = None, as_error: bool = False) -> list[str]:
    """A few lines: the headline with rule, file:line and field path, then why, fix and diff."""
    return json_text(a.to_json(), source, as_error)


def json_text(a: Mapping[str, Any], source: str | None = None, as_error: bool = False) -> list[str]:
    """``text`` for advice in its JSON form (what ``GET /v1/advice`` returns)."""
    level = "error" if as_error else str(a.get("severity", ""))
    line = a.get("line")
    where = ""
    if source and line is not None:
        where = f"{source}:{line}: "
    elif line is not None:
        where = f"line {line}: "
    field = f"{a['path']}: " if a.get("path") else ""
    ev = a.get("evidence")
    summary = ev.get("summary", "") if isinstance(ev, Mapping) else ""
    out = [
        f"{level}: {where}{field}{summary} [{a.get('rule', '')}]",
        f"  why: {a.get('why', '')}",
        f"  fix: {a.get('fix', '')}",
    ]
    diff = str(a.get("diff") or "")
    if diff:
        out += ["    " + d for d in diff.splitlines()]
    return out


def text_block(advice: Sequence[Advice], source: str | None = None, strict: bool = False) -> str:
    lines: list[str] = []
    for a in advice:
        lines += text(a, source, as_error=strict and a.severity is Severity.WARNING)
    return "\n".join(lines)


def count_line(advice: Sequence[Advice], strict: bool = False) -> str:
    n = len(failing(advice))
    info = len(advice) - n
    what = "error" if strict else "warning"
    parts = [f"{n} {what}{'s' if n != 1 else ''}"] if n else []
    parts += [f"{info} note{'s' if info != 1 else ''}"] if info else []
    tail = (" (--strict)" if strict else " (--strict makes warnings errors)") if n else ""
    return "advice: " + ", ".join(parts) + tail if parts else "advice: none"


def html_section(items: Sequence[Mapping[str, Any]], title: str = "Advice") -> str:
    """An HTML section listing advice given as JSON objects (metrics.json's ``advice``)."""
    if not items:
        return f"<h3>{html.escape(title)}</h3><p class=advice-none>No advice: no rule fired.</p>"
    rows = []
    for a in items:
        ev = a.get("evidence", {})
        summary = ev.get("summary", "") if isinstance(ev, Mapping) else ""
        diff = a.get("diff") or ""
        rows.append(
            "<li class=advice>"
            f"<b>{html.escape(str(a.get('severity', '')))}</b> "
            f"<code>{html.escape(str(a.get('rule', '')))}</code> "
            + (f"<code>{html.escape(str(a['path']))}</code> " if a.get("path") else "")
            + f"{html.escape(str(summary))}"
            f"<p><i>why</i>: {html.escape(str(a.get('why', '')))}</p>"
            f"<p><i>fix</i>: {html.escape(str(a.get('fix', '')))}</p>"
            + (f"<pre>{html.escape(str(diff))}</pre>" if diff else "")
            + "</li>"
        )
    return f"<h3>{html.escape(title)}</h3><ul class=advice-list>{''.join(rows)}</ul>"
