"""Jobs that still run but that the store does not know: refused at start-up.

A store restored from an older backup, or a data directory emptied or recreated while its jobs
ran, opens without error, but it does not know the attempts started after it was saved. Their
processes still hold GPUs; a control plane starting on that store would see those GPUs free and
put other jobs on them (issue 11: never double-book). So before recovery adopts anything, every
attempt of this data directory with a live member is compared with the store:

* a job the store does not have at all, or an attempt of a running job other than the one the
  store says runs, is a *stranger*;
* so is an attempt of a job the store has pending: a bind is committed before its spawn, so only
  a newer store knew it (the release of a held job, say, made after the backup);
* a job the store has ended is not looked at (a store only moves forward: an older copy never
  ends a job the newer one still ran).

Also refused (``refuse_misplaced``): attempts that still run on GPUs the cluster no longer has
(``--fake-gpus`` or the cluster file changed across a restart): they could be neither restored
nor stopped cleanly, and their GPUs would be handed out again.

Live members are found from the attempt directories (pid files guarded by start time) and, with
containment, from the member cgroups under the cgroup parent whose name carries the hash of one
of this data directory's attempt paths: a deleted data directory leaves those behind, so its jobs
are still found. Any stranger refuses the start with what to do; nothing is killed, because only
the operator knows whether the store or the processes are the truth.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufence.control.base.jobdirs import JOBS_DIR
from gpufence.control.containment.members import Containment, member_cgroup_name
from gpufence.control.executors.leftovers import (
    ProcessGroups,
    live_member_pids,
    recorded_ranks,
)
from gpufence.control.gpus.devices import assignment_from_json
from gpufence.control.reconciler.launches import job_dir
from gpufence.control.recovery.live_scan import attempt_dirs, job_dirs, listed, member_cgroups
from gpufence.control.store import database as st
from gpufence.control.store.errors import StoreError

if TYPE_CHECKING:
    from gpufence.control.reconciler import Reconciler
    from gpufence.model.cluster import Cluster

log = logging.getLogger("gpufence.recovery")

_MEMBER = re.compile(
    r"^(?P<job>j\d{1,18})\.a(?P<attempt>\d{1,9})\.r(?P<rank>\d{1,6})\.[0-9a-f]{12}$"
)


def _ours_in_cgroups(data_dir: Path, containment: Containment) -> dict[tuple[str, int], int]:
    """(job, attempt) -> a pid, for every populated member cgroup named for an attempt
    directory of this data directory (whether or not the directory is still there)."""
    out: dict[tuple[str, int], int] = {}
    for name in containment.driver.names():
        m = _MEMBER.match(name)
        if m is None:
            continue
        jid, attempt, rank = m["job"], int(m["attempt"]), int(m["rank"])
        adir = job_dir(data_dir, jid) / f"attempt-{attempt}"
        if member_cgroup_name(jid, attempt, adir, rank) != name:
            continue  # another data directory's
        cg = containment.driver.open(name)
        pids = cg.pids() if cg is not None else []
        if pids:
            out.setdefault((jid, attempt), pids[0])
    return out


def live_strangers(
    data_dir: Path, known: dict[str, tuple[str, int]], containment: Containment | None
) -> list[str]:
    """``j12 attempt 1 (pid 345)`` for every live attempt the store does not know.
    ``known``: job id -> (state, attempt) of every job in the store."""

    def stranger(jid: str, attempt: int) -> bool:
        state, current = known.get(jid, ("", 0))
        if state in st.TERMINAL:
            return False
        if state == st.PENDING:  # its bind was committed before any spawn: a newer store's
            return attempt >= current
        return not state or attempt != current

    found: dict[tuple[str, int], int] = {}
    if containment is not None:
        for key, pid in _ours_in_cgroups(data_dir, containment).items():
            if stranger(*key):
                found[key] = pid
    groups = ProcessGroups()  # one look at /proc for every attempt
    for _n, jdir in job_dirs(data_dir):
        for attempt, adir in attempt_dirs(jdir):
            key = (jdir.name, attempt)
            if key in found or not stranger(*key) or not recorded_ranks(adir):
                continue
            pids = live_member_pids(adir, (), groups)  # (their cgroups were looked at above)
            if pids:
                found[key] = pids[0]
    order = sorted(found, key=lambda k: (int(k[0][1:]), k[1]))
    return [f"{jid} attempt {attempt} (pid {found[(jid, attempt)]})" for jid, attempt in order]


def refuse_strangers(store: st.Store, data_dir: Path, containment: Containment | None) -> None:
    """``StoreError`` naming the live attempts the store does not know, with what to do."""
    with store.reader() as r:
        known = {
            str(row["id"]): (str(row["state"]), int(row["attempt"]))
            for row in r.execute("SELECT id, state, attempt FROM jobs")
        }
    live = live_strangers(data_dir, known, containment)
    if not live:
        # directories past the store's last job: it is older than they are (once new jobs are
        # submitted their ids pass them, and this is said no more)
        last = max((int(j[1:]) for j in known if j[1:].isdigit()), default=0)
        unknown = [n for n, _ in job_dirs(data_dir) if n > last]
        if unknown:
            log.warning(
                "%d job director%s in %s belong to no job of the store (restored from an older "
                "backup?); none of them runs, their logs are kept and new ids continue after them",
                len(unknown),
                "y" if len(unknown) == 1 else "ies",
                data_dir / JOBS_DIR,
            )
        return
    raise StoreError(
        f"jobs of this data directory still run that the store {store.path} does not know: "
        f"{listed(live)}. The store is older than its data directory (restored from a backup or "
        "replaced, or the data directory was moved or made again while they ran); starting on "
        "it would put other jobs on their GPUs. Put the newest store back (or start on the "
        "directory they run from), or stop those processes (kill -- -PID, or `kill` every pid "
        "in their cgroup) and start again."
    )


def misplaced(cluster: Cluster, pool: str, assignments: list[dict[str, Any]]) -> str | None:
    """Why a stored attempt's placement does not fit ``cluster`` (None: it does)."""
    if pool not in cluster.partitions:
        return f"partition {pool!r} is not in the cluster spec"
    for raw in assignments:
        a = assignment_from_json(raw)
        for g in a.gpus:
            if not 0 <= g < len(cluster.gpus) or cluster.gpus[g].node != a.node:
                return f"GPU {g} of node {a.node} does not exist"
    return None


def refuse_misplaced(
    rec: Reconciler,
    rows: list[st.JobRow],
    attempts: dict[str, st.AttemptRow | None],
    containment: Containment | None,
) -> None:
    """``StoreError`` naming the running attempts whose GPUs this cluster does not have."""
    found = []
    groups = ProcessGroups()
    for row in rows:
        att = attempts.get(row.id)
        if row.state not in st.ACTIVE or att is None:
            continue
        why = misplaced(rec.scheduler.cluster, att.pool, att.assignments)
        if why is None:
            continue
        adir = job_dir(rec.data_dir, row.id) / f"attempt-{att.attempt}"
        ranks = max(len(att.assignments), 1)
        cgroups = member_cgroups(containment, row.id, att.attempt, adir, ranks)
        pids = live_member_pids(adir, cgroups, groups)
        if pids:
            found.append(f"{row.id} attempt {att.attempt} (pid {pids[0]}: {why})")
    if found:
        raise StoreError(
            f"jobs still run on GPUs this cluster does not have: {listed(found)}. The cluster "
            "changed since they were placed (--fake-gpus, or the cluster file); start with the "
            "one they run on, or stop them (kill -- -PID) and start again."
        )
