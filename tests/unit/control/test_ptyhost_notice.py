"""The pty host's notice watch (``base/ptyhost.NoticeWatch``): the host runs as the control
plane's user and the notice file is in the job's own directory, so it is read only as a regular
file of one link, never through a link the job put there, and its text is never a format."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from gpufence.control.base.ptyhost import NoticeWatch


def _notice(path: Path, reason: str) -> None:
    path.write_text(json.dumps({"reason": reason, "deadline_unix": time.time() + 30}))


def test_a_notice_is_told_once_and_again_when_it_changes(tmp_path: Path) -> None:
    watch = NoticeWatch(str(tmp_path / "notice"))
    assert watch.check() is None  # none yet
    _notice(tmp_path / "notice", "idle")
    line = watch.check()
    assert line is not None and "idle" in line and ("in 30 s" in line or "in 29 s" in line)
    assert watch.check() is None  # the same one
    _notice(tmp_path / "new", "time-limit")  # replaced by a rename, as the executor does
    os.rename(tmp_path / "new", tmp_path / "notice")
    assert "time limit" in (watch.check() or "")


def test_a_link_in_its_place_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "elsewhere.json"
    _notice(secret, "read-through-a-link")
    (tmp_path / "job").mkdir()
    os.symlink(secret, tmp_path / "job" / "notice")
    assert NoticeWatch(str(tmp_path / "job" / "notice")).check() is None
    os.unlink(tmp_path / "job" / "notice")
    os.link(secret, tmp_path / "job" / "notice")  # a second name of a file elsewhere
    assert NoticeWatch(str(tmp_path / "job" / "notice")).check() is None


def test_an_unknown_reason_is_shown_as_text_not_a_format(tmp_path: Path) -> None:
    _notice(tmp_path / "notice", "{when.__class__}{0}")
    line = NoticeWatch(str(tmp_path / "notice")).check()
    assert line is not None and "notice ({when.__class__}{0})" in line
