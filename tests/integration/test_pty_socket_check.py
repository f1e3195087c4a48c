"""The relay's check of a pty job's socket (``http/pty_routes._connect_checked``): it relays only a
terminal host of the control plane's own user, reached through a directory no one else may
write. A socket a job made (as its tenant's user), or one in a directory a job could change, is
refused before a byte is relayed.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufence.control.http.pty_routes import Refused, _connect_checked
from unix_users import unix_users


@pytest.fixture
def private_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="gpufence-ptysock-"))  # 0700, ours
    try:
        yield d
    finally:
        for p in d.iterdir():
            p.unlink()
        d.rmdir()


def _listen(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen(1)
    return s


def test_a_host_of_our_own_in_our_own_directory_is_relayed(private_dir: Path) -> None:
    with _listen(private_dir / "pty.sock"):
        _connect_checked(str(private_dir / "pty.sock"), os.geteuid()).close()


def test_a_directory_others_may_write_is_refused(private_dir: Path) -> None:
    with _listen(private_dir / "pty.sock"):
        private_dir.chmod(0o777)
        with pytest.raises(Refused, match="others may write"):
            _connect_checked(str(private_dir / "pty.sock"), os.geteuid())


def test_a_socket_another_user_listens_on_is_refused(private_dir: Path) -> None:
    """A tenant's process listening (its socket moved where the host's would be)."""
    with unix_users("s") as (user,):
        theirs = Path(tempfile.mkdtemp(prefix="gpufence-ptysock-user-"))
        os.chown(theirs, user.uid, user.gid)
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the user's listener: ends in _exit
            try:
                os.close(ready_r)
                os.setgroups([])
                os.setgid(user.gid)
                os.setuid(user.uid)
                s = _listen(theirs / "s")
                os.write(ready_w, b"1")
                s.accept()
            finally:
                os._exit(0)
        os.close(ready_w)
        try:
            assert os.read(ready_r, 1) == b"1"
            os.rename(theirs / "s", private_dir / "pty.sock")  # the inode it listens on
            with pytest.raises(Refused, match="not its host's"):
                _connect_checked(str(private_dir / "pty.sock"), os.geteuid())
        finally:
            os.close(ready_r)
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            theirs.rmdir()
