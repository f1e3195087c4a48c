"""The executor's pool of pre-started members (``prestart.py``), refilled in the background.

``take`` hands out a ready member (its job child already in a spare cgroup) or None, in which
case the executor forks a launcher as usual and pays for the cgroup move on the hand-off. A
thread keeps ``target`` members ready: it creates a spare cgroup, asks the fork server to arm a
member for it, and counts it ready once the child shows up in the cgroup's last hierarchy.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path

from gpufence.control.containment.cgroup import ContainmentError, MemberCgroup, read_pids
from gpufence.control.containment.forkserver import ForkServer, ForkServerError, Spare
from gpufence.control.containment.members import Containment

log = logging.getLogger("gpufence.containment")

WARM_POLL_S = 0.002
RETRY_S = 1.0
"""After a failure to pre-start a member, the pool waits this long before trying again."""
QUIET_S = 0.15
"""The pool refills only once no member was taken for this long. Moving a process into a cgroup
holds the kernel's ``cgroup_mutex`` through an RCU grace period, which stalls every other cgroup
operation (the renames and removals of a hand-off) meanwhile: refilling during a burst of
starts would slow the burst down; after it, all the moves of a refill share one grace period."""

Ready = tuple[MemberCgroup, Spare]


def _joined(cg: MemberCgroup) -> bool:
    """The spare's child has joined every hierarchy (it joins them in ``join_dirs`` order)."""
    return bool(read_pids(Path(cg.join_dirs[-1]) / "cgroup.procs"))


class SparePool:
    def __init__(self, containment: Containment, forks: ForkServer, target: int) -> None:
        self.containment = containment
        self.forks = forks
        self.target = target
        self._lock = threading.Lock()
        self._ready: list[Ready] = []
        self._warming: list[Ready] = []
        self._gone: list[Spare] = []
        self._finishing: list[MemberCgroup] = []
        self._closing = False
        self._last_take = 0.0
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpufence-spares", daemon=True)
        self._thread.start()

    def take(self) -> Ready | None:
        """A ready pre-started member, or None (none ready: start one the usual way)."""
        with self._lock:
            self._last_take = time.monotonic()
            while self._ready:
                cg, spare = self._ready.pop(0)
                if cg.pids():  # its child still waits in the cgroup
                    self._wake.set()
                    return cg, spare
                self._drop_locked(cg, spare)
        self._wake.set()
        return None

    def finish_later(self, cg: MemberCgroup) -> None:
        """Finish a claim (``CgroupDriver.finish``) once the burst of starts is over."""
        with self._lock:
            self._finishing.append(cg)

    def drop(self, cg: MemberCgroup, spare: Spare) -> None:
        """A taken member that could not be used."""
        with self._lock:
            self._drop_locked(cg, spare)

    def _drop_locked(self, cg: MemberCgroup, spare: Spare) -> None:
        ForkServer.discard(spare)
        self._gone.append(spare)
        with contextlib.suppress(ContainmentError):
            cg.kill()
        for _ in range(40):
            if cg.empty():
                break
            time.sleep(WARM_POLL_S)
        cg.remove()

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._closing:
                    return
                for item in [w for w in self._warming if _joined(w[0])]:
                    self._warming.remove(item)
                    self._ready.append(item)
                need = self.target - len(self._ready) - len(self._warming)
                quiet = QUIET_S - (time.monotonic() - self._last_take)
                warming = bool(self._warming)
            if quiet > 0 and (need > 0 or self._finishing):  # a burst may be going on
                time.sleep(quiet)
                continue
            with self._lock:
                finishing, self._finishing = self._finishing, []
            for cg in finishing:
                self.containment.finish(cg)
            failed = False
            for _ in range(need):  # all at once: their moves share one grace period
                if not self._add():
                    failed = True
                    break
            if failed:
                self._wake.wait(RETRY_S)
                self._wake.clear()
            elif warming or need > 0:
                time.sleep(WARM_POLL_S)
            else:
                self._wake.wait()
                self._wake.clear()

    def _add(self) -> bool:
        try:
            cg = self.containment.spare()
        except ContainmentError as exc:
            log.warning("cannot pre-start a member: %s", exc)
            return False
        try:
            spare = self.forks.arm(cg.join_dirs)
        except ForkServerError as exc:
            log.warning("cannot pre-start a member: %s", exc)
            cg.remove()
            return False
        with self._lock:
            if self._closing:
                self._drop_locked(cg, spare)
            else:
                self._warming.append((cg, spare))
        return True

    def close(self) -> None:
        """Let every unused member go (each kills its child and exits) and remove their cgroups."""
        with self._lock:
            self._closing = True
        self._wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(5.0)
        with self._lock:
            for cg, spare in self._ready + self._warming:
                self._drop_locked(cg, spare)
            self._ready.clear()
            self._warming.clear()
            gone, self._gone = self._gone, []
            finishing, self._finishing = self._finishing, []
        for cg in finishing:  # members that run on: the next control plane finds them by name
            self.containment.finish(cg)
        for spare in gone:
            for _ in range(100):
                if self.forks.reap(spare.pid, spare.generation) is not None:
                    break
                time.sleep(WARM_POLL_S)
