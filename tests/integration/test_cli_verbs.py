"""The client verbs of the CLI through a real server on 127.0.0.1 (8 fake GPUs, real processes).

One server for the module (``serve`` in a thread, port 0, a tmp data dir): the demo's fenced
machine (serving GPUs 0-1 preempting training in an incident, training 2-5, interactive 6-7).
Every list and show verb is run with ``-o json`` and its document checked, ``-o yaml`` parsed to
the same document, tables checked at 80 columns, ``--watch`` for one refresh, the errors that
must exit 2, the logs of both streams and of a requeued job, and the one-line failures.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_server import Cli, CliServer, cli_for, cli_server
from typer.testing import CliRunner

from gpufence.cli.main import app
from gpufence.control.gpus.discovery import fake_gpus
from gpufence.demo.live import fenced_spec
from gpufence.testing.waiting import until, until_value

ADMIN = "cli-admin-token-0123456789"
PY = sys.executable
PROGRAMS = [PY, "-m", "gpufence.demo.programs"]
# prints on both streams, 1 s apart: o1 e1 o2 e2
BOTH_STREAMS = (
    "import sys, time\n"
    "for i in (1, 2):\n"
    "    print(f'o{i}', flush=True); time.sleep(1.0)\n"
    "    print(f'e{i}', file=sys.stderr, flush=True); time.sleep(1.0)\n"
)


Server = CliServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    spec = fenced_spec(fake_gpus(8))
    spec["partitions"]["serving"]["preemption"]["grace_s"] = 2
    spec["control"] = {"auth": {"admin_token": ADMIN}, "stop_grace_s": 2}
    yield from cli_server(tmp_path_factory.mktemp("cli"), spec, ADMIN)


@pytest.fixture
def cli(server: Server) -> Cli:
    return cli_for(server, ADMIN)


def wait_ended(srv: Server, jid: str, timeout: float = 30.0) -> dict[str, Any]:
    return until_value(
        lambda: srv.client.job(jid),
        lambda j: j["ended_at"] is not None,
        timeout,
        f"{jid} ended",
    )


def submit(cli: Cli, *args: str) -> str:
    r = cli("submit", *args)
    assert r.exit_code == 0, r.output
    return str(r.stdout.strip().splitlines()[0])


@pytest.fixture(scope="module")
def finished(server: Server) -> dict[str, str]:
    """A done job and a failed one (exit 3 after a line on stderr), ended."""
    runner = CliRunner()
    env = {"GPUFENCE_URL": server.url, "GPUFENCE_TOKEN": ADMIN, "GPUFENCE_DATA": None}

    def sub(*args: str) -> str:
        r = runner.invoke(app, ["submit", *args], env=env)
        assert r.exit_code == 0, r.output
        return str(r.stdout.strip())

    done = sub("--name", "ok-job", "--", PY, "-c", "print('hello')")
    code = "import sys; print('working'); print('boom: bad input', file=sys.stderr); sys.exit(3)"
    failed = sub("--", PY, "-c", code)
    for jid in (done, failed):
        wait_ended(server, jid)
    return {"done": done, "failed": failed}


def _json(r: Any) -> Any:
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


# --------------------------------------------------------------------- -o json, every verb

VERBS: list[tuple[str, list[str], Callable[[Any, dict[str, str]], None]]] = [
    (
        "queue --all",
        ["queue", "--all"],
        lambda d, f: {f["done"], f["failed"]} <= {j["id"] for j in d["jobs"]} and d["more"] == 0,
    ),
    (
        "queue --limit 1",
        ["queue", "--all", "--limit", "1"],
        lambda d, f: len(d["jobs"]) == 1 and d["more"] >= 1,
    ),
    ("queue (active)", ["queue"], lambda d, f: all(j["state"] != "done" for j in d["jobs"])),
    (
        "status done",
        ["status", "{done}"],
        lambda d, f: d["state"] == "done" and d["failure"] is None and d["attempts"],
    ),
    (
        "status failed",
        ["status", "{failed}"],
        lambda d, f: d["failure"] == "exit code 3: boom: bad input" and d["exit_code"] == 3,
    ),
    ("explain", ["explain", "{done}"], lambda d, f: d["id"] == f["done"] and "fair_share" in d),
    (
        "nodes",
        ["nodes"],
        lambda d, f: sum(len(n["gpus"]) for n in d["nodes"]) == 8,
    ),
    (
        "partitions",
        ["partitions"],
        lambda d, f: {p["name"] for p in d["partitions"]} == {"serving", "training", "interactive"},
    ),
    (
        "events --job",
        ["events", "--job", "{done}"],
        lambda d, f: (
            [e["kind"] for e in d["events"]][:2] == ["submitted", "bind"]
            and d["more"] == 0
            and d["next_after"] == d["events"][-1]["seq"]
        ),
    ),
    (
        "events --limit 2",
        ["events", "--limit", "2"],
        lambda d, f: len(d["events"]) == 2 and d["more"] > 0,
    ),
    ("top", ["top"], lambda d, f: set(d) == {"partitions", "nodes", "jobs"}),
    ("advise", ["advise"], lambda d, f: "advice" in d and "scope" in d),
]


@pytest.mark.parametrize(
    ("args", "check"), [(a, c) for _, a, c in VERBS], ids=[v[0] for v in VERBS]
)
def test_verb_json(cli: Cli, finished: dict[str, str], args: list[str], check: Any) -> None:
    argv = [a.format(**finished) for a in args]
    doc = _json(cli(*argv, "-o", "json"))
    assert check(doc, finished), json.dumps(doc)[:2000]


@pytest.mark.parametrize(
    "args",
    [["queue", "--all"], ["status", "{failed}"], ["partitions"], ["events", "--job", "{done}"]],
    ids=["queue", "status", "partitions", "events"],
)
def test_yaml_is_the_json_document(cli: Cli, finished: dict[str, str], args: list[str]) -> None:
    argv = [a.format(**finished) for a in args]
    as_json = _json(cli(*argv, "-o", "json"))
    r = cli(*argv, "-o", "yaml")
    assert r.exit_code == 0, r.output
    assert yaml.safe_load(r.stdout) == as_json


# ------------------------------------------------------------------------- tables, colour

LONG = "x" * 150


def test_tables_fit_80_columns_and_wide_shows_everything(
    server: Server, cli: Cli, finished: dict[str, str]
) -> None:
    jid = submit(cli, "--name", "n" * 40, "--", PY, "-c", f"print('{LONG}')")
    wait_ended(server, jid)
    for args in (["queue", "--all"], ["nodes"], ["partitions"], ["events"], ["top", "--once"]):
        r = cli(*args, env={"COLUMNS": "80"})
        assert r.exit_code == 0, r.output
        lines = r.stdout.splitlines()
        assert lines and max(len(line) for line in lines) <= 80, (args, r.stdout)
    r = cli("queue", "--all", env={"COLUMNS": "80"})
    assert "…" in r.stdout and "n" * 40 not in r.stdout  # the long name is cut
    row = next(line for line in r.stdout.splitlines() if line.lstrip().startswith(jid + " "))
    assert row.split()[0] == jid  # the id column is never the one cut
    r = cli("queue", "--all", "-o", "wide", env={"COLUMNS": "80"})
    assert r.exit_code == 0 and "n" * 40 in r.stdout and LONG in r.stdout  # name and command


COLOUR = re.compile(r"\x1b\[[0-9;]*(3[0-7]|9[0-7]|38;)")


def test_no_colour_when_not_a_tty_or_with_no_color(cli: Cli, finished: dict[str, str]) -> None:
    plain = cli("queue", "--all")
    assert plain.exit_code == 0 and not COLOUR.search(plain.stdout)  # not a terminal
    forced = cli("queue", "--all", env={"FORCE_COLOR": "1", "TERM": "xterm-256color"})
    assert COLOUR.search(forced.stdout), "a terminal gets colours (the check can see them)"
    no = cli("queue", "--all", env={"FORCE_COLOR": "1", "NO_COLOR": "1", "TERM": "xterm"})
    assert no.exit_code == 0 and not COLOUR.search(no.stdout)


# ------------------------------------------------------------------------------- --watch


def test_watch_refreshes(server: Server, finished: dict[str, str]) -> None:
    env = {**os.environ, "GPUFENCE_URL": server.url, "GPUFENCE_TOKEN": ADMIN}
    cmd = [PY, "-m", "gpufence", "queue", "--all", "-o", "json", "--watch", "--count", "2"]
    proc = subprocess.Popen([*cmd, "--interval", "3"], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    first = json.loads(proc.stdout.readline())
    jid = server.client.submit({"command": [PY, "-c", "pass"], "cwd": "/"})["id"]
    second = json.loads(proc.stdout.readline())
    assert proc.wait(30) == 0
    assert jid not in {j["id"] for j in first["jobs"]}
    assert jid in {j["id"] for j in second["jobs"]}, "the second frame is a fresh read"


# -------------------------------------------------------------------------------- errors

ERRORS: list[tuple[list[str], str]] = [
    (["logs", "{done}", "--rank", "5"], "--rank 5: {done} has one rank (0)"),
    (["logs", "{done}", "--attempt", "9"], "--attempt 9: {done} has attempt 1"),
    (["queue", "--partition", "nope"], "no partition 'nope' (known: "),
    (["status", "j999999"], "no job j999999"),
    (["queue", "-o", "xml"], "is not one of table, wide, json, yaml"),
    (["queue", "--limit", "-1"], "must be >= 0"),
    (["nodes", "--watch", "--interval", "0"], "must be > 0"),
    (["context", "use", "nope"], "no context 'nope'"),
]


@pytest.mark.parametrize(("args", "message"), ERRORS, ids=[" ".join(a) for a, _ in ERRORS])
def test_bad_input_exits_2(
    cli: Cli, finished: dict[str, str], args: list[str], message: str
) -> None:
    r = cli(*[a.format(**finished) for a in args])
    assert r.exit_code == 2, r.output
    flat = " ".join(r.output.replace("│", " ").split())  # typer's error panel wraps
    assert message.format(**finished) in flat
    assert "Traceback" not in r.output


# ---------------------------------------------------------------------------------- logs


def test_logs_interleave_both_streams_and_split_them(server: Server, cli: Cli) -> None:
    jid = submit(cli, "--", PY, "-c", BOTH_STREAMS)
    followed = cli("logs", "-f", jid)  # from the start: lines in the order they are written
    assert followed.exit_code == 0, followed.output
    assert followed.stdout.split() == ["o1", "e1", "o2", "e2"]
    assert f"{jid}: attempt 1 of 1, rank 0, stdout and stderr" in followed.stderr
    ended = cli("logs", jid)  # no timestamps in the files: stdout, then stderr
    assert ended.stdout.split() == ["o1", "o2", "e1", "e2"]
    assert cli("logs", jid, "--out").stdout.split() == ["o1", "o2"]
    assert cli("logs", jid, "--err").stdout.split() == ["e1", "e2"]


def test_failures_in_one_line(server: Server, cli: Cli) -> None:
    cases = {
        submit(cli, "--", "gpufence-no-such-command"): "command not found: 'gpufence-no-such",
        submit(
            cli, "--", PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
        ): "killed by SIGKILL (signal 9)",
        submit(cli, "--", PY, "-c", "1/0"): "exit code 1: ZeroDivisionError: division by zero",
    }
    for jid, line in cases.items():
        wait_ended(server, jid)
        r = cli("status", jid)
        assert r.exit_code == 0, r.output
        failure = next(x for x in r.stdout.splitlines() if x.startswith("failure"))
        assert line in failure, r.stdout


def test_requeued_job_shows_its_previous_attempt(server: Server, cli: Cli) -> None:
    """An incident preemption requeues a checkpointable gang: while attempt 2 waits, status
    does not show attempt 1's exit code as the job's, and logs show attempt 1, saying so."""
    train = submit(
        cli,
        "--gpus",
        "4",
        "--checkpointable",
        "--",
        *PROGRAMS,
        "train",
        "--steps",
        "600",
        "--step-s",
        "0.05",
    )
    serving = [submit(cli, "--class", "serving", "--", *PROGRAMS, "serve") for _ in range(2)]
    log = server.data / "jobs" / train / "attempt-1" / "rank-0.out"
    until(lambda: log.exists() and '"resume"' in log.read_text(), 30, "the gang's handler")
    surge = submit(cli, "--class", "serving", "--", *PROGRAMS, "serve", "--seconds", "8")
    job = until_value(
        lambda: server.client.job(train),
        lambda j: j["state"] == "pending" and j["attempt"] == 2,
        30,
        "the gang requeued",
    )
    assert job["exit_code"] is not None  # the API keeps attempt 1's code on the row
    r = cli("status", train)
    assert r.exit_code == 0, r.output
    rows = dict(re.findall(r"^([a-z][a-z /]*?)\s{2,}(\S.*?)\s*$", r.stdout, re.M))
    assert rows["exit"] == "-" and rows["attempt"] == "2"
    assert rows["previous"].startswith("attempt 1: ") and rows["previous"].endswith("requeued")
    logs = cli("logs", train)
    assert logs.exit_code == 0, logs.output
    assert "attempt 2 has not started yet (pending); showing attempt 1" in logs.stderr
    assert '"resume"' in logs.stdout
    for jid in [train, *serving, surge]:
        cli("cancel", jid)


# ----------------------------------------------------------------------- up and contexts


def test_up_prints_the_export_line_and_writes_the_context(tmp_path: Path) -> None:
    data = tmp_path / "gf-data"
    xdg = tmp_path / "xdg"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFENCE_")}
    env["XDG_CONFIG_HOME"] = str(xdg)
    cmd = [PY, "-m", "gpufence", "up", "--fake-gpus", "2", "--data", str(data), "--port", "0"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        m = re.fullmatch(r"export GPUFENCE_URL=(http://127\.0\.0\.1:\d+) GPUFENCE_DATA=(\S+)", line)
        assert m, line
        url = m.group(1)
        assert Path(m.group(2)) == data.resolve()
        config = xdg / "gpufence" / "config.yaml"
        until(config.exists, 10, "the client config")
        assert oct(config.stat().st_mode & 0o777) == "0o600"
        doc = yaml.safe_load(config.read_text())
        assert doc["current-context"] == "gf-data"
        assert doc["contexts"]["gf-data"] == {"url": url, "data": str(data.resolve())}
        runner = CliRunner()
        clean = {k: None for k in ("GPUFENCE_URL", "GPUFENCE_TOKEN", "GPUFENCE_DATA")}
        ctx_env = {**clean, "XDG_CONFIG_HOME": str(xdg)}
        r = runner.invoke(app, ["submit", "--", PY, "-c", "print(42)"], env=ctx_env)
        assert r.exit_code == 0, r.output  # found through the context alone
        r = runner.invoke(app, ["context", "list", "-o", "json"], env=ctx_env)
        listed = json.loads(r.stdout)
        assert listed["current"] == "gf-data"
        assert listed["contexts"][0]["token_source"] == f"{data.resolve()}/admin.token"
        # --data alone, with no context at all
        bare = {**clean, "XDG_CONFIG_HOME": str(tmp_path / "empty")}
        r = runner.invoke(app, ["queue", "--all", "-o", "json", "--data", str(data)], env=bare)
        assert r.exit_code == 0 and len(json.loads(r.stdout)["jobs"]) == 1, r.output
        # a context with a URL and no token: the error says every way to give one
        r = runner.invoke(
            app, ["context", "set", "far", "--url", "http://127.0.0.1:9"], env=ctx_env
        )
        assert r.exit_code == 0, r.output
        r = runner.invoke(app, ["queue", "--context", "far"], env=ctx_env)
        assert r.exit_code == 1
        for words in (
            "no API token",
            "--data DIR",
            "export GPUFENCE_DATA=DIR",
            "gpufence context use",
        ):
            assert words in r.output, r.output
    finally:
        proc.terminate()
        proc.wait(30)
