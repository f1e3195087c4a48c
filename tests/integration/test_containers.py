"""Jobs in a container image (``submit --container IMAGE``) on a real ``gpufence up`` (its own
process, root) whose tenant runs as a throw-away Unix user, with cgroups.

The image is a directory root file system built here (``rootfs.py``: a shell and a few tools
with their libraries, and a marker file only the image has). The job must see the image's root,
run as its tenant's user in its member cgroup with its GPUs' variables, reach its own attempt
and checkpoint directories at their usual paths and nothing else of the data directory (no
admin token, no store, no other job); a stop must reach the job's command, not end it by killing
the runtime around it; a bad image is a 422 naming the field and the fix.

The same image as a ``.sif`` (``sif_writer``: the published SIF layout around a squashfs that
``mksquashfs`` makes of that root; no Apptainer-built image is available here) runs the same
way, unpacked once, as the job's user, into that user's own part of the image cache.

Needs bubblewrap (``bwrap``), and squashfs-tools for the ``.sif`` tests; skipped with the
reason without them, failed instead under CI=true.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from containment_helpers import executor, mknod, wait_spares
from executor_helpers import Recorder, make_launch
from rootfs import MARKER, build_rootfs
from tenant_server import CGROUP_PARENT, Server, gpufence_up, private_root, remove

from gpufence.control.base.executor import Member
from gpufence.control.containment.cgroup import CgroupDriver
from sif_writer import ENCRYPTED_SQUASHFS, EXT3, Twist, make_sif, squash
from unix_users import User, unix_users


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the container tests: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def user() -> Iterator[User]:
    if shutil.which("bwrap") is None:
        _unavailable("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    if shutil.which("ldd") is None:
        _unavailable("ldd is not installed: the test image is built from this machine's tools")
    with unix_users("ctr") as made:
        _user_namespaces(made[0])
        yield made[0]


def _user_namespaces(user: User) -> None:
    """bwrap run by an unprivileged user needs user namespaces (off on some kernels)."""
    probe = subprocess.run(
        ["bwrap", "--unshare-user", "--ro-bind", "/", "/", "/bin/true"],
        user=user.uid,
        group=user.gid,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        _unavailable(f"bwrap cannot run as an unprivileged user here: {probe.stderr.strip()}")


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    r = private_root()
    try:
        yield r
    finally:
        remove(r)


@pytest.fixture(scope="module")
def image(root: Path) -> tuple[Path, str]:
    marker = f"inside-the-image-{secrets.token_hex(4)}"
    return build_rootfs(root / "image", marker), marker


@pytest.fixture(scope="module")
def server(user: User, root: Path) -> Iterator[Server]:
    token = secrets.token_urlsafe(24)
    tag = secrets.token_hex(3).upper()
    config = f"""
name: containers
node_groups:
  - {{name: box, count: 1, gpus_per_node: 4, gpu_type: H100-80GB, nvlink_domains: [4]}}
partitions:
  shared: {{nodes: [box], admits: [training, batch, interactive, serving], sharing: exclusive,
            preemption: {{grace_s: 2}}}}
control:
  auth:
    tenants:
      vision: {{token_env: GFT_CTR_{tag}}}
  run_as: {user.name}
  tenants:
    vision: {{run_as: {user.name}}}
  stop_grace_s: 5
  containment: {{cgroup_parent: {CGROUP_PARENT}}}
"""
    srv_root = root / "srv"
    srv_root.mkdir()
    os.chmod(srv_root, 0o711)  # not mkdir's mode: a test before may have left a 077 umask
    env = {**os.environ, f"GFT_CTR_{tag}": token}
    with gpufence_up(srv_root, config, env, {"vision": token}) as srv:
        yield srv


PROBE = """
cat {marker}
echo "uid=$(id -u)"
echo "cuda=$CUDA_VISIBLE_DEVICES"
printf cgroup=; while read -r line; do printf '%s;' "$line"; done < /proc/self/cgroup; echo
test -e /usr/bin/python3 && echo "host=visible" || echo "host=hidden"
cat {data}/admin.token >/dev/null 2>&1 && echo "token=read" || echo "token=hidden"
echo data=$(ls -a {data})
echo jobs=$(ls -a {data}/jobs)
echo job=$(ls -a {data}/jobs/$GPUFENCE_JOB_ID)
echo weights > "$GPUFENCE_CHECKPOINT_DIR/ckpt" && echo "ckpt=written"
echo "pwd=$(pwd)"
"""


def _fields(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_the_job_runs_in_its_image_as_its_user_in_its_cgroup_and_sees_only_its_own_files(
    server: Server, image: tuple[Path, str], user: User
) -> None:
    path, marker = image
    other = server.submit("vision", "print('another job')")  # its directory must stay hidden
    server.wait(other, ("done",))
    script = PROBE.format(marker=MARKER, data=server.data)
    status, out, _ = server.call(
        "POST",
        "/v1/jobs",
        "vision",
        {"command": ["/bin/sh", "-c", script], "container": str(path), "gpus": 2},
    )
    assert status == 201, out
    job = server.wait(out["id"], ("done", "failed"))
    log = server.log(out["id"], "vision").decode()
    assert job["state"] == "done", (job, log, server.log(out["id"], "vision", "err"))
    assert log.splitlines()[0] == marker  # the image's root, not the host's
    got = _fields(log)
    assert got["uid"] == str(user.uid)
    assert len(got["cuda"].split(",")) == 2
    assert CGROUP_PARENT.strip("/") in got["cgroup"] and f"{out['id']}.a1.r0." in got["cgroup"]
    assert got["host"] == "hidden"
    assert got["token"] == "hidden"
    assert got["data"].split() == [".", "..", "jobs"]  # no store, no token, no server.json
    assert got["jobs"].split() == [".", "..", out["id"]]  # not the other job
    # not the launcher's records (attempt-1.records) nor anything else of the job's directory
    assert got["job"].split() == [".", "..", "attempt-1", "checkpoints"]
    assert got["ckpt"] == "written"
    assert (server.data / "jobs" / out["id"] / "checkpoints" / "ckpt").read_text() == "weights\n"
    assert got["pwd"] == str(server.data / "jobs" / out["id"] / "attempt-1")


TRAP = """
trap 'echo caught; sleep 1; echo checkpointed; exit 0' TERM
echo ready
while :; do sleep 0.1; done
"""


def test_a_stop_reaches_the_jobs_command_which_finishes_its_handler(
    server: Server, image: tuple[Path, str]
) -> None:
    """The runtime's monitor is in the member's cgroup and dies of the SIGTERM: the launcher
    must wait for the command (which catches it and checkpoints), not record the monitor's
    death and kill the command as a stray."""
    path, _ = image
    status, out, _ = server.call(
        "POST", "/v1/jobs", "vision", {"command": ["/bin/sh", "-c", TRAP], "container": str(path)}
    )
    assert status == 201, out
    job_id = out["id"]
    server.wait(job_id, ("running",))
    deadline = time.monotonic() + 30
    while b"ready" not in server.log(job_id, "vision"):
        assert time.monotonic() < deadline, server.log(job_id, "vision", "err")
        time.sleep(0.05)
    status, body, _ = server.call("POST", f"/v1/jobs/{job_id}/cancel", "vision")
    assert status in (200, 202), body
    server.wait(job_id, ("cancelled",))
    log = server.log(job_id, "vision").decode()
    assert log.split() == ["ready", "caught", "checkpointed"], log


NOTICED = """
trap 'echo noticed; : > "$GPUFENCE_ACK_FILE"' USR1
trap 'echo stopped; exit 0' TERM
echo ready
while :; do sleep 0.1; done
"""


def test_a_notice_reaches_the_jobs_command_and_it_lives_on_to_ack(
    server: Server, image: tuple[Path, str]
) -> None:
    """The notice's SIGUSR1 (a time limit of a checkpointable job) kills bwrap's monitor, whose
    default action for it is to die: the command must live on, ack, and take the stop. (The
    notice comes 2 s in: a signal before the job's handler exists kills it, container or not.)"""
    path, _ = image
    body = {
        "command": ["/bin/sh", "-c", NOTICED],
        "container": str(path),
        "checkpointable": True,
        "time_limit_s": 4,  # noticed at 2 s (the partition's grace_s before it)
    }
    status, out, _ = server.call("POST", "/v1/jobs", "vision", body)
    assert status == 201, out
    job = server.wait(out["id"], ("failed", "done", "cancelled", "pending"), timeout=60)
    log = server.log(out["id"], "vision").decode()
    assert log.split() == ["ready", "noticed", "stopped"], (job, log)


def _problem(server: Server, body: dict[str, Any]) -> dict[str, Any]:
    status, out, _ = server.call("POST", "/v1/jobs", "vision", {"command": ["/bin/sh"], **body})
    assert status == 422, out
    assert isinstance(out, dict)
    return out


@pytest.mark.parametrize("case", ["missing", "file", "no-shell", "sif", "not-readable"])
def test_a_bad_image_is_a_422_naming_the_field_and_the_fix(
    server: Server, root: Path, case: str
) -> None:
    bad = root / f"bad-{case}"
    if case == "file":
        bad.write_text("not an image")
    elif case == "no-shell":
        (bad / "etc").mkdir(parents=True)
        bad.chmod(0o755)
    elif case == "sif":  # a .sif shorter than its header (more bad .sif files below)
        bad = root / "image.sif"
        bad.write_bytes(b"SIF_MAGIC")
    elif case == "not-readable":  # another user's private root: not readable through a job
        (bad / "bin").mkdir(parents=True)
        (bad / "bin" / "sh").write_text("")
        bad.chmod(0o700)
    text = json.dumps(_problem(server, {"container": str(bad)}))
    assert "container" in text and str(bad) in text
    want = {
        "missing": "is not a directory",
        "file": "is not a directory",
        "not-readable": "is not a directory the job's user",
        "no-shell": "no /bin/sh inside",
        "sif": "too short for a SIF image",
    }[case]
    assert want in text, text
    assert "unpacked root file system" in text  # the fix: the supported form


def test_a_working_directory_or_image_in_or_around_the_data_directory_is_refused(
    server: Server, image: tuple[Path, str]
) -> None:
    for cwd in ("/", str(server.data / "jobs")):
        text = json.dumps(_problem(server, {"container": str(image[0]), "cwd": cwd}))
        assert "cwd" in text and "data directory" in text, text
    text = json.dumps(_problem(server, {"container": str(server.data / "jobs")}))
    assert "container" in text and "data directory" in text, text


def test_the_cli_submits_a_container_job_and_waits_for_it(
    server: Server, image: tuple[Path, str]
) -> None:
    path, marker = image
    env = {
        **os.environ,
        "GPUFENCE_URL": server.url,
        "GPUFENCE_TOKEN": server.tokens["vision"],
    }
    env.pop("GPUFENCE_DATA", None)
    work = server.root / "work"  # the user's directory: mounted in, as Apptainer does $PWD
    work.mkdir(mode=0o755, exist_ok=True)
    (work / "job.sh").write_text(f"cat {MARKER}\npwd\n")
    cmd = [sys.executable, "-m", "gpufence", "submit", "--container", str(path), "--wait"]
    run = subprocess.run(
        [*cmd, "job.sh"], env=env, cwd=work, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, (run.stdout, run.stderr)
    job_id = run.stdout.split()[0]
    assert server.log(job_id, "vision").decode().split() == [marker, str(work)]
    bad = subprocess.run(
        [*cmd[:5], str(path / "nowhere"), "--", "/bin/true"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode != 0 and "container" in bad.stderr, (bad.stdout, bad.stderr)


DEVICES = """
test -e {gpu0} && echo other=visible || echo other=absent
( : < {gpu1} ) 2>/dev/null && echo own=opened || echo own=refused
( : < /dev/full ) 2>/dev/null && echo full=opened || echo full=refused
test -e {secret} && echo secret=visible || echo secret=absent
"""


@pytest.mark.parametrize("prestarted", [0, 2])
def test_a_member_sees_only_its_own_gpu_nodes_and_the_device_rules_still_apply(
    tmp_path: Path, driver: CgroupDriver, prestarted: int
) -> None:
    """The executor alone, as root (no user namespace): the other GPU's node is not in the
    container; the member's own opens; the device rules of its cgroup still refuse the other
    GPU's device numbers (``/dev/full``'s here, which bwrap's /dev holds); nothing of the data
    directory but the job's own directories is there."""
    if shutil.which("bwrap") is None:
        _unavailable("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    if driver.device_isolation == "off":
        pytest.skip(f"device isolation is off in this mode: {driver.describe()}")
    image = build_rootfs(tmp_path / "image", "marker")
    # /dev/full's and /dev/random's numbers: a real driver answers, so "opened" means allowed
    gpu0, gpu1 = mknod(tmp_path / "fake0", 1, 7), mknod(tmp_path / "fake1", 1, 8)
    secret = tmp_path / "admin.token"
    secret.write_text("secret")
    script = DEVICES.format(gpu0=gpu0, gpu1=gpu1, secret=secret)
    member = Member(0, "n", ("1",), device_nodes=(str(gpu1),))
    launch = make_launch(tmp_path, command=("/bin/sh", "-c", script), members=(member,))
    launch = dataclasses.replace(launch, container=image)
    rec = Recorder()
    with executor(driver, gpu_nodes=(str(gpu0), str(gpu1)), prestarted=prestarted) as ex:
        ex.set_callbacks(rec.on_exit, rec.on_ack)
        wait_spares(driver, prestarted if driver.renames else 0)
        ex.start(launch)
        ended = rec.exit(timeout=20)[1]
    out = (launch.attempt_dir / "rank-0.out").read_text()
    assert ended.succeeded, (out, (launch.attempt_dir / "rank-0.err").read_text())
    assert _fields(out) == {
        "other": "absent",
        "own": "opened",
        "full": "refused",
        "secret": "absent",
    }


# ----------------------------------------------------------------------------- .sif images


@pytest.fixture(scope="module")
def sif_image(root: Path, image: tuple[Path, str]) -> tuple[Path, str]:
    """The test image as a .sif (world-readable, like the directory image)."""
    if shutil.which("mksquashfs") is None or shutil.which("unsquashfs") is None:
        _unavailable("squashfs-tools is not installed: apt-get install squashfs-tools")
    path, marker = image
    out = make_sif(squash(path, root / "image.sqfs"), root / "image-ok.sif")
    out.chmod(0o644)
    return out, marker


SIF_PROBE = """
cat {marker}
cat /etc/cached 2>/dev/null || echo fresh
echo "uid=$(id -u)"
printf cgroup=; while read -r line; do printf '%s;' "$line"; done < /proc/self/cgroup; echo
test -e /usr/bin/python3 && echo "host=visible" || echo "host=hidden"
"""


def _run_sif_job(server: Server, sif: Path) -> tuple[str, list[str], dict[str, str]]:
    script = SIF_PROBE.format(marker=MARKER)
    body = {"command": ["/bin/sh", "-c", script], "container": str(sif), "gpus": 1}
    status, out, _ = server.call("POST", "/v1/jobs", "vision", body)
    assert status == 201, out
    job = server.wait(out["id"], ("done", "failed"), timeout=120)
    log = server.log(out["id"], "vision").decode()
    err = server.log(out["id"], "vision", "err")
    assert job["state"] == "done", (job["message"], job["attempts"], log, err)
    return out["id"], log.splitlines(), _fields(log)


def test_a_sif_runs_in_its_root_as_its_user_in_its_cgroup_and_a_second_job_reuses_it(
    server: Server, sif_image: tuple[Path, str], user: User
) -> None:
    sif, marker = sif_image
    job_id, lines, got = _run_sif_job(server, sif)
    assert lines[:2] == [marker, "fresh"]  # the .sif's root, unpacked now
    assert got["uid"] == str(user.uid)
    assert CGROUP_PARENT.strip("/") in got["cgroup"] and f"{job_id}.a1.r0." in got["cgroup"]
    assert got["host"] == "hidden"
    # unpacked as the job's user, into its own directory of the cache, named by the content
    mine = server.data / "images" / f"u{user.uid}"
    digest = hashlib.sha256(sif.read_bytes()).hexdigest()
    assert [p.name for p in mine.iterdir()] == [digest]
    st = mine.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (user.uid, 0o700)
    assert (mine / digest / "bin" / "sh").stat().st_uid == user.uid
    # the second job runs in the same tree: what was put there shows, and nothing is unpacked
    (mine / digest / "etc" / "cached").write_text("cached\n")
    _, lines, _ = _run_sif_job(server, sif)
    assert lines[:2] == [marker, "cached"]
    assert [p.name for p in mine.iterdir()] == [digest]


def _bad_sif(root: Path, case: str, good: Path) -> Path:
    bad = root / f"bad-{case}.sif"
    data = good.read_bytes()
    sq = data[data.index(b"hsqs") :]
    if case == "truncated":
        bad.write_bytes(data[: len(data) // 2])
    elif case == "magic":
        make_sif(sq, bad, Twist(magic=b"SIF_MAGIX\0"))
    elif case == "descriptors":
        make_sif(sq, bad, Twist(slots=1 << 40))
    elif case == "offset":
        make_sif(sq, bad, Twist(part_offset=1 << 62))
    elif case == "encrypted":
        make_sif(sq, bad, Twist(fstype=ENCRYPTED_SQUASHFS))
    elif case == "ext3":
        make_sif(sq, bad, Twist(fstype=EXT3))
    elif case == "unreadable":  # root's, 0600: the job's user cannot read it
        bad.write_bytes(data)
    bad.chmod(0o600 if case == "unreadable" else 0o644)
    return bad


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("truncated", "lies outside the file"),
        ("magic", "not a SIF image"),
        ("descriptors", "claims 1099511627776 descriptors"),
        ("offset", "lies outside the file"),
        ("encrypted", "encrypted, which is not supported"),
        ("ext3", "is ext3, not squashfs"),
        ("unreadable", "is not a .sif file the job's user"),
    ],
)
def test_a_bad_sif_is_a_422_naming_the_field_and_what_is_wrong(
    server: Server, root: Path, sif_image: tuple[Path, str], case: str, said: str
) -> None:
    bad = _bad_sif(root, case, sif_image[0])
    text = json.dumps(_problem(server, {"container": str(bad)}))
    assert "container" in text and str(bad) in text, text
    assert said in text, text


def test_a_sif_its_user_can_no_longer_read_does_not_run_even_from_the_cache(
    server: Server, root: Path, sif_image: tuple[Path, str], user: User
) -> None:
    """Run once (unpacked into the user's cache), then held, made root's own (0600), released:
    the image is opened by a process of the job's user, so the kernel refuses it, and the
    cached tree of the same content is not a way around that -- the server does not read the
    file for the tenant."""
    sif = root / "private.sif"
    sif.write_bytes(sif_image[0].read_bytes() + b"\0" * 4096)  # content of its own: a new digest
    sif.chmod(0o644)
    _run_sif_job(server, sif)
    digest = hashlib.sha256(sif.read_bytes()).hexdigest()
    assert (server.data / "images" / f"u{user.uid}" / digest).is_dir()
    body = {"command": ["/bin/sh", "-c", "echo ran"], "container": str(sif), "hold": True}
    body["max_attempts"] = 1
    status, out, _ = server.call("POST", "/v1/jobs", "vision", body)
    assert status == 201, out
    sif.chmod(0o600)
    status, released, _ = server.call("POST", f"/v1/jobs/{out['id']}/release", "vision")
    assert status == 200, released
    job = server.wait(out["id"], ("done", "failed"), timeout=120)
    assert job["state"] == "failed", job
    assert "cannot read it: Permission denied" in job["message"], job["message"]
    assert server.log(out["id"], "vision") == b""


def test_a_sif_with_device_nodes_and_set_user_id_root_files_unpacks_without_them(
    server: Server, root: Path, image: tuple[Path, str], user: User
) -> None:
    """Unpacked as the job's user: the image's device node (here the host disk's numbers) is
    not made, its set-user-id root file becomes the user's own, without the bit -- on the host
    as in the job. (unsquashfs reports those as errors: they must not fail the job.)"""
    pseudo = ("etc/disk b 666 0 0 8 0", "bin/rootsh f 4755 0 0 cat /dev/null")
    sq = squash(image[0], root / "special.sqfs", pseudo)
    sif = make_sif(sq, root / "special.sif")
    sif.chmod(0o644)
    script = "test -b /etc/disk && echo disk=there || echo disk=absent; ls -n /bin/rootsh"
    body = {"command": ["/bin/sh", "-c", script], "container": str(sif)}
    status, out, _ = server.call("POST", "/v1/jobs", "vision", body)
    assert status == 201, out
    job = server.wait(out["id"], ("done", "failed"), timeout=120)
    log = server.log(out["id"], "vision").decode()
    assert job["state"] == "done", (job["message"], log, server.log(out["id"], "vision", "err"))
    lines = log.splitlines()
    assert lines[0] == "disk=absent"
    mode, _, uid = lines[1].split()[:3]
    assert mode == "-rwxr-xr-x" and uid == str(user.uid), lines[1]
    tree = server.data / "images" / f"u{user.uid}" / hashlib.sha256(sif.read_bytes()).hexdigest()
    assert not (tree / "etc" / "disk").exists()
    st = (tree / "bin" / "rootsh").stat()
    assert st.st_uid == user.uid and not st.st_mode & 0o6000
