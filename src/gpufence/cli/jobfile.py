"""Job files (``gpufence submit -f jobs.yaml``) and ``#GPUFENCE`` directives in scripts.

A job file holds one or more YAML documents (``---`` between them), each one job::

    apiVersion: gpufence/v1      # the schema's version: required, exactly this
    kind: Job                    # required
    name: prep                   # then the fields of the API's submit body (SubmitRequest)
    command: [python, prep.py]
    gpus: 1

Every document is checked before anything is submitted; a problem is reported as
``file:line: field: message`` the way ``gpufence validate`` reports a cluster spec. ``cwd``
defaults to the directory ``submit`` runs in; a relative ``cwd`` is taken from the job file's
directory.

A script submitted as ``gpufence submit script.sh`` may carry ``#GPUFENCE --gpus 2 ...`` lines
(sbatch's ``#SBATCH`` convention): the options of ``submit``, read from the comment block at the
top of the script (after the ``#!`` line, before the first line that is neither blank nor a
comment). Options given on the command line win over a directive.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpufence.control.base.jobspec import SubmitRequest
from gpufence.spec import SpecError, SpecIssue, parse_yaml_documents
from gpufence.spec.errors import locate, validation_issues

API_VERSION = "gpufence/v1"
KIND = "Job"
DIRECTIVE = "#GPUFENCE"
KIND_LABEL = "job file"


@dataclass(frozen=True, slots=True)
class JobDoc:
    line: int  # where the document starts
    body: dict[str, Any]  # the submit body, checked against SubmitRequest


def _from_the_file(body: dict[str, Any], path: Path) -> None:
    """A relative ``cwd`` or ``container`` is taken from the directory of the file."""
    for key in ("cwd", "container"):
        rel = body.get(key)
        if isinstance(rel, str) and rel and not rel.startswith("/"):
            body[key] = str((path.parent / rel).resolve())


def load_job_file(path: Path, default_cwd: str) -> list[JobDoc]:
    """Every job of ``path``, or ``SpecError`` listing every problem of every document."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([f"cannot read it: {exc}"], str(path), KIND_LABEL) from None
    docs = parse_yaml_documents(text, str(path), KIND_LABEL)
    if not docs:
        raise SpecError(["it holds no document (expected apiVersion: gpufence/v1, kind: Job, ...)"],
                        str(path), KIND_LABEL)  # fmt: skip
    problems: list[SpecIssue] = []
    out: list[JobDoc] = []
    for n, (data, lines, dups) in enumerate(docs, 1):
        start = lines.get((), 1)
        found = list(dups)
        if not isinstance(data, dict):
            problems.append(SpecIssue((), f"document {n} is not a mapping of fields", start))
            continue
        body = dict(data)
        for key, want in (("apiVersion", API_VERSION), ("kind", KIND)):
            got = body.pop(key, None)
            if got is None:
                found.append(SpecIssue((key,), f"required field is missing (write {key}: {want})"))
            elif got != want:
                found.append(SpecIssue((key,), f"{got!r} is not supported (write {key}: {want})"))
        _from_the_file(body, path)
        body.setdefault("cwd", default_cwd)
        try:
            SubmitRequest.model_validate(body)
        except ValidationError as exc:
            found += validation_issues(exc, SubmitRequest)
        for issue in locate(found, lines):
            line = issue.line if issue.line is not None else start
            problems.append(SpecIssue(issue.path, issue.message, line))
        out.append(JobDoc(start, body))
    if problems:
        raise SpecError(problems, str(path), KIND_LABEL)
    return out


def read_directives(script: Path) -> list[tuple[int, list[str]]]:
    """(line, arguments) of each ``#GPUFENCE`` line at the top of ``script``; ``SpecError``
    names the line of one that is not valid shell words."""
    try:
        text = script.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []  # not a text script: no directives
    out: list[tuple[int, list[str]]] = []
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if i == 1 and line.startswith("#!"):
            continue
        if line.startswith(DIRECTIVE) and (line == DIRECTIVE or line[len(DIRECTIVE)].isspace()):
            try:
                out.append((i, shlex.split(line[len(DIRECTIVE) :], comments=True)))
            except ValueError as exc:
                issue = SpecIssue((), f"{DIRECTIVE}: {exc}", i)
                raise SpecError([issue], str(script), "script") from None
            continue
        if line and not line.startswith("#"):
            break  # the first command ends the directive block, as sbatch does
    return out


def script_command(script: Path) -> list[str]:
    """How a script runs: through its ``#!`` interpreter, else ``/bin/sh``."""
    path = str(script.resolve())
    try:
        with script.open("rb") as f:
            first = f.readline(4096)
    except OSError:
        first = b""
    if first.startswith(b"#!"):
        interp = first[2:].decode("utf-8", "replace").split()
        if interp:
            return [*interp, path]
    return ["/bin/sh", path]
