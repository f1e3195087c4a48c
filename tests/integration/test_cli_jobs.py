"""Job files, directives, arrays, dependencies, hold/release, names, multi-cancel and --wait
through the CLI and a real server on 127.0.0.1 (8 fake GPUs, real processes, a real store).

Training has 4 GPUs (2-5) in the demo's fenced machine; every job here is a 1-GPU training job
unless it says otherwise. The array test reads the tasks' own stdout logs: each task writes
when it started and ended, and the intervals may never overlap more than the cap.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_server import Cli, CliServer, cli_for, cli_server

from gpufence.control.gpus.discovery import fake_gpus
from gpufence.control.http.client import ClientError
from gpufence.demo.live import fenced_spec
from gpufence.testing.waiting import until_value

ADMIN = "jobs-admin-token-0123456789"
PY = sys.executable


Server = CliServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    spec = fenced_spec(fake_gpus(8))
    spec["control"] = {"auth": {"admin_token": ADMIN}, "stop_grace_s": 1}
    yield from cli_server(tmp_path_factory.mktemp("jobs"), spec, ADMIN)


@pytest.fixture
def cli(server: Server) -> Cli:
    return cli_for(server, ADMIN)


def env_of(server: Server) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GPUFENCE_DATA"}
    return {**env, "GPUFENCE_URL": server.url, "GPUFENCE_TOKEN": ADMIN}


def ok(r: Any) -> str:
    assert r.exit_code == 0, r.output
    return str(r.stdout)


def submit(cli: Cli, *args: str) -> str:
    return ok(cli("submit", *args)).strip().splitlines()[0]


def ended(srv: Server, jid: str, timeout: float = 60.0) -> dict[str, Any]:
    return until_value(
        lambda: srv.client.job(jid), lambda j: j["ended_at"] is not None, timeout, f"{jid} ended"
    )


def pending_reason(srv: Server, jid: str) -> dict[str, str]:
    return until_value(
        lambda: srv.client.job(jid).get("pending") or {},
        lambda p: p.get("reason") not in (None, "queued"),
        10,
        f"{jid} has a pending reason",
    )


def count(srv: Server) -> int:
    return len(srv.client.jobs(limit=10_000))


# ------------------------------------------------------------------------------- arrays

TASK = (
    "import os, time\n"
    "print('start', time.time(), os.environ['GPUFENCE_ARRAY_TASK_ID'],"
    " os.environ['GPUFENCE_ARRAY_JOB_ID'], flush=True)\n"
    "time.sleep(0.8)\n"
    "print('end', time.time(), flush=True)\n"
)


def test_array_cap_holds_in_the_tasks_own_logs(cli: Cli, server: Server) -> None:
    r = cli("submit", "--array", "0-5%2", "--name", "capped", "--", PY, "-c", TASK)
    array = ok(r).strip()
    assert "6 task(s)" in r.stderr
    tasks = [j["id"] for j in server.client.named("capped")]
    assert len(tasks) == 6 and array not in tasks  # the array has an id of its own
    reason = pending_reason(server, tasks[-1])
    assert reason["reason"] == "array-limit", reason
    intervals: list[tuple[float, float]] = []
    seen: list[tuple[int, str]] = []
    for jid in tasks:
        assert ended(server, jid)["state"] == "done"
        out = server.client.logs(jid).body.decode().split()
        start, end = float(out[1]), float(out[5])
        intervals.append((start, end))
        seen.append((int(out[2]), out[3]))
    assert seen == [(i, array) for i in range(6)]
    # at no task's start were more than 2 running (its own start included)
    most = max(sum(1 for s, e in intervals if s <= t < e) for t, _ in intervals)
    assert most == 2, intervals  # the cap, reached (4 GPUs would allow 4)


def test_array_spec_errors_name_the_field(cli: Cli) -> None:
    r = cli("submit", "--array", "5-1", "--", "true")
    assert r.exit_code == 2 and "array" in r.output and "empty" in r.output, r.output


# ------------------------------------------------------------------------- dependencies


def test_after_ok_chain_with_a_failing_parent(cli: Cli, server: Server) -> None:
    parent = submit(
        cli, "--name", "chain-a", "--", PY, "-c", "import sys, time; time.sleep(1); sys.exit(4)"
    )
    b = submit(cli, "--name", "chain-b", "--after-ok", "chain-a", "--", "true")
    c = submit(cli, "--after-ok", b, "--", "true")
    reason = pending_reason(server, b)
    assert reason == {"reason": "dependency", "message": f"waiting for {parent} to succeed"}
    assert ended(server, parent)["state"] == "failed"
    jb, jc = ended(server, b), ended(server, c)
    assert (jb["state"], jb["reason"], jb["message"]) == (
        "cancelled",
        "dependency",
        f"dependency can never be met: {parent} failed",
    )
    assert (
        jc["state"] == "cancelled"
        and jc["message"] == f"dependency can never be met: {b} cancelled"
    )
    assert not jb["attempts"] and not jc["attempts"]  # never ran
    st = json.loads(ok(cli("status", "chain-b", "-o", "json")))
    assert st["failure"] == f"cancelled: dependency can never be met: {parent} failed"


def test_after_ok_waits_for_success(cli: Cli, server: Server) -> None:
    p = submit(cli, "--", PY, "-c", "import time; time.sleep(1)")
    q = submit(cli, "--after-ok", p, "--", "true")
    jp, jq = ended(server, p), ended(server, q)
    assert jp["state"] == jq["state"] == "done"
    assert jq["started_at"] >= jp["ended_at"]


DEP_CASES = [
    # (parent exits with, flag, the dependent's end state)
    pytest.param(5, "--after-any", "done", id="after-any failed parent"),
    pytest.param(5, "--after-not-ok", "done", id="after-not-ok failed parent"),
    pytest.param(0, "--after-not-ok", "cancelled", id="after-not-ok done parent"),
    pytest.param(0, "--after-any", "done", id="after-any done parent"),
]


@pytest.mark.parametrize(("code", "flag", "state"), DEP_CASES)
def test_after_any_and_not_ok(cli: Cli, server: Server, code: int, flag: str, state: str) -> None:
    p = submit(cli, "--", PY, "-c", f"import sys, time; time.sleep(0.5); sys.exit({code})")
    d = submit(cli, flag, p, "--", "true")
    assert ended(server, d)["state"] == state
    if state == "done":
        assert ended(server, d)["started_at"] >= ended(server, p)["ended_at"]


def test_unknown_dependency_is_refused_naming_the_field(cli: Cli, server: Server) -> None:
    before = count(server)
    r = cli("submit", "--after-ok", "no-such-job", "--", "true")
    assert r.exit_code == 2 and "after_ok" in r.output and "no-such-job" in r.output, r.output
    r = cli("submit", "--after-any", "j999999", "--", "true")
    assert r.exit_code == 2 and "after_any" in r.output, r.output
    assert count(server) == before


# --------------------------------------------------------------------------------- wait

WAIT_CASES = [
    pytest.param(["--", "true"], 0, id="done"),
    pytest.param(["--", PY, "-c", "import sys; sys.exit(7)"], 7, id="the job's code"),
    pytest.param(["--", "sh", "-c", "kill -TERM $$"], 128 + 15, id="killed by SIGTERM"),
]


@pytest.mark.parametrize(("args", "code"), WAIT_CASES)
def test_wait_exits_with_the_jobs_code(server: Server, args: list[str], code: int) -> None:
    proc = subprocess.run(
        [PY, "-m", "gpufence", "submit", "--wait", *args],
        env=env_of(server),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == code, proc.stderr.decode()


def test_wait_on_a_cancelled_job_exits_3(server: Server) -> None:
    proc = subprocess.Popen(
        [PY, "-m", "gpufence", "submit", "--wait", "--", "sleep", "60"],
        env=env_of(server),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    jid = proc.stdout.readline().decode().strip()
    until_value(lambda: server.client.job(jid)["state"], lambda s: s == "running", 20, "running")
    server.client.cancel(jid)
    assert proc.wait(30) == 3


# ---------------------------------------------------------------------------- job files

GOOD_FILE = """\
apiVersion: gpufence/v1
kind: Job
name: file-prep
command: [echo, hi]
---
apiVersion: gpufence/v1
kind: Job
name: file-train
after_ok: [file-prep]
command: [echo, hi]
gpus: 2
"""

BAD_FILE = """\
apiVersion: gpufence/v1
kind: Job
name: bad-one
command: [echo, hi]
---
apiVersion: gpufence/v1
kind: Job
name: bad-two
command: [echo, hi]
gpus: lots
"""


def test_job_file_with_two_documents(cli: Cli, server: Server, tmp_path: Path) -> None:
    f = tmp_path / "jobs.yaml"
    f.write_text(GOOD_FILE)
    prep, train = ok(cli("submit", "-f", str(f))).split()
    jt = ended(server, train)
    assert jt["state"] == "done" and jt["spec"]["after_ok"] == [prep] and jt["spec"]["gpus"] == 2
    assert jt["started_at"] >= ended(server, prep)["ended_at"]


FILE_ERRORS = [
    pytest.param(
        BAD_FILE,
        "jobs.yaml:10: gpus: must be a number, not the string 'lots'",
        id="bad field line 10",
    ),
    pytest.param(
        BAD_FILE.replace("apiVersion: gpufence/v1\nkind: Job\nname: bad-two", "kind: Job\nname: x"),
        "jobs.yaml:6: apiVersion: required field is missing",
        id="missing apiVersion",
    ),
    pytest.param(
        GOOD_FILE.replace("kind: Job\nname: file-train", "kind: Jobb\nname: file-train"),
        "jobs.yaml:7: kind: 'Jobb' is not supported",
        id="wrong kind",
    ),
    pytest.param(
        GOOD_FILE.replace("gpus: 2", "gpuz: 2"), "jobs.yaml:11: gpuz: unknown field", id="typo"
    ),
]


@pytest.mark.parametrize(("text", "where"), FILE_ERRORS)
def test_job_file_errors_submit_nothing(
    cli: Cli, server: Server, tmp_path: Path, text: str, where: str
) -> None:
    f = tmp_path / "jobs.yaml"
    f.write_text(text)
    before = count(server)
    r = cli("submit", "-f", str(f))
    assert r.exit_code == 2, r.output
    assert where in r.output, r.output
    assert count(server) == before  # all or nothing: the good document was not submitted


def test_job_file_refused_by_the_server_is_undone(cli: Cli, server: Server, tmp_path: Path) -> None:
    f = tmp_path / "jobs.yaml"
    text = GOOD_FILE.replace("[file-prep]", "[nobody-at-all]").replace("file-", "undo-")
    f.write_text(text.replace("name: undo-prep", "name: undo-prep\nhold: true"))  # stays pending
    r = cli("submit", "-f", str(f))
    assert r.exit_code == 2 and "jobs.yaml:7:" in r.output and "after_ok" in r.output, r.output
    first = server.client.named("undo-prep")
    assert [j["state"] for j in first] == ["cancelled"]  # nothing of the file is left to run


# --------------------------------------------------------------------------- directives

SCRIPT = """\
#!/bin/sh
# a comment
#GPUFENCE --name dir-job --gpus 2
#GPUFENCE --env A=from-directive --time-limit 1h
echo "A=$A gpus=$CUDA_VISIBLE_DEVICES"
#GPUFENCE --gpus 3
"""


def test_directives_and_the_command_line_wins(cli: Cli, server: Server, tmp_path: Path) -> None:
    s = tmp_path / "job.sh"
    s.write_text(SCRIPT)
    jid = submit(cli, "--gpus", "1", str(s))
    j = ended(server, jid)
    assert j["state"] == "done" and j["name"] == "dir-job"
    assert j["spec"]["gpus"] == 1  # the command line over the directive
    assert j["spec"]["time_limit_s"] == 3600 and j["spec"]["env"] == {"A": "from-directive"}
    assert j["spec"]["command"] == ["/bin/sh", str(s.resolve())]
    assert server.client.logs(jid).body.decode().startswith("A=from-directive gpus=")


def test_a_bad_directive_names_script_and_line(cli: Cli, server: Server, tmp_path: Path) -> None:
    s = tmp_path / "bad.sh"
    s.write_text("#!/bin/sh\n#GPUFENCE --name fine\n#GPUFENCE --gpus lots\necho hi\n")
    before = count(server)
    r = cli("submit", str(s))
    assert r.exit_code == 2 and f"{s}:3:" in r.output and "--gpus" in r.output, r.output
    assert count(server) == before


def test_a_scripts_directives_count_when_it_gets_arguments(
    cli: Cli, server: Server, tmp_path: Path
) -> None:
    """`gpufence submit run.sh a b` ran with 1 GPU and no name: the #GPUFENCE lines were read
    only for a script without arguments (sbatch reads them either way)."""
    s = tmp_path / "args.sh"
    s.write_text('#!/bin/sh\n#GPUFENCE --gpus 2 --name with-args\necho "args: $*"\n')
    jid = submit(cli, str(s), "one", "two")
    job = ended(server, jid)
    assert job["state"] == "done" and job["spec"]["gpus"] == 2 and job["name"] == "with-args"
    assert job["spec"]["command"][-3:] == [str(s.resolve()), "one", "two"]
    assert "args: one two" in server.client.logs(jid).body.decode()


def test_a_misspelt_script_is_refused_at_submit(cli: Cli, server: Server, tmp_path: Path) -> None:
    before = count(server)
    r = cli("submit", str(tmp_path / "no-such.sh"))
    assert r.exit_code == 2 and "no such script" in r.output, r.output
    assert count(server) == before


# ------------------------------------------------------------------- hold, names, cancel


def test_hold_and_release(cli: Cli, server: Server) -> None:
    jid = submit(cli, "--hold", "--name", "held-one", "--", "true")
    assert pending_reason(server, jid) == {
        "reason": "held",
        "message": "held by admin; release it to let it run",  # who held it (issue 32)
    }
    assert server.client.job(jid)["held"] is True
    time.sleep(1.0)
    assert server.client.job(jid)["state"] == "pending"  # free GPUs, still held
    assert ok(cli("release", "held-one")).strip() == f"{jid}: pending"
    assert ended(server, jid)["state"] == "done"
    r = cli("hold", jid)  # it has ended: a conflict, exit 1
    assert r.exit_code == 1 and "only pending jobs can be held" in r.output, r.output


def test_names_unique_among_jobs_not_ended(cli: Cli, server: Server) -> None:
    jid = submit(cli, "--hold", "--name", "unique-name", "--", "true")
    r = cli("submit", "--name", "unique-name", "--", "true")
    assert r.exit_code == 2 and f"is the name of {jid}" in r.output, r.output
    r = cli("submit", "--name", "j42", "--", "true")
    assert r.exit_code == 2 and "looks like a job id" in r.output, r.output
    assert json.loads(ok(cli("status", "unique-name", "-o", "json")))["id"] == jid
    assert (
        json.loads(ok(cli("explain", "unique-name", "-o", "json")))["pending"]["reason"] == "held"
    )
    r = cli("logs", "unique-name")
    assert r.exit_code == 0 and f"{jid} has not started yet" in r.output, r.output
    ok(cli("cancel", "unique-name"))
    again = submit(cli, "--hold", "--name", "unique-name", "--", "true")  # reusable once ended
    assert again != jid
    ok(cli("cancel", again))
    r = cli("status", "no-such-name")
    assert r.exit_code == 2 and "no job named 'no-such-name'" in r.output, r.output


def test_serving_replicas_share_their_deployment_name(cli: Cli, server: Server) -> None:
    # serving jobs with one name are one deployment (issue 16 measures its p99 over them)
    s = ("--hold", "--class", "serving", "--name", "chat-dep")
    a = submit(cli, *s, "--", "true")
    b = submit(cli, *s, "--", "true")
    r = cli("submit", "--hold", "--name", "chat-dep", "--", "true")  # not a replica: refused
    assert r.exit_code == 2 and f"is the name of {a}" in r.output, r.output
    out = ok(cli("cancel", "chat-dep"))  # the name denotes every replica
    assert out.split("\n")[:2] == [f"{a}: cancelled", f"{b}: cancelled"], out


def test_cancel_several_and_by_filter(cli: Cli, server: Server) -> None:
    a = submit(cli, "--hold", "--name", "multi-a", "--", "true")
    b = submit(cli, "--hold", "--name", "multi-b", "--", "true")
    c = submit(cli, "--hold", "--name", "multi-c", "--", "true")
    out = ok(cli("cancel", a, "multi-b"))
    assert out.split("\n")[:2] == [f"{a}: cancelled", f"{b}: cancelled"]
    assert ok(cli("cancel", "--name", "multi-c", "--state", "pending")).strip() == f"{c}: cancelled"
    d = submit(cli, "--hold", "--name", "multi-d", "--", "true")
    r = cli("cancel", "--partition", "serving", "--name", "multi-d")  # d waits in training
    assert r.exit_code == 1 and "no job matches" in r.output, r.output
    assert (
        ok(cli("cancel", "--partition", "training", "--name", "multi-d")).strip()
        == f"{d}: cancelled"
    )
    r = cli("cancel")
    assert r.exit_code == 2 and "--all" in r.output, r.output
    r = cli("cancel", "--state", "done")
    assert r.exit_code == 2 and "can be cancelled" in r.output, r.output


def test_hold_api_errors_are_problems(server: Server) -> None:
    with pytest.raises(ClientError) as err:
        server.client.hold("nobody-here")
    assert "no job named 'nobody-here'" in str(err.value)


def test_an_array_submit_replayed_answers_every_task(server: Server) -> None:
    body = {"command": ["true"], "array": "0-2", "cwd": "/tmp"}
    first = server.client.submit(body, idempotency_key="jobs-replay-array-1")
    again = server.client.submit(body, idempotency_key="jobs-replay-array-1")
    assert len(first["tasks"]) == 3 and first["id"] not in first["tasks"]  # the array's id
    assert again["id"] == first["id"] and again["tasks"] == first["tasks"]


def test_unknown_dependency_is_a_problem_naming_the_field(server: Server) -> None:
    with pytest.raises(ClientError) as err:
        server.client.submit({"command": ["true"], "after_not_ok": ["ghost"], "cwd": "/tmp"})
    assert err.value.status == 422, str(err.value)
    assert [e["field"] for e in err.value.detail["errors"]] == ["body.after_not_ok"]
    assert "no job named 'ghost' among the jobs of admin" in err.value.detail["detail"]


def test_status_shows_a_jobs_stderr_escapes_as_text(server: Server, cli: Cli) -> None:
    """Issue 30, case 10: a tenant's stderr must not drive the admin's terminal (a window
    title, a cleared screen): ``status`` shows its control characters escaped."""
    hostile = "import sys; sys.stderr.write('boom \\x1b]0;pwned\\x07\\x1b[2J end\\n'); sys.exit(3)"
    jid = submit(cli, "--gpus", "1", "--", PY, "-c", hostile)
    assert ended(server, jid)["state"] == "failed"
    out = ok(cli("status", jid))
    assert "\x1b" not in out and "\x07" not in out, repr(out)
    assert "boom \\x1b]0;pwned\\x07\\x1b[2J end" in out, out
