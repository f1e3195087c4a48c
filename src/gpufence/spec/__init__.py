"""Cluster specs: read YAML (or a dict) into a validated Cluster, or say exactly what is wrong."""

from __future__ import annotations

import os
import re
from pathlib import Path as FilePath

import yaml

from gpufence.model.cluster import Cluster
from gpufence.spec.build import cluster_from_dict
from gpufence.spec.catalogue import CATALOGUE, builtin_gpu_types
from gpufence.spec.errors import Path, SpecError, SpecIssue, format_path, format_spec_error
from gpufence.spec.schema import (
    ClusterSchema,
    GpuSelector,
    NodeSelector,
    parse_gpu_selector,
    parse_node_selector,
)

__all__ = [
    "CATALOGUE",
    "ClusterSchema",
    "GpuSelector",
    "NodeSelector",
    "SpecError",
    "SpecIssue",
    "builtin_gpu_types",
    "cluster_from_dict",
    "format_path",
    "format_spec_error",
    "load_cluster",
    "load_cluster_text",
    "parse_gpu_selector",
    "parse_node_selector",
    "parse_yaml_documents",
    "parse_yaml_text",
    "read_spec_file",
]

_BOOL_TAG = "tag:yaml.org,2002:bool"


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans (true/false only).

    YAML 1.1 reads a bare ``off``/``on``/``yes``/``no`` as a boolean, which would turn
    ``preemption: {mode: off}`` into ``mode: false``; pydantic still accepts yes/no for bools.
    """


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _index(
    node: yaml.Node, path: Path, lines: dict[Path, int], issues: list[SpecIssue], seen: set[int]
) -> None:
    """Record the source line of every field path, and report duplicate mapping keys."""
    if id(node) in seen:  # an alias: already indexed where its anchor is (and may recurse)
        return
    seen.add(id(node))
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            key, line = str(key_node.value), key_node.start_mark.line + 1
            child: Path = (*path, key)
            if key in first_line:
                # PyYAML silently keeps the last value: a second `serving:` would erase the first.
                msg = f"duplicate key (first at line {first_line[key]}); YAML keeps only the last"
                issues.append(SpecIssue(child, msg, line))
            else:
                first_line[key] = line
                lines[child] = line
            _index(value_node, child, lines, issues, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index(item, (*path, i), lines, issues, seen)


def _parse_yaml(text: str, source: str | None) -> tuple[object, dict[Path, int], list[SpecIssue]]:
    lines: dict[Path, int] = {}
    issues: list[SpecIssue] = []
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, lines, issues
        _index(node, (), lines, issues, set())
        return loader.construct_document(node), lines, issues
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        what = exc.problem or exc.context or "invalid YAML"
        context = f" ({exc.context})" if exc.problem and exc.context else ""
        raise SpecError([f"YAML syntax error at {where}: {what}{context}"], source) from None
    except yaml.YAMLError as exc:
        raise SpecError([f"YAML error: {exc}"], source) from None
    finally:
        loader.dispose()


def parse_yaml_text(
    text: str, source: str | None
) -> tuple[object, dict[Path, int], list[SpecIssue]]:
    """One YAML document read as cluster specs are (YAML 1.2 booleans), with the source line of
    every field path and its duplicate keys; a syntax error is a ``SpecError``."""
    return _parse_yaml(text, source)


def parse_yaml_documents(
    text: str, source: str | None, kind: str = "file"
) -> list[tuple[object, dict[Path, int], list[SpecIssue]]]:
    """Every document of a multi-document YAML text (``---`` between them), each with the
    source line of every field path and its duplicate keys, as cluster specs are read (YAML 1.2
    booleans); a syntax error is a ``SpecError`` naming line and column."""
    out: list[tuple[object, dict[Path, int], list[SpecIssue]]] = []
    loader = _Loader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            lines: dict[Path, int] = {}
            issues: list[SpecIssue] = []
            _index(node, (), lines, issues, set())
            out.append((loader.construct_document(node), lines, issues))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        what = exc.problem or exc.context or "invalid YAML"
        raise SpecError([f"YAML syntax error at {where}: {what}"], source, kind) from None
    except yaml.YAMLError as exc:
        raise SpecError([f"YAML error: {exc}"], source, kind) from None
    finally:
        loader.dispose()
    return out


def load_cluster_text(text: str, source: str | None = None) -> Cluster:
    """Build a Cluster from YAML text; ``source`` (a file name) is used in error messages."""
    return _build(text, source, ())[0]


def load_cluster_with_sections(
    path: str | os.PathLike[str],
    sections: tuple[str, ...],
    node_defaults: dict[str, object] | None = None,
) -> tuple[Cluster, dict[str, object], dict[Path, int]]:
    """Like ``load_cluster``, but top-level keys in ``sections`` (e.g. the control plane's
    ``control:``) are taken out and returned raw for their owner to validate, with the source
    line of every field path. ``node_defaults`` fills node-group fields the file leaves out
    (the local control plane gives this machine's ``cpu_cores`` and ``memory_gib``)."""
    return _build(_read(path), os.fspath(path), sections, node_defaults or {})


def _build(
    text: str,
    source: str | None,
    sections: tuple[str, ...],
    node_defaults: dict[str, object] | None = None,
) -> tuple[Cluster, dict[str, object], dict[Path, int]]:
    data, lines, yaml_issues = _parse_yaml(text, source)
    extra: dict[str, object] = {}
    if isinstance(data, dict):
        for key in sections:
            if key in data:
                extra[key] = data.pop(key)
        groups = data.get("node_groups")
        for g in groups if isinstance(groups, list) and node_defaults else ():
            if isinstance(g, dict):
                for k, v in (node_defaults or {}).items():
                    g.setdefault(k, v)
    try:
        cluster = cluster_from_dict(data, source=source, lines=lines)
    except SpecError as exc:
        raise SpecError([*yaml_issues, *exc.issues], source) from None
    if yaml_issues:
        raise SpecError(yaml_issues, source)
    return cluster, extra, lines


def load_cluster(path: str | os.PathLike[str]) -> Cluster:
    """Build a Cluster from a YAML file; SpecError lists every problem (format_spec_error)."""
    return load_cluster_text(_read(path), source=os.fspath(path))


def read_spec_file(path: str | os.PathLike[str]) -> str:
    """A spec file's text; a SpecError naming the file when it is missing or unreadable."""
    return _read(path)


def _read(path: str | os.PathLike[str]) -> str:
    source = os.fspath(path)
    try:
        text = FilePath(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError([f"cluster file {source!r} not found"], source) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([f"cannot read cluster file {source!r}: {exc}"], source) from None
    return text
