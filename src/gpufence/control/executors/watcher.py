"""The executor's attempt table and its watcher thread.

``AttemptWatcher`` holds the attempts that run (under one lock) and one thread that waits
(``selectors`` over ``pidfd_open`` descriptors, which also work for processes that are not our
children) for member exits, SIGKILL deadlines and notice acks. Exits are event-driven:
``on_exit`` fires within milliseconds of the last member's exit. Callbacks are called from the
watcher thread, never while the lock is held. ``LocalExecutor``
(``local/local_executor.py``) extends it with spawning and the executor API; methods named
``*_locked`` need the lock held.

The gang rules (a member failing stops the rest, grace then SIGKILL) are ``gang.GangState``'s;
this module applies them to local process groups: whatever is left in an exited member's
process group is SIGKILLed at once.

Containment: a member with a cgroup is signalled through it (every process in it, those that
left the process group too), killed through it (``cgroup.kill`` / freeze + SIGKILL), and is over
only when it is empty. When the main process ends, what is left in the cgroup (strays) is killed
and counted (``AttemptExit.strays_killed``); the watcher re-checks a draining member every
``DRAIN_POLL_S`` and the attempt's exit, which frees its GPUs, is reported only once every
member's cgroup is empty. A process that will not die (stuck in the kernel) keeps its GPUs
held, and the log says which.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpufence.control.base.executor import (
    AckCallback,
    AttemptExit,
    ExitCallback,
    Launch,
    report,
)
from gpufence.control.base.record_reads import (
    recorded_end,
    recorded_exit,
    recorded_launcher,
    recorded_pid,
    stop_reached,
)
from gpufence.control.containment.cgroup import ContainmentError, MemberCgroup
from gpufence.control.executors.gang import GangState
from gpufence.control.executors.processes import (
    DISOWNED,
    REAP_ON_CLOSE_S,
    MemberProcess,
    killpg,
    open_live,
    reap_now,
    settle,
    waitid,
)

log = logging.getLogger("gpufence.executor")

Key = tuple[str, int]

ACK_POLL_S = 0.02
"""How often the watcher looks for the ack file of a noticed attempt."""
DRAIN_POLL_S = 0.002
"""How often a member whose strays were killed is checked for an empty cgroup."""
REKILL_S = 0.5
"""A cgroup still not empty this long after a kill is killed again."""
STUCK_WARN_S = 10.0


@dataclass(eq=False, slots=True)
class Attempt(GangState):
    """One running attempt: its launch, member processes, and stop / notice state."""

    members: list[MemberProcess] = field(default_factory=list)
    """In rank order."""
    cpu_base: float = 0.0
    wall_base: float = 0.0

    def live(self) -> list[MemberProcess]:
        return [m for m in self.members if not m.done]

    def draining(self) -> list[MemberProcess]:
        return [m for m in self.members if m.done and not m.over]


def _ignore_exit(ev: AttemptExit) -> None:
    log.warning("attempt %s/%d ended but no on_exit callback is set", ev.job_id, ev.attempt)


def _ignore_ack(job_id: str, attempt: int) -> None:
    log.warning("attempt %s/%d acked but no on_ack callback is set", job_id, attempt)


class AttemptWatcher:
    """The attempts that run and the thread that watches them (see the module docstring)."""

    records_tell_stops = True
    """Whether the launchers' records tell a stop from a notice (``stop_reached``): not where
    the notice signal is itself SIGTERM or SIGINT (``LocalExecutor`` sets it)."""

    def __init__(self, gang_grace_s: float) -> None:
        self.gang_grace_s = gang_grace_s
        self._lock = threading.Lock()
        self._attempts: dict[Key, Attempt] = {}
        self._to_watch: list[tuple[int, Key, int]] = []  # (pidfd, attempt, member index)
        self._dirty: set[Key] = set()
        self._closing = False
        self._kill_on_close = False
        self._on_exit: ExitCallback = _ignore_exit
        self._on_ack: AckCallback = _ignore_ack
        self._efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._efd, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._watch, name="gpufence-executor", daemon=True)
        self._thread.start()

    def _wake_locked(self) -> None:
        if self._efd >= 0:
            os.eventfd_write(self._efd, 1)

    def _watch_locked(self, att: Attempt) -> None:
        """Queue the attempt's pidfds; the watcher registers them (it alone owns the selector)."""
        for i, m in enumerate(att.members):
            if m.pidfd is not None:
                self._to_watch.append((m.pidfd, att.key, i))

    def _gang_abort_locked(self, att: Attempt, failed: MemberProcess) -> None:
        att.gang_failed = True
        log.warning(
            "job %s attempt %d: rank %d ended with %s; stopping the rest of the gang",
            att.launch.job_id,
            att.launch.attempt,
            failed.rank,
            failed.code,
        )
        for m in att.live():
            self._signal_locked(m, signal.SIGTERM)
        att.kill_by(time.monotonic() + self.gang_grace_s)

    # ------------------------------------------------------------------ signalling members
    def _signal_locked(self, m: MemberProcess, sig: signal.Signals) -> None:
        """A catchable signal to the member: its process group, or with containment the
        launcher (which passes on one that came before the job's first process had joined the
        cgroup) and then every process of its cgroup. The launcher first: it records whether a
        stop reached the member before the command exited (``stop_reached``), so it must have
        the signal before the command can act on it."""
        if m.cgroup is None:
            killpg(m.pid, sig)
            return
        if m.pid > 1 and not m.done:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(m.pid, sig)
        m.cgroup.signal(sig)

    def _kill_locked(self, m: MemberProcess) -> None:
        """SIGKILL to the member's job: its cgroup (the launcher lives on to record the exit),
        or without containment its process group."""
        if m.cgroup is None:
            killpg(m.pid, signal.SIGKILL)
            return
        try:
            m.cgroup.kill()
        except ContainmentError as exc:
            log.error("cannot kill cgroup %s: %s", m.cgroup.name, exc)

    def _drain_start_locked(self, att: Attempt, m: MemberProcess, now: float) -> None:
        """The member's main process ended: kill what is left in its cgroup (strays)."""
        cg = m.cgroup
        assert cg is not None
        try:
            n = cg.kill()
        except ContainmentError as exc:
            log.error("cannot kill cgroup %s: %s", cg.name, exc)
            n = len(cg.pids())
        if n:
            m.strays += n
            log.warning(
                "job %s attempt %d rank %d: %d stray process(es) left behind; killed",
                att.launch.job_id,
                att.launch.attempt,
                m.rank,
                n,
            )
        m.drain_since, m.rekill_at = now, now + REKILL_S
        self._drain_check_locked(att, m, now)

    def _drain_check_locked(self, att: Attempt, m: MemberProcess, now: float) -> None:
        cg = m.cgroup
        assert cg is not None
        if cg.empty():
            m.drained = True
            m.oom = m.oom or cg.oom_kills() > 0
            self._dirty.add(att.key)
            return
        if now >= m.rekill_at:
            stuck = now - m.drain_since >= STUCK_WARN_S
            m.rekill_at = now + (STUCK_WARN_S if stuck else REKILL_S)
            if stuck:
                log.error(
                    "job %s attempt %d rank %d: cgroup %s still holds pids %s %.0fs after the "
                    "kill (uninterruptible?); its GPUs stay held",
                    att.launch.job_id,
                    att.launch.attempt,
                    m.rank,
                    cg.name,
                    cg.pids()[:10],
                    now - m.drain_since,
                )
            with contextlib.suppress(ContainmentError):
                cg.kill()

    def _reap_launcher(self, m: MemberProcess) -> int | None:
        """Exit status of an exited launcher that is not our own child (overridden by the
        local executor for the launchers its fork server forked)."""
        return None

    def _watch(self) -> None:
        try:
            while True:
                with self._lock:
                    if self._closing:
                        break
                    for fd, key, index in self._to_watch:
                        self._sel.register(fd, selectors.EVENT_READ, (key, index))
                    self._to_watch.clear()
                    timeout = self._timeout_locked(time.monotonic())
                ready = self._sel.select(timeout)
                with self._lock:
                    if self._closing:
                        break
                    for skey, _ in ready:
                        if skey.data is None:
                            _drain(self._efd)
                            continue
                        key, index = skey.data
                        self._sel.unregister(skey.fd)
                        att = self._attempts[key]
                        self._exited_locked(att, att.members[index])
                    now = time.monotonic()
                    self._kill_due_locked(now)
                    for att in self._attempts.values():
                        for m in att.draining():
                            self._drain_check_locked(att, m, now)
                    acks = [att.key for att in self._attempts.values() if self._acked_locked(att)]
                    exits, emptied = self._finalize_locked()
                    on_exit, on_ack = self._on_exit, self._on_ack
                report(on_exit, on_ack, acks, exits)
                _remove(emptied)  # after the report: not part of the hand-off
        except Exception:
            log.exception("executor watcher failed; no further exits will be reported")
        finally:
            self._shutdown()

    def _timeout_locked(self, now: float) -> float | None:
        timeout: float | None = None
        for att in self._attempts.values():
            if att.kill_at is not None:
                left = max(0.0, att.kill_at - now)
                timeout = left if timeout is None else min(timeout, left)
            if att.ack_wanted and not att.acked:
                timeout = ACK_POLL_S if timeout is None else min(timeout, ACK_POLL_S)
            if att.draining():
                timeout = DRAIN_POLL_S if timeout is None else min(timeout, DRAIN_POLL_S)
        if self._dirty:
            timeout = 0.0
        return timeout

    def _exited_locked(self, att: Attempt, m: MemberProcess) -> None:
        # Leftovers of the member's group die with it. Signalled before the reap, while the
        # zombie leader still pins the group id, so the id cannot name anyone else's group.
        # With a cgroup, the cgroup holds them all (also those that left the group).
        if m.cgroup is None:
            killpg(m.pid, signal.SIGKILL)
        status = None
        if m.pidfd is not None:
            status = waitid(m.pidfd)
            os.close(m.pidfd)
            m.pidfd = None
        recorded = recorded_exit(att.launch.attempt_dir, m.rank)
        if status is None and recorded is None and m.forked:  # its server knows how it died
            status = self._reap_launcher(m)
        ours = att.stop_requested or att.gang_failed  # we killed it: nobody is to record
        if recorded is None and not ours and self._rewatch_launcher_locked(att, m):
            return  # one keeper was killed by someone else: the other records the exit
        code = recorded if recorded is not None else status
        killed = status is not None and status < 0
        if recorded is None and killed and not att.stop_requested and not att.gang_failed:
            # the launcher itself was killed (the OOM killer, an operator's kill -9) before it
            # could record the job's exit: how the job ended is unknown, so the attempt is lost
            # (and requeued), as one lost while the control plane was down -- not failed with
            # the launcher's signal, which says nothing about the job
            log.warning(
                "job %s attempt %d rank %d: its launcher (pid %d) ended (%s) without recording "
                "the job's exit: the attempt is lost",
                att.launch.job_id,
                att.launch.attempt,
                m.rank,
                m.pid,
                status,
            )
            code = None
        settle(m, code)
        if m.cgroup is not None:
            self._drain_start_locked(att, m, time.monotonic())
        self._dirty.add(att.key)
        log.debug(
            "job %s attempt %d rank %d exited: %s",
            att.launch.job_id,
            att.launch.attempt,
            m.rank,
            m.code,
        )
        if att.fails_gang(m.code) and att.live():
            self._gang_abort_locked(att, m)

    def _rewatch_launcher_locked(self, att: Attempt, m: MemberProcess) -> bool:
        """The watched keeper of the member (its supervisor, the recorded pid, or its
        launcher) ended with no exit record: if the other still runs (``supervisor.py``: it
        records the exit in its place), watch that one."""
        adir = att.launch.attempt_dir
        fd = None
        for keeper in (recorded_pid(adir, m.rank), recorded_launcher(adir, m.rank)):
            if keeper is not None and (fd := open_live(*keeper)) is not None:
                break
        if fd is None:
            return False
        log.warning(
            "job %s attempt %d rank %d: one of its keepers is gone without the job's exit; "
            "watching the other, which records it",
            att.launch.job_id,
            att.launch.attempt,
            m.rank,
        )
        m.pidfd, m.forked = fd, 0
        self._to_watch.append((fd, att.key, att.members.index(m)))
        return True

    def _kill_due_locked(self, now: float) -> None:
        for att in self._attempts.values():
            if att.kill_due(now):
                live = att.live()
                if live:
                    log.warning(
                        "job %s attempt %d: grace over, SIGKILL to %d member(s)",
                        att.launch.job_id,
                        att.launch.attempt,
                        len(live),
                    )
                for m in live:
                    self._kill_locked(m)

    def _acked_locked(self, att: Attempt) -> bool:
        if not att.ack_wanted or att.acked:
            return False
        if not _ack_path(att.launch).exists():
            return False
        att.acked = True
        return True

    def _finalize_locked(self) -> tuple[list[AttemptExit], list[MemberCgroup]]:
        """Exits of the attempts whose members are all over, and their (empty) cgroups."""
        exits: list[AttemptExit] = []
        emptied: list[MemberCgroup] = []
        for key in sorted(self._dirty):
            att = self._attempts.get(key)
            if att is None or not all(m.over for m in att.members):
                continue
            del self._attempts[key]
            codes = tuple(m.code for m in att.members)
            # read only where it decides something: every member exited 0 (item_writes)
            reached = (
                stop_reached(att.launch.attempt_dir, len(codes))
                if self.records_tell_stops and codes and all(c == 0 for c in codes)
                else None
            )
            ends = [recorded_end(att.launch.attempt_dir, m.rank) for m in att.members]
            ev = att.exit_event(
                codes,
                oom=any(m.oom for m in att.members),
                strays_killed=sum(m.strays for m in att.members),
                stop_reached=reached,
                ended_at=max(t for t in ends if t is not None)
                if ends and None not in ends
                else None,
            )
            emptied += [m.cgroup for m in att.members if m.cgroup is not None]
            log.info(
                "job %s attempt %d ended: codes %s%s%s%s",
                ev.job_id,
                ev.attempt,
                list(ev.codes),
                " (stopped)" if ev.stopped else "",
                " (out of memory)" if ev.oom else "",
                f" ({ev.strays_killed} stray process(es) killed)" if ev.strays_killed else "",
            )
            exits.append(ev)
        self._dirty.clear()
        return exits, emptied

    def _shutdown(self) -> None:
        with self._lock:
            self._closing = True
            kill = self._kill_on_close
            members = [m for att in self._attempts.values() for m in att.members]
            self._attempts.clear()
            self._to_watch.clear()
            self._dirty.clear()
            self._sel.close()
            os.close(self._efd)
            self._efd = -1
        if kill:
            reap_now(members)
            empty_and_remove([m.cgroup for m in members if m.cgroup is not None])
            return
        for m in members:
            if m.pidfd is not None:
                os.close(m.pidfd)
                m.pidfd = None
            if m.popen is not None and m.popen.returncode is None:
                DISOWNED.append(m.popen)


def empty_and_remove(cgroups: list[MemberCgroup], limit_s: float = REAP_ON_CLOSE_S) -> None:
    """Kill what is in these cgroups, wait (bounded) until they are empty, remove them."""
    end = time.monotonic() + limit_s
    for cg in cgroups:
        with contextlib.suppress(ContainmentError):
            cg.kill()
    left = list(cgroups)
    while left and time.monotonic() < end:
        left = [cg for cg in left if not cg.empty()]
        if left:
            time.sleep(DRAIN_POLL_S)
    for cg in left:
        log.warning("cgroup %s is not empty at close: pids %s", cg.name, cg.pids()[:10])
    _remove([cg for cg in cgroups if cg not in left])


def _remove(cgroups: list[MemberCgroup]) -> None:
    # v1 may refuse the rmdir for a moment after the last process left (EBUSY while the
    # kernel finishes the exit): retried, off the hand-off, for up to ~0.1 s
    for cg in cgroups:
        for wait in (0.001, 0.004, 0.015, 0.08, 0.0):
            if cg.remove():
                break
            if not wait:
                log.warning("cannot remove the empty cgroup %s; it is left behind", cg.name)
            time.sleep(wait)


def _ack_path(launch: Launch) -> Path:
    return launch.attempt_dir / "ack"


def _drain(efd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        os.eventfd_read(efd)
