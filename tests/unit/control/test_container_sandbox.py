"""``containers.sandbox_argv``: the image's entries and the job's directories at the same paths.

Where a job directory lies under a directory of the image, that directory is rebuilt (a tmpfs
directory with the image's other entries bound into it) so that both are there; a job directory
that would have to pass through a file or a link of the image is refused with the fix. The last
test runs the sandbox (needs ``bwrap``; skipped without it, failed under CI=true).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufence.control.base.containers import (
    ContainerError,
    container_problem,
    cwd_problem,
    image_problem,
    missing_runtime,
    sandbox_argv,
)


def _image(root: Path) -> Path:
    img = root / "img"
    (img / "var" / "lib" / "apt").mkdir(parents=True)
    (img / "var" / "cache").mkdir()
    (img / "etc").mkdir()
    (img / "proc").mkdir()  # the sandbox's own: never taken from the image
    (img / "bin").symlink_to("usr/bin")
    return img


def _pairs(argv: list[str], op: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == op]


def test_a_job_directory_under_an_image_directory_keeps_the_images_other_entries(
    tmp_path: Path,
) -> None:
    img = _image(tmp_path)
    job = Path("/var/lib/gpufence/jobs/j1/attempt-1")
    argv = sandbox_argv(img, [job], ("/dev/nvidia3",), job, bwrap="bwrap")
    assert argv[0] == "bwrap"
    dirs = [argv[i + 1] for i, a in enumerate(argv) if a == "--dir"]
    assert dirs == ["/var", "/var/lib"]
    binds = _pairs(argv, "--ro-bind")
    assert (str(img / "var" / "lib" / "apt"), "/var/lib/apt") in binds
    assert (str(img / "var" / "cache"), "/var/cache") in binds
    assert (str(img / "etc"), "/etc") in binds
    assert all(dest not in ("/var", "/var/lib", "/proc") for _, dest in binds)
    assert ("usr/bin", "/bin") in _pairs(argv, "--symlink")
    assert (str(job), str(job)) in _pairs(argv, "--bind")
    nodes = [src for src, _ in _pairs(argv, "--dev-bind-try")]
    assert "/dev/nvidia3" in nodes and not [n for n in nodes if n.startswith("/dev/nvidia0")]
    assert argv[-3:] == ["--chdir", str(job), "--"]
    assert argv.index("--cap-drop") > 0 and argv[argv.index("--cap-drop") + 1] == "ALL"


@pytest.mark.parametrize("kind", ["symlink", "file"])
def test_a_job_directory_through_a_link_or_file_of_the_image_is_refused(
    tmp_path: Path, kind: str
) -> None:
    img = _image(tmp_path)
    if kind == "file":
        (img / "srv").write_text("")
        job = Path("/srv/data/jobs/j1/attempt-1")
    else:
        job = Path("/bin/data/jobs/j1/attempt-1")
    with pytest.raises(ContainerError, match=f"the image's /{job.parts[1]} is a"):
        sandbox_argv(img, [job], (), job)


def test_image_and_cwd_problems_name_the_fix(tmp_path: Path) -> None:
    img = _image(tmp_path)
    assert "no /bin/sh inside" in str(image_problem(str(img), None))
    (img / "usr" / "bin").mkdir(parents=True)
    (img / "usr" / "bin" / "sh").write_text("")
    assert image_problem(str(img), None) is None
    assert ".sif" in str(image_problem(str(tmp_path / "x.sif"), None))
    data = tmp_path / "data"
    assert cwd_problem(str(tmp_path), data) is not None  # holds it
    assert cwd_problem(str(data / "jobs"), data) is not None  # lies in it
    assert cwd_problem(str(img), data) is None


@pytest.fixture
def outside_tmp() -> Iterator[Path]:
    """A job directory under /var/tmp, which the test image has too (not under /tmp, which the
    sandbox replaces whole)."""
    d = Path(tempfile.mkdtemp(prefix="gpufence-ctr-", dir="/var/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_in_the_sandbox_the_image_entry_beside_a_job_directory_is_still_there(
    tmp_path: Path, outside_tmp: Path
) -> None:
    if shutil.which("bwrap") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI must run the container tests: bwrap is not installed", pytrace=False)
        pytest.skip("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    img = tmp_path / "img"
    for d in ("usr", "lib", "lib64", "bin"):
        src = Path("/") / d
        if src.is_symlink():
            (img / d).parent.mkdir(parents=True, exist_ok=True)
            (img / d).symlink_to(os.readlink(src))
    (img / "usr").mkdir(parents=True, exist_ok=True)
    (img / "var" / "tmp").mkdir(parents=True)
    (img / "var" / "tmp" / "from-the-image").write_text("image\n")
    job = outside_tmp / "jobs" / "j1" / "attempt-1"
    job.mkdir(parents=True)
    (outside_tmp / "admin.token").write_text("secret")
    argv = sandbox_argv(img, [job], (), job)
    usr = argv.index("--chdir")  # the host's /usr stands in for the image's (empty) one
    argv[usr:usr] = ["--ro-bind", "/usr", "/usr"]
    probe = "cat /var/tmp/from-the-image; ls -a ..; pwd; test -e ../../../admin.token || echo no"
    run = subprocess.run(
        [*argv, "/bin/sh", "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["image", ".", "..", "attempt-1", str(job), "no"]


def test_without_the_runtime_or_off_the_local_executor_the_submit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    img = _image(tmp_path)
    data = tmp_path / "data"
    ray = container_problem(str(img), None, None, data, local=False)
    assert ray is not None and ray[0] == "container" and "local executor only" in ray[1]
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    missing = container_problem(str(img), None, None, data, local=True)
    assert missing == ("container", missing_runtime())
    assert "apt-get install bubblewrap" in missing[1]
