"""A pre-started member whose executor dies between waking its launcher and handing its first
process the command: nothing of the job ran, and the record must not say it succeeded.

Found by the fault suite (``test_every_named_point_once_more``: "done in the store, no completed
run in logs"): the waiting process took its "never used" exit, code 0, which the woken launcher
read as the command's own exit 0, so a job that never ran was done. Now the member is recorded
as lost (no code), and the attempt is run again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpufence.control.base.member_records import (
    atomic_write,
    err_file,
    exit_file,
    out_file,
    records_dir,
    reserved_exit_record,
)
from gpufence.control.base.record_reads import recorded_exit
from gpufence.control.containment import prestart


def test_a_member_woken_without_its_command_is_recorded_lost(tmp_path: Path) -> None:
    adir = tmp_path / "jobs" / "j1" / "attempt-1"
    adir.mkdir(parents=True)
    records_dir(adir).mkdir()
    atomic_write(exit_file(adir, 0), reserved_exit_record())  # as the executor does at spawn
    for log in (out_file(adir, 0), err_file(adir, 0)):
        log.touch()  # made by the executor too
    (lr, lw), (cr, cw) = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the pre-started launcher, as the fork server runs it
        os.close(lw)
        os.close(cw)
        prestart.run_launcher(lr, cr, [])
    os.close(lr)
    os.close(cr)
    os.close(cw)  # the executor is gone before the command reached the member's first process
    wake = {"argv": [str(adir), "--rank", "0", "--", "true"], "env": {}}
    os.write(lw, prestart.frame({**wake, "err": str(err_file(adir, 0))}))
    os.close(lw)
    _, status = os.waitpid(pid, 0)
    record = json.loads(exit_file(adir, 0).read_text())
    assert record["code"] is None, record  # not 0: the job never ran
    assert "never reached" in record["lost"]
    assert recorded_exit(adir, 0) is None  # read as a lost member: the attempt runs again
    assert os.waitstatus_to_exitcode(status) != 0
    assert "never reached" in err_file(adir, 0).read_text()
