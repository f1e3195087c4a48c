"""SpecError, and schema validation that turns every problem into a line naming field and fix."""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from gpufence.spec.schema import (
    ClusterSchema,
    FabricSchema,
    GpuTypeSchema,
    NodeGroupSchema,
    PartitionFence,
    PartitionSchema,
    QueueSchema,
)

Path = tuple[str | int, ...]
M = TypeVar("M", bound=BaseModel)

# pydantic puts this marker after a dict key that failed validation.
_KEY_MARKER = "[key]"
_PATTERN_TYPES = frozenset({"string_pattern_mismatch"})
# pydantic's wording talks about python types ("a valid tuple"); say it in YAML terms.
_EXPECTED = {
    "string_type": "a string",
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "tuple_type": "a list",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}


def format_path(path: Path) -> str:
    """("partitions", "serving", "nodes", 0) -> "partitions.serving.nodes[0]"."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part != _KEY_MARKER:
            out += f".{part}" if out else part
    return out


@dataclass(frozen=True, slots=True)
class SpecIssue:
    """One problem: where it is (field path, source line when known) and what to do about it."""

    path: Path  # () = the document as a whole (file missing, YAML syntax)
    message: str
    line: int | None = None  # 1-based line in the source file, when the spec came from YAML
    # Where to look the source line up when ``path`` is empty or not in the file.
    anchor: Path | None = field(default=None, compare=False, repr=False)

    @property
    def text(self) -> str:
        return f"{format_path(self.path)}: {self.message}" if self.path else self.message


class SpecError(ValueError):
    """A cluster spec that cannot become a Cluster; ``errors`` lists every problem found."""

    def __init__(
        self,
        issues: Iterable[SpecIssue | str],
        source: str | None = None,
        kind: str = "cluster spec",
    ) -> None:
        self.issues = [i if isinstance(i, SpecIssue) else SpecIssue((), i) for i in issues]
        self.errors = [i.text for i in self.issues]
        self.source = source
        self.kind = kind  # what was wrong: "cluster spec", "scenario", "command line"
        super().__init__("\n".join(self.errors))

    def __str__(self) -> str:
        return "\n".join(self.errors)


def format_spec_error(err: SpecError) -> str:
    """A CLI-ready report: a header, then one ``file:line: path: message`` line per problem."""
    n = len(err.issues)
    what = f"{err.kind} {err.source!r}" if err.source else err.kind
    lines = [f"error: {what} has {n} problem{'s' if n != 1 else ''}:"]
    for issue in err.issues:
        if issue.line is not None:
            where = f"{err.source}:{issue.line}: " if err.source else f"line {issue.line}: "
        else:
            where = ""
        lines.append(f"  {where}{issue.text}")
    return "\n".join(lines)


def locate(issues: Iterable[SpecIssue], lines: Mapping[Path, int]) -> list[SpecIssue]:
    """Attach the source line of each issue's anchor or path, or of its nearest ancestor."""
    out: list[SpecIssue] = []
    for issue in issues:
        path = issue.anchor if issue.anchor is not None else issue.path
        while path and path not in lines:
            path = path[:-1]
        line = lines.get(path) if path else issue.line
        out.append(SpecIssue(issue.path, issue.message, line, issue.anchor))
    return out


def number_ranges(values: Sequence[int]) -> str:
    """[0, 1, 2, 3, 6] -> "0-3,6" (values sorted ascending)."""
    out: list[str] = []
    start = prev = values[0]
    for v in (*values[1:], None):
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ",".join(out)


def name_list(names: Iterable[object], limit: int = 16) -> str:
    """Comma-joined names; long lists are cut so one error line stays readable."""
    items = [str(n) for n in names]
    if len(items) > limit:
        return ", ".join(items[:limit]) + f", ... ({len(items)} in all)"
    return ", ".join(items) or "none"


def suggest(word: str, choices: Iterable[str]) -> str:
    """A "; did you mean 'x'?" tail when a close match exists, else "" (for typo-shaped names)."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _unwrap_optional(tp: object) -> object:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _model_at(root: type[BaseModel], loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The schema model that the field path ``loc`` points into (to list its allowed fields)."""
    tp: object = root
    for part in loc:
        tp = _unwrap_optional(tp)
        origin = get_origin(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            fields = {(f.alias or name): f for name, f in tp.model_fields.items()}
            if not isinstance(part, str) or part not in fields:
                return None
            tp = fields[part].annotation
        elif origin in (list, tuple) and isinstance(part, int):
            tp = get_args(tp)[0]
        elif origin is dict:
            tp = get_args(tp)[1]
        else:
            return None
    tp = _unwrap_optional(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def allowed_fields(model: type[BaseModel]) -> list[str]:
    return sorted((f.alias or name) for name, f in model.model_fields.items())


def _lowercase_first(msg: str) -> str:
    return msg[:1].lower() + msg[1:]


def _issue_for(err: ErrorDetails, root: type[BaseModel], prefix: Path) -> SpecIssue:
    loc: Path = tuple(err["loc"])
    kind = err["type"]
    value: Any = err.get("input")
    ctx: Mapping[str, Any] = err.get("ctx") or {}
    path = prefix + loc
    if kind == "extra_forbidden":
        model = _model_at(root, loc[:-1])
        allowed = allowed_fields(model) if model else []
        tail = f" (allowed: {name_list(allowed, limit=32)})" if allowed else ""
        return SpecIssue(path, f"unknown field{tail}{suggest(str(loc[-1]), allowed)}")
    if kind in ("enum", "literal_error"):
        expected = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        hint = suggest(str(value), expected)
        return SpecIssue(
            path, f"{value!r} is not valid (expected one of: {name_list(expected)}){hint}"
        )
    if kind == "missing":
        return SpecIssue(path, "required field is missing")
    if kind in _PATTERN_TYPES:
        what = "name" if loc and loc[-1] == _KEY_MARKER else "value"
        return SpecIssue(
            path,
            f"{value!r} is not a valid {what} (use letters, digits, '.', '_' and '-', "
            "starting with a letter or digit)",
        )
    if kind in _EXPECTED:
        return SpecIssue(path, f"{value!r} is not valid (expected {_EXPECTED[kind]})")
    if kind == "too_short" and ctx.get("min_length") == 1:
        return SpecIssue(path, "must not be empty")
    if kind == "value_error":
        # Our own validators raise ValueError with a complete sentence; drop pydantic's prefix.
        return SpecIssue(path, str(ctx.get("error", err["msg"])))
    return SpecIssue(path, f"{value!r} is not valid ({_lowercase_first(err['msg'])})")


def validation_issues(
    exc: ValidationError, root: type[BaseModel], prefix: Path = ()
) -> list[SpecIssue]:
    """One SpecIssue per pydantic error; ``root`` is the model that was validated at ``prefix``."""
    return [_issue_for(e, root, prefix) for e in exc.errors(include_url=False)]


@dataclass
class SchemaParts:
    """The document split into items that passed the schema; broken items are only named."""

    name: str
    fabric: FabricSchema
    gpu_types: list[tuple[int, GpuTypeSchema]]
    groups: list[tuple[int, NodeGroupSchema]]
    # A partition whose other fields are invalid is kept as its PartitionFence when the
    # selectors are fine, so overlaps and unfenced GPUs are still found.
    partitions: list[tuple[str, PartitionFence]]
    queues: list[tuple[int, QueueSchema]]
    # Section -> names of items that failed the schema (None: name unreadable); "fences" names
    # partitions whose selectors failed too. References to them are not reported again, and
    # checks that need the whole picture are skipped.
    broken: dict[str, set[str | None]] = field(default_factory=dict)

    def is_broken(self, section: str, name: str) -> bool:
        names = self.broken.get(section, set())
        return name in names or None in names


def _valid_items(model: type[M], raw: object, broken: set[str | None]) -> list[tuple[int, M]]:
    out: list[tuple[int, M]] = []
    for i, item in enumerate(raw if isinstance(raw, list | tuple) else ()):
        try:
            out.append((i, model.model_validate(item)))
        except ValidationError:
            name = item.get("name") if isinstance(item, Mapping) else None
            broken.add(name if isinstance(name, str) else None)
    return out


def validate_schema(data: Mapping[str, object]) -> tuple[SchemaParts, list[SpecIssue]]:
    """Every schema problem of ``data``, plus the items that are valid on their own."""
    try:
        spec = ClusterSchema.model_validate(data)
    except ValidationError as exc:
        issues = validation_issues(exc, ClusterSchema)
    else:
        parts = SchemaParts(
            spec.name,
            spec.fabric,
            list(enumerate(spec.gpu_types)),
            list(enumerate(spec.node_groups)),
            list(spec.partitions.items()),
            list(enumerate(spec.queues)),
        )
        return parts, []
    # Salvage every item that is fine on its own so that the cross-field checks still find
    # their problems in the same run: the user fixes everything in one edit.
    broken: dict[str, set[str | None]] = {
        s: set() for s in ("gpu_types", "node_groups", "partitions", "fences", "queues")
    }
    partitions: list[tuple[str, PartitionFence]] = []
    raw_parts = data.get("partitions")
    if not isinstance(raw_parts, Mapping):
        broken["fences"].add(None)  # no fences at all: "GPUs in no partition" would be noise
    for pname, raw in raw_parts.items() if isinstance(raw_parts, Mapping) else ():
        try:
            partitions.append((str(pname), PartitionSchema.model_validate(raw)))
            continue
        except ValidationError:
            broken["partitions"].add(str(pname))
        try:
            partitions.append((str(pname), PartitionFence.model_validate(raw)))
        except ValidationError:
            broken["fences"].add(str(pname))
    try:
        fabric = FabricSchema.model_validate(data.get("fabric") or {})
    except ValidationError:
        fabric = FabricSchema()
    name = data.get("name")
    parts = SchemaParts(
        name if isinstance(name, str) else "",
        fabric,
        _valid_items(GpuTypeSchema, data.get("gpu_types"), broken["gpu_types"]),
        _valid_items(NodeGroupSchema, data.get("node_groups"), broken["node_groups"]),
        partitions,
        _valid_items(QueueSchema, data.get("queues"), broken["queues"]),
        broken,
    )
    return parts, issues
