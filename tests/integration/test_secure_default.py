"""Secure by default, on the shipped multi-tenant example (``local-fenced-8gpu.yaml``, no
``run_as`` anywhere) served by a real root ``gpufence up`` with cgroups.

A tenant's job, probing as a hostile tenant would: it runs as an unprivileged user of its own
(not root), cannot read the admin token or the store, and cannot move itself out of its cgroup
(writing its pid into an ancestor's ``cgroup.procs``) or make cgroups below its own.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import select
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tenant_server import CGROUP_PARENT, JOB_PY, Server, gpufence_up, private_root, remove

import gpufence
from gpufence.cli.terminal_link import TerminalLink
from unix_users import managed_users_removed

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not Path(JOB_PY).exists(), reason=f"needs root and {JOB_PY}"
)

EXAMPLE = Path(gpufence.__file__).parent / "examples" / "local-fenced-8gpu.yaml"

# what the job may do: {probe: "ok" | error name}; argv[1] is the data dir
HOSTILE = r"""
import json, os, sys
data = sys.argv[1]
out = {"uid": os.getuid(), "euid": os.geteuid()}
def attempt(name, fn):
    try:
        fn()
        out[name] = "ok"
    except OSError as e:
        out[name] = type(e).__name__
attempt("admin.token", lambda: open(os.path.join(data, "admin.token")).read())
attempt("store", lambda: open(os.path.join(data, "gpufence.db"), "rb").read(1))
mine = [l.split(":", 2) for l in open("/proc/self/cgroup").read().splitlines()]
pids = next(p for _, c, p in mine if c == "pids")
out["cgroup"] = pids
here = "/sys/fs/cgroup/pids" + pids
def move_to(d):
    with open(os.path.join(d, "cgroup.procs"), "w") as fh:
        fh.write(str(os.getpid()))
attempt("escape-to-root", lambda: move_to("/sys/fs/cgroup/pids"))
attempt("escape-to-parent", lambda: move_to(os.path.dirname(here)))
attempt("mkdir-in-own", lambda: os.mkdir(os.path.join(here, "child")))
attempt("raise-own-limit", lambda: open(os.path.join(here, "pids.max"), "w").write("max"))
out["still-in"] = open("/proc/self/cgroup").read().count(pids) > 0
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    # the shipped file unchanged, plus this test's own cgroup parent (test sessions share the
    # machine's /gpufence)
    config = EXAMPLE.read_text(encoding="utf-8")
    config += f"  containment: {{cgroup_parent: {CGROUP_PARENT}-secure}}\n"
    tokens = {"vision": secrets.token_urlsafe(24), "nlp": secrets.token_urlsafe(24)}
    env = {**os.environ, "VISION_TOKEN": tokens["vision"], "NLP_TOKEN": tokens["nlp"]}
    root = private_root()
    # the server creates gpufence-vision and gpufence-nlp when missing: removed again after
    with managed_users_removed():
        try:
            with gpufence_up(root, config, env, tokens, gpus=8) as srv:
                yield srv
        finally:
            remove(root)


@pytest.mark.parametrize("tenant", ["vision", "nlp"])
def test_a_tenants_job_is_unprivileged_and_stays_in_its_cgroup(server: Server, tenant: str) -> None:
    body = {"command": [JOB_PY, "-c", HOSTILE, str(server.data)], "cwd": "/", "gpus": 1}
    status, out, _ = server.call("POST", "/v1/jobs", tenant, body)
    assert status == 201, out
    job = server.wait(out["id"], ("done", "failed"))
    assert job["state"] == "done", server.log(out["id"], tenant, "err")
    got = json.loads(server.log(out["id"], tenant))
    user = pwd.getpwuid(got["uid"]).pw_name
    assert got["uid"] != 0 and got["euid"] != 0, "a tenant's job ran as root"
    assert user == f"gpufence-{tenant}", "its own managed user"
    assert got["cgroup"].startswith(f"{CGROUP_PARENT}-secure/"), got
    denied = {k: got[k] for k in got if k not in ("uid", "euid", "cgroup", "still-in")}
    assert denied == dict.fromkeys(denied, "PermissionError"), got
    assert got["still-in"]


def test_the_two_tenants_do_not_share_a_user(server: Server) -> None:
    vision, nlp = pwd.getpwnam("gpufence-vision"), pwd.getpwnam("gpufence-nlp")
    assert vision.pw_uid != nlp.pw_uid and 0 not in (vision.pw_uid, nlp.pw_uid)
    assert vision.pw_shell.endswith("nologin") and nlp.pw_shell.endswith("nologin")


def test_an_interactive_shell_runs_as_the_tenants_managed_user(server: Server) -> None:
    """``run --pty`` on the secure default: the server's interpreter is not the tenant's to
    read, yet its shell runs (its terminal host is the server's), as ``gpufence-vision``."""
    body = {"command": ["bash", "--norc"], "cwd": "/", "gpus": 1, "pty": True}
    status, out, _ = server.call("POST", "/v1/jobs", "vision", body)
    assert status == 201, out
    server.wait(out["id"], ("running",))
    link = TerminalLink.open(server.url, server.tokens["vision"], out["id"])
    seen, code = b"", None
    try:
        link.send_input(b'echo "uid=$(id -u)"; exit 5\n')
        end = time.monotonic() + 30
        while code is None and time.monotonic() < end:
            if select.select([link.sock], [], [], 1.0)[0]:
                got = link.read()
                seen += got.data
                code = got.exit_code
                assert code is not None or not got.closed, seen
    finally:
        link.close()
    assert code == 5, seen
    assert f"uid={pwd.getpwnam('gpufence-vision').pw_uid}\r\n".encode() in seen, seen
