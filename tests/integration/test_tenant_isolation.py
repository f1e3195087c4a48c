"""Tenant isolation on a real ``gpufence up`` (its own process, root) with two tenants whose jobs
run as Unix users the fixture creates (``useradd``) and removes.

* a job's environment holds no token, no GPUFENCE_* secret, nothing but the allow-list;
* the mode and owner of every file and directory the server creates;
* user A cannot read B's logs, checkpoints, the store or any token (the files' modes), and
  A's *job* cannot either (the launcher drops to A's uid before exec);
* a tenant's /v1/nodes, /v1/partitions, explain and messages name no other tenant's job;
* log reads never follow a link a job planted in its own directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tenant_server import CGROUP_PARENT, JOB_PY, Server, gpufence_up, private_root, remove

from gpufence.control.base.tenantview import OTHER_JOB
from unix_users import User, unix_users

pytestmark = pytest.mark.skipif(not Path(JOB_PY).exists(), reason=f"needs {JOB_PY}")

SLEEP = "import time; time.sleep(60)"
# writes a checkpoint and a line of output: something of each kind for the modes test
CHECKPOINT = (
    "import os; p = os.path.join(os.environ['GPUFENCE_CHECKPOINT_DIR'], 'ckpt');"
    "open(p, 'w').write('secret weights of ' + os.environ['GPUFENCE_JOB_ID']);"
    "print('wrote', p)"
)
# prints what this process may read: {path: "ok" | error name}
PROBE = """
import json, os, sys
out = {"uid": os.getuid()}
for p in sys.argv[1:]:
    try:
        if os.path.isdir(p):
            os.listdir(p)
        else:
            open(p, 'rb').read(1)
        out[p] = "ok"
    except OSError as e:
        out[p] = type(e).__name__
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def users() -> Iterator[list[User]]:
    with unix_users("a", "b", "c") as made:
        yield made


@pytest.fixture(scope="module")
def server(users: list[User]) -> Iterator[Server]:
    a, b, c = users
    tag = secrets.token_hex(3).upper()
    vision, nlp = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    nlp_hash = "sha256:" + hashlib.sha256(nlp.encode()).hexdigest()
    config = f"""
name: tenants
node_groups:
  - {{name: box, count: 1, gpus_per_node: 4, gpu_type: H100-80GB, nvlink_domains: [4]}}
partitions:
  shared: {{nodes: [box], admits: [training, batch, interactive, serving], sharing: exclusive,
            backfill: true}}
control:
  auth:
    tenants:                # the admin token is generated into DATA/admin.token
      vision: {{token_env: GFT_VISION_{tag}}}
      nlp: {{token: "{nlp_hash}"}}
  run_as: {c.name}
  tenants:
    vision: {{run_as: {a.name}}}
    nlp: {{run_as: {b.name}}}
  job_env_inherit: ["GFT_EXTRA_*"]
  stop_grace_s: 2
  containment: {{cgroup_parent: {CGROUP_PARENT}}}
"""
    env = {
        **os.environ,
        f"GFT_VISION_{tag}": vision,
        "GFT_EXTRA_ONE": "extra-1",
        "GPUFENCE_SECRET_SAUCE": "sauce-secret",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "GPUFENCE_TOKEN": vision,
    }
    root = private_root()
    try:
        tokens = {"vision": vision, "nlp": nlp}
        with gpufence_up(root, config, env, tokens) as srv:
            yield srv
    finally:
        remove(root)


@pytest.fixture(scope="module")
def finished(server: Server) -> dict[str, str]:
    """One finished checkpointing job per tenant (and one of the admin's): tenant -> job id."""
    jobs = {t: server.submit(t, CHECKPOINT) for t in ("vision", "nlp", "admin")}
    for j in jobs.values():
        server.wait(j, ("done",))
    return jobs


def _as_user(user: User, fn: Callable[[], str]) -> str:
    """``fn()`` in a forked child running as ``user`` (no supplementary groups)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.setgroups([])
            os.setgid(user.gid)
            os.setuid(user.uid)
            out = fn()
        except Exception as exc:
            out = f"{type(exc).__name__}: {exc}"
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        text = fh.read().decode()
    os.waitpid(pid, 0)
    return text


def _secret_paths(srv: Server, jobs: dict[str, str], other: str) -> list[str]:
    d = srv.data
    jdir = d / "jobs" / jobs[other]
    return [
        str(jdir / "attempt-1" / "rank-0.out"),
        str(jdir / "attempt-1"),
        str(jdir / "checkpoints" / "ckpt"),
        str(jdir / "checkpoints"),
        str(d / "gpufence.db"),
        str(d / "gpufence.db-wal"),
        str(d / "server.json"),
        str(d / "admin.token"),
        str(d / "jobs"),
        str(d),
    ]


# ------------------------------------------------------------------------------- environment


def test_a_jobs_environment_holds_no_token(server: Server, users: list[User]) -> None:
    a = users[0]
    job = server.submit("vision", "import json, os; print(json.dumps(dict(os.environ)))")
    server.wait(job, ("done",))
    env: dict[str, str] = json.loads(server.log(job, "vision"))
    tokens = set(server.tokens.values())
    assert not tokens & set(env.values()), "a token reached the job"
    assert not any(t in v for t in tokens for v in env.values())
    assert "sauce-secret" not in env.values() and "aws-secret" not in env.values()
    assert (env["HOME"], env["USER"], env["LOGNAME"]) == (f"/home/{a.name}", a.name, a.name)
    assert env["GFT_EXTRA_ONE"] == "extra-1", "control.job_env_inherit adds to the allow-list"
    allowed = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TERM", "CUDA_DEVICE_ORDER"}
    allowed |= {"CUDA_VISIBLE_DEVICES", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE"}
    allowed |= {"MASTER_ADDR", "MASTER_PORT", "GFT_EXTRA_ONE"}
    slurm = {k for k in env if k.startswith("SLURM_")}  # the GPUFENCE_* twins (slurmenv.py)
    assert slurm == {
        "SLURM_JOB_ID",
        "SLURM_JOBID",
        "SLURM_JOB_NAME",
        "SLURM_NTASKS",
        "SLURM_NPROCS",
        "SLURM_JOB_PARTITION",
        "SLURM_SUBMIT_DIR",
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "SLURM_NNODES",
        "SLURM_JOB_NUM_NODES",
        "SLURM_JOB_GPUS",
    }, slurm
    extra = {k for k in env if k not in allowed | slurm and not k.startswith("LC_")}
    assert extra == {
        "GPUFENCE_JOB_ID",
        "GPUFENCE_ATTEMPT",
        "GPUFENCE_CHECKPOINT_DIR",
        "GPUFENCE_NOTICE_FILE",
        "GPUFENCE_ACK_FILE",
        "GPUFENCE_WORLD_SIZE",
        "GPUFENCE_RANK",
        "GPUFENCE_NODE",
    }


# ------------------------------------------------------------------------------------- modes


def _tree(data: Path) -> dict[str, tuple[str, int, int]]:
    """relative path -> (kind, mode, uid) of everything under ``data``."""
    out = {".": ("d", stat.S_IMODE(data.stat().st_mode), data.stat().st_uid)}
    for dirpath, dirnames, filenames in os.walk(data):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            kind = "l" if stat.S_ISLNK(st.st_mode) else "d" if stat.S_ISDIR(st.st_mode) else "f"
            out[str(p.relative_to(data))] = (kind, stat.S_IMODE(st.st_mode), st.st_uid)
    return out


def check_modes(data: Path, owners: dict[str, int], traverse: bool) -> None:
    """Every directory and file under ``data`` as it must be; ``owners``: job id -> uid of the
    user its job runs as."""
    tree = _tree(data)
    server_dir = 0o711 if traverse else 0o700
    seen_user_dirs = set()
    for rel, (kind, mode, uid) in tree.items():
        parts = Path(rel).parts
        assert kind != "l", f"{rel}: a link in the data dir"
        if kind == "f":
            assert mode == 0o600, f"{rel}: file mode {mode:04o}"
            continue
        if len(parts) <= 2 or rel == ".":  # DATA, DATA/jobs, DATA/jobs/<job>
            assert (mode, uid) == (server_dir, 0), f"{rel}: {mode:04o} uid {uid}"
        elif parts[-1].endswith(".records"):  # the launcher's records: the server's alone
            assert (mode, uid) == (0o700, 0), f"{rel}: {mode:04o} uid {uid}"
        else:  # DATA/jobs/<job>/{attempt-N,checkpoints}
            assert (mode, uid) == (0o700, owners[parts[1]]), f"{rel}: {mode:04o} uid {uid}"
            seen_user_dirs.add(rel)
    for job in owners:
        assert {f"jobs/{job}/attempt-1", f"jobs/{job}/checkpoints"} <= seen_user_dirs
        assert tree[f"jobs/{job}/attempt-1.records/rank-0.exit"] == ("f", 0o600, 0)
    assert tree["gpufence.db"][0] == "f" and "server.json" in tree and "jobs" in tree


def test_modes_of_everything_the_server_creates(
    server: Server, finished: dict[str, str], users: list[User]
) -> None:
    a, b, c = users
    owners = {finished["vision"]: a.uid, finished["nlp"]: b.uid, finished["admin"]: c.uid}
    assert "gpufence.db-wal" in _tree(server.data), "the store's WAL exists while it runs"
    check_modes(server.data, owners | _other_jobs(server, owners), traverse=True)


def _other_jobs(server: Server, known: dict[str, int]) -> dict[str, int]:
    """Uids of the module's other jobs (those of earlier tests), from their directories."""
    out = {}
    for d in (server.data / "jobs").iterdir():
        if d.name not in known:
            out[d.name] = (d / "checkpoints").stat().st_uid
    return out


def test_modes_without_run_as(tmp_path: Path) -> None:
    """No run_as: everything stays 0700/0600 and the server's own; the admin token file is
    generated 0600."""
    config = f"""
name: plain
node_groups: [{{name: box, count: 1, gpus_per_node: 1, gpu_type: H100-80GB}}]
partitions: {{shared: {{nodes: [box], admits: [training], sharing: exclusive}}}}
control: {{containment: {{cgroup_parent: {CGROUP_PARENT}}}}}
"""
    root = private_root()
    try:
        with gpufence_up(root, config, dict(os.environ), {}, gpus=1) as srv:
            job = srv.submit("admin", CHECKPOINT)
            srv.wait(job, ("done",))
            check_modes(srv.data, {job: 0}, traverse=False)
            assert _tree(srv.data)["admin.token"] == ("f", 0o600, 0)
    finally:
        remove(root)


# ------------------------------------------------------------------------------ file access


def test_one_tenants_user_cannot_read_anothers_files(
    server: Server, finished: dict[str, str], users: list[User]
) -> None:
    """The modes and owners at work: as user A (vision), nothing of B's, of the store or of the
    tokens opens; A's own checkpoint directory does (DATA lets A through)."""
    a = users[0]
    paths = _secret_paths(server, finished, "nlp")

    def probe() -> str:
        out = {}
        for p in paths:
            try:
                if os.path.isdir(p):
                    os.listdir(p)
                else:
                    open(p, "rb").close()
                out[p] = "ok"
            except OSError as e:
                out[p] = type(e).__name__
        own = server.data / "jobs" / finished["vision"] / "checkpoints"
        out["own"] = ",".join(sorted(os.listdir(own)))
        (own / "by-a").write_text("mine")
        return json.dumps(out)

    got = json.loads(_as_user(a, probe))
    assert got.pop("own") == "ckpt", "A reaches its own checkpoints through DATA (0711)"
    assert got == dict.fromkeys(paths, "PermissionError")
    (server.data / "jobs" / finished["vision"] / "checkpoints" / "by-a").unlink()


def test_a_tenants_job_cannot_read_another_tenants_files(
    server: Server, finished: dict[str, str], users: list[User]
) -> None:
    a = users[0]
    paths = _secret_paths(server, finished, "nlp")
    body = {"command": [JOB_PY, "-c", PROBE, *paths], "cwd": "/"}
    status, out, _ = server.call("POST", "/v1/jobs", "vision", body)
    assert status == 201, out
    job = out["id"]
    server.wait(job, ("done",))
    got = json.loads(server.log(job, "vision"))
    assert got.pop("uid") == a.uid, "the job runs as its tenant's user"
    assert got == dict.fromkeys(paths, "PermissionError")


# ------------------------------------------------------------------------------------- views


def test_tenants_see_no_other_tenants_job_ids(server: Server) -> None:
    mine = server.submit("vision", SLEEP)
    theirs = server.submit("nlp", SLEEP)
    for j in (mine, theirs):
        server.wait(j, ("running",))
    # a gang of nlp's that cannot start yet holds the reservation; vision's next job waits behind
    # it, and the scheduler's message about why names the gang
    gang = server.submit("nlp", SLEEP, gpus=4)
    waiting = server.submit("vision", SLEEP)
    try:
        status, nodes, _ = server.call("GET", "/v1/nodes", "vision")
        assert status == 200
        assert _mentions(nodes, mine) and not _mentions(nodes, theirs, gang)
        (gpus,) = [n["gpus"] for n in nodes["nodes"]]
        assert sorted(g["other_tenants_jobs"] for g in gpus) == [0, 0, 0, 1]
        assert nodes["other_tenants"] == {"gpus": 1, "summary": "1 GPU held by other tenants"}
        status, admin_nodes, _ = server.call("GET", "/v1/nodes")
        assert _mentions(admin_nodes, theirs) and "other_tenants" not in admin_nodes

        status, parts, _ = server.call("GET", "/v1/partitions", "vision")
        assert status == 200 and not _mentions(parts, theirs, gang)

        status, why, _ = server.call("GET", f"/v1/jobs/{waiting}/explain", "vision")
        assert status == 200
        assert why["pending"]["reason"] == "reserved-for-gang", why
        assert not _mentions(why, gang) and OTHER_JOB in why["pending"]["message"]
        status, admin_why, _ = server.call("GET", f"/v1/jobs/{waiting}/explain")
        assert _mentions(admin_why["pending"]["message"], gang), "the admin sees the id"

        status, listed, _ = server.call("GET", "/v1/jobs", "vision")
        assert not _mentions(listed, theirs, gang)
        status, one, _ = server.call("GET", f"/v1/jobs/{waiting}", "vision")
        assert not _mentions(one, theirs, gang)
    finally:
        for j in (mine, theirs, gang, waiting):
            server.call("POST", f"/v1/jobs/{j}/cancel")
        for j in (mine, theirs, gang, waiting):
            server.wait(j, ("cancelled",))


def _strings(x: Any) -> list[str]:
    """Every string in a JSON value (keys too)."""
    if isinstance(x, str):
        return [x]
    if isinstance(x, dict):
        return [s for k, v in x.items() for s in (k, *_strings(v))]
    if isinstance(x, list):
        return [s for v in x for s in _strings(v)]
    return []


def _mentions(x: Any, *job_ids: str) -> bool:
    """Does any string in ``x`` name one of ``job_ids`` (as a word: j1 is not j12)?"""
    return any(re.search(rf"\b{j}\b", s) for s in _strings(x) for j in job_ids)


# ------------------------------------------------------------------------------------- links


def test_log_reads_never_follow_a_link_the_job_planted(server: Server) -> None:
    """A job owns its attempt directory, so it can replace its log files; the API (root) must
    not serve what a link points to: another tenant's log, the token file."""
    token = server.data / "admin.token"
    code = (
        "import os, sys; d = os.path.dirname(os.environ['GPUFENCE_NOTICE_FILE'])\n"
        "print('before')\n"
        f"os.unlink(d + '/rank-0.out'); os.symlink({str(token)!r}, d + '/rank-0.out')\n"
        "os.unlink(d + '/rank-0.err')\n"
        f"try:\n    os.link({str(server.data / 'server.json')!r}, d + '/rank-0.err')\n"
        "except OSError:\n    open(d + '/rank-0.err', 'w').close()\n"
    )
    job = server.submit("vision", code)
    server.wait(job, ("done",))
    out, err = server.log(job, "vision"), server.log(job, "vision", "err")
    assert server.tokens["admin"].encode() not in out
    assert out == b"", "a symlink is not followed"
    assert b"url" not in err and err == b"", "a hard link to the server's file is not served"


def test_a_cwd_cannot_probe_which_private_directories_exist(server: Server) -> None:
    """The cwd check runs as the job's user: a private directory it cannot enter (the server's
    private root, which exists) and a path that does not exist get the same answer, so the
    server's root cannot be used to learn which exist; one the user can enter is taken."""
    private = Path(tempfile.mkdtemp(prefix="gf-private-"))  # root's, 0700
    (private / "inside").mkdir()
    answers = []
    for cwd in (str(private / "inside"), str(private / "no-such")):
        status, out, _ = server.call(
            "POST", "/v1/jobs", "vision", {"command": ["true"], "cwd": cwd}
        )
        assert status == 422 and out["field"] == "body.cwd", out
        answers.append(out["detail"].replace(cwd, "CWD"))
    assert answers[0] == answers[1], answers
    assert "can enter" in answers[0]
    status, out, _ = server.call(
        "POST", "/v1/jobs", "vision", {"command": ["true"], "cwd": "/tmp", "hold": True}
    )
    assert status == 201, out
    server.call("POST", f"/v1/jobs/{out['id']}/cancel", "vision")
    shutil.rmtree(private)
