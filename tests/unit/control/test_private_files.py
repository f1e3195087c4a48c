"""Private files and job directories on a real file system: modes at creation, an older data dir
made private, run_as users that could not reach the data dir, links a job plants, the tenant
view of other tenants' jobs."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufence.control.base.config import ADMIN, cluster_from_spec_dict, control_config
from gpufence.control.base.executor import LaunchError, RunAs
from gpufence.control.base.jobdirs import open_job_file, prepare_job_dirs
from gpufence.control.base.privatefs import PrivateDirError, ensure_dir
from gpufence.control.base.tenantview import OTHER_JOB, nodes_for, redact
from gpufence.control.gpus.discovery import fake_gpus, node_spec
from gpufence.control.plane import ControlPlane
from gpufence.control.store.database import Store
from unix_users import User, unix_users


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


@pytest.fixture(scope="module")
def user() -> Iterator[User]:
    with unix_users("p") as (made,):
        yield made


def _run_as(u: User) -> RunAs:
    return RunAs(u.name, u.uid, u.gid, (u.gid,))


def test_the_store_is_0600_from_its_first_byte_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        store = Store(tmp_path / "data")
        with store.transaction() as tx:  # writes: the WAL and its index appear
            tx.execute("INSERT INTO meta(key, value) VALUES('x', 'y')")
        names = {p.name: _mode(p) for p in (tmp_path / "data").iterdir()}
        store.close()
    finally:
        os.umask(old)
    assert names == {"gpufence.db": 0o600, "gpufence.db-wal": 0o600, "gpufence.db-shm": 0o600}
    assert _mode(tmp_path / "data") == 0o700


def test_a_data_dir_of_an_older_gpufence_is_made_private(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "jobs" / "j1" / "attempt-1").mkdir(parents=True, mode=0o755)
    for d in (data, data / "jobs", data / "jobs" / "j1"):
        os.chmod(d, 0o755)
    (data / "gpufence.db").write_bytes(b"")
    os.chmod(data / "gpufence.db", 0o644)
    cfg = control_config(None, data)
    plane = ControlPlane(cluster_from_spec_dict(node_spec(fake_gpus(1))), cfg, fake_gpus(1), data)
    try:
        assert [_mode(data), _mode(data / "jobs"), _mode(data / "jobs" / "j1")] == [0o700] * 3
        assert _mode(data / "gpufence.db") == 0o600
        assert _mode(data / "admin.token") == 0o600
    finally:
        plane.close()


def test_a_shared_directory_is_refused_as_data_dir(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    with pytest.raises(PrivateDirError, match="is a shared directory"):
        ensure_dir(shared, 0o700)
    assert _mode(shared) == 0o1777


def test_a_data_dir_a_run_as_user_cannot_reach_is_refused(tmp_path: Path, user: User) -> None:
    hidden = tmp_path / "hidden"  # pytest's tmp_path: 0700 parents, root's
    hidden.mkdir(mode=0o700)
    ctl = {"auth": {"admin_token": "admin-token-0123456789"}, "run_as": user.name}
    cfg = control_config(ctl, hidden / "data")
    cluster = cluster_from_spec_dict(node_spec(fake_gpus(1)))
    with pytest.raises(ValueError, match=f"run as {user.name!r} .* who cannot pass through"):
        ControlPlane(cluster, cfg, fake_gpus(1), hidden / "data")


def test_job_dirs_belong_to_the_run_as_user(tmp_path: Path, user: User) -> None:
    os.chmod(tmp_path, 0o711)
    job = tmp_path / "data" / "jobs" / "j3"
    prepare_job_dirs(job / "attempt-1", job / "checkpoints", _run_as(user))
    assert (_mode(tmp_path / "data"), _mode(job.parent), _mode(job)) == (0o711, 0o711, 0o711)
    assert job.stat().st_uid == 0, "the job dir is the server's: a job cannot swap its entries"
    for d in (job / "attempt-1", job / "checkpoints"):
        st = d.lstat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o700, user.uid, user.gid)
    prepare_job_dirs(job / "attempt-2", job / "checkpoints", _run_as(user))  # again: fine


def test_a_planted_link_or_a_foreign_dir_is_refused(tmp_path: Path, user: User) -> None:
    job = tmp_path / "data" / "jobs" / "j4"
    job.mkdir(parents=True)
    (job / "attempt-1").symlink_to("/etc")
    with pytest.raises(LaunchError, match="is a symlink"):
        prepare_job_dirs(job / "attempt-1", job / "checkpoints", _run_as(user))
    (job / "checkpoints").mkdir()  # root's: not the job user's
    with pytest.raises(LaunchError, match="owned by uid 0"):
        prepare_job_dirs(job / "attempt-2", job / "checkpoints", _run_as(user))
    assert Path("/etc").stat().st_uid == 0


def test_job_files_are_read_without_following_links(tmp_path: Path) -> None:
    data = tmp_path / "data"
    adir = data / "jobs" / "j5" / "attempt-1"
    adir.mkdir(parents=True)
    secret = data / "secret"
    secret.write_text("token")
    (adir / "rank-0.out").write_text("hello")
    (adir / "rank-0.err").symlink_to(secret)
    os.link(secret, adir / "rank-1.out")
    fh = open_job_file(data, "j5", 1, "rank-0.out")
    assert fh is not None and fh.read() == b"hello"
    fh.close()
    assert open_job_file(data, "j5", 1, "rank-0.err") is None, "symlink"
    assert open_job_file(data, "j5", 1, "rank-1.out") is None, "hard link"
    assert open_job_file(data, "j5", 1, "rank-9.out") is None, "missing"
    (data / "jobs" / "j6").symlink_to(data / "jobs" / "j5")
    assert open_job_file(data, "j6", 1, "rank-0.out") is None, "a linked job dir"
    assert open_job_file(data, "../j5", 1, "rank-0.out") is None


# ------------------------------------------------------------------------------- tenant view

OWNERS = {"j1": "vision", "j2": "nlp", "j12": "nlp"}


def test_messages_name_only_the_viewers_jobs() -> None:
    msg = "GPUs reserved for gang j12 (starts t=5), behind j1; j99 and j1x untouched"
    assert redact(msg, "vision", OWNERS.get) == (
        f"GPUs reserved for gang {OTHER_JOB} (starts t=5), behind j1; j99 and j1x untouched"
    )
    assert redact(msg, ADMIN, OWNERS.get) == msg
    assert redact(msg, "nlp", OWNERS.get).startswith("GPUs reserved for gang j12")


def test_nodes_show_other_tenants_as_counts() -> None:
    def gpu(jobs: list[str], mig: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return {"jobs": jobs, **({"mig": mig} if mig else {})}

    nodes = [
        {
            "gpus": [
                gpu(["j1"]),
                gpu(["j2", "j1"]),
                gpu(["j12"]),
                gpu(["j2"], [{"job": "j2"}, {"job": None}]),
            ]
        }
    ]
    out = nodes_for(nodes, "vision", OWNERS.get)
    gpus = out[0]["gpus"]
    assert [g["jobs"] for g in gpus] == [["j1"], ["j1"], [], []]
    assert [g["other_tenants_jobs"] for g in gpus] == [0, 1, 1, 1]
    assert out[0]["other_tenants_gpus"] == 3
    assert gpus[3]["mig"] == [{"job": None, "other_tenant": True}, {"job": None}]
