"""Job files, ``#GPUFENCE`` directives, array specs and ``--wait`` exit codes, without a server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufence.cli.examples_verb import examples_dir
from gpufence.cli.jobfile import load_job_file, read_directives, script_command
from gpufence.cli.jobrefs import exit_code_of, wait_exit
from gpufence.control.base.arrays import ArraySpecError, parse_array
from gpufence.control.base.jobspec import SubmitRequest
from gpufence.spec import SpecError, format_spec_error

ARRAYS = [
    ("0-3", (0, 1, 2, 3), 0),
    ("1,3,5-7", (1, 3, 5, 6, 7), 0),
    ("0-99%8", tuple(range(100)), 8),
    ("0-10:5", (0, 5, 10), 0),
    ("7", (7,), 0),
    ("3,1,3", (1, 3), 0),
]


@pytest.mark.parametrize(("text", "indices", "cap"), ARRAYS)
def test_array_specs(text: str, indices: tuple[int, ...], cap: int) -> None:
    assert parse_array(text) == (indices, cap)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("5-1", "is empty"),
        ("0-9%0", "the cap after %"),
        ("0-9%x", "the cap after %"),
        ("a-b", "is not an index or range"),
        ("1,,2", "an empty item"),
        ("0-20000", "at most 10000 tasks"),
    ],
)
def test_bad_array_specs(text: str, why: str) -> None:
    with pytest.raises(ArraySpecError, match=why):
        parse_array(text)


def test_the_shipped_job_file_is_valid() -> None:
    docs = load_job_file(examples_dir() / "jobs-sweep.yaml", "/tmp")
    assert [d.body["name"] for d in docs] == ["sweep-prep", "sweep", "sweep-report"]
    sweep = SubmitRequest.model_validate(docs[1].body)
    assert sweep.after_ok == ["sweep-prep"] and sweep.array == "0-7%2"


BAD = [
    ("command: [x]\n", ["f.yaml:1: apiVersion: required field", "f.yaml:1: kind: required"]),
    (
        "apiVersion: gpufence/v2\nkind: Job\ncommand: [x]\n",
        ["f.yaml:1: apiVersion: 'gpufence/v2' is not supported (write apiVersion: gpufence/v1)"],
    ),
    (
        "apiVersion: gpufence/v1\nkind: Job\ncommand: [x]\n---\napiVersion: gpufence/v1\n"
        "kind: Job\ncommand: [x]\nreplicas: 0\narray: 3-1\n",
        ["f.yaml:8: replicas: ", "f.yaml:9: array: range '3-1' is empty"],
    ),
    ("apiVersion: gpufence/v1\nkind: Job\n", ["f.yaml:1: command: required field is missing"]),
    ("- a\n- b\n", ["f.yaml:1: document 1 is not a mapping"]),
    ("apiVersion: [\n", ["YAML syntax error at line 2"]),
    ("", ["holds no document"]),
]


@pytest.mark.parametrize(("text", "wanted"), BAD)
def test_job_file_errors_name_line_and_field(tmp_path: Path, text: str, wanted: list[str]) -> None:
    f = tmp_path / "f.yaml"
    f.write_text(text)
    with pytest.raises(SpecError) as err:
        load_job_file(f, "/tmp")
    report = format_spec_error(err.value).replace(str(f), "f.yaml")
    for w in wanted:
        assert w in report, report


def test_relative_cwd_is_from_the_files_directory(tmp_path: Path) -> None:
    f = tmp_path / "f.yaml"
    f.write_text("apiVersion: gpufence/v1\nkind: Job\ncommand: [x]\ncwd: sub\n")
    (doc,) = load_job_file(f, "/elsewhere")
    assert doc.body["cwd"] == str(tmp_path / "sub")


def test_a_relative_container_image_is_from_the_files_directory(tmp_path: Path) -> None:
    f = tmp_path / "f.yaml"
    f.write_text("apiVersion: gpufence/v1\nkind: Job\ncommand: [x]\ncontainer: images/rootfs\n")
    (doc,) = load_job_file(f, "/elsewhere")
    assert doc.body["container"] == str(tmp_path / "images" / "rootfs")


def test_directives_stop_at_the_first_command(tmp_path: Path) -> None:
    s = tmp_path / "s.sh"
    s.write_text(
        "#!/usr/bin/env bash\n\n# about\n#GPUFENCE --gpus 2  # trailing comment\n"
        "#GPUFENCEX --nope\n#GPUFENCE --name 'a b'\necho hi\n#GPUFENCE --gpus 9\n"
    )
    assert read_directives(s) == [(4, ["--gpus", "2"]), (6, ["--name", "a b"])]
    assert script_command(s) == ["/usr/bin/env", "bash", str(s.resolve())]
    plain = tmp_path / "p.sh"
    plain.write_text("echo hi\n")
    assert script_command(plain) == ["/bin/sh", str(plain.resolve())]


def test_unbalanced_quote_in_a_directive(tmp_path: Path) -> None:
    s = tmp_path / "s.sh"
    s.write_text("#GPUFENCE --name 'oops\n")
    with pytest.raises(SpecError) as err:
        read_directives(s)
    assert err.value.issues[0].line == 1


WAIT = [
    ({"state": "done", "exit_code": 0}, 0),
    ({"state": "failed", "exit_code": 7}, 7),
    ({"state": "failed", "exit_code": 300}, 255),
    ({"state": "failed", "exit_code": -9, "reason": "oom"}, 137),
    ({"state": "failed", "exit_code": -15, "reason": "time-limit"}, 124),
    ({"state": "failed", "exit_code": None, "reason": "lost"}, 1),
    ({"state": "cancelled", "exit_code": None, "reason": "dependency"}, 3),
    ({"state": "reclaimed", "exit_code": -15}, 3),
]


@pytest.mark.parametrize(("job", "code"), WAIT)
def test_wait_exit_codes(job: dict[str, Any], code: int) -> None:
    assert exit_code_of(job) == code


def test_an_arrays_wait_code_is_its_first_failure() -> None:
    jobs = [{"state": "done"}, {"state": "failed", "exit_code": 2}, {"state": "cancelled"}]
    assert wait_exit(jobs) == 2
    assert wait_exit([{"state": "done"}, {"state": "done"}]) == 0
