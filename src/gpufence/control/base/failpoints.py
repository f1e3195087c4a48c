"""Named crash points for fault-injection tests, enabled only by ``$GPUFENCE_FAILPOINTS``.

The control plane calls ``hit("reconciler.after-step")`` at the moments where a crash is
interesting (between a commit and its side effect, between two spawns of a gang, ...). Unless
the environment variable names the point, ``hit`` is one dictionary lookup and does nothing.

``GPUFENCE_FAILPOINTS`` is a comma-separated list of ``NAME=ACTION[@N]``:

* ``crash``: ``kill -9`` of this process (no shutdown code runs: what a power cut or the OOM
  killer leaves behind);
* ``raise``: raise ``FailpointError`` (an internal error of the code around the point);
* ``delay:SECONDS``: sleep, to widen a race window;

``@N`` fires on the N-th time the point is reached in this process only (default: every time).
``POINTS`` lists every name, so a fault-injection run can iterate over all of them; the launcher
(standard library only) reads the same variable for its own ``launcher.*`` points.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass

ENV = "GPUFENCE_FAILPOINTS"

POINTS: dict[str, str] = {
    "reconciler.after-inbox-commit": "inbox items persisted (submits acknowledged soon), "
    "before the scheduler has seen them",
    "reconciler.after-step": "the scheduler decided; nothing of it persisted yet",
    "reconciler.after-decisions-commit": "binds/stops persisted, no process spawned/signalled",
    "reconciler.after-spawn": "an attempt's processes run; the store still says 'starting'",
    "reconciler.after-exit-commit": "an exit persisted; the scheduler frees the GPUs next",
    "executor.between-spawns": "one gang member spawned, the next one not yet",
    "store.before-commit": "inside a write transaction, before COMMIT",
    "store.after-commit": "right after a COMMIT, before the caller learns of it",
    "launcher.after-exit-record": "a member's exit record written; the launcher not yet gone",
}
"""Every failpoint and what state a crash there leaves (``launcher.*`` are in the launcher)."""


class FailpointError(RuntimeError):
    """Raised by a failpoint whose action is ``raise``."""


@dataclass(slots=True)
class _Rule:
    action: str
    arg: float
    nth: int | None
    hits: int = 0


def parse(spec: str) -> dict[str, _Rule]:
    """``NAME=ACTION[@N],...`` -> rules; a malformed entry is an error naming it (a typo must
    not silently disable a fault-injection run)."""
    rules: dict[str, _Rule] = {}
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        name, sep, rest = item.partition("=")
        if not sep:
            rest = "crash"
        action, at, nth = rest.partition("@")
        kind, _colon, arg = action.partition(":")
        if name not in POINTS or kind not in ("crash", "raise", "delay"):
            raise ValueError(
                f"{ENV}: bad entry {item!r} (NAME=crash|raise|delay:S[@N]; names: "
                f"{', '.join(POINTS)})"
            )
        try:
            seconds = float(arg) if kind == "delay" else 0.0
            count = int(nth) if at else None
        except ValueError:
            raise ValueError(f"{ENV}: bad number in {item!r}") from None
        rules[name] = _Rule(kind, seconds, count)
    return rules


_lock = threading.Lock()
_rules: dict[str, _Rule] = parse(os.environ.get(ENV, ""))


def reload() -> None:
    """Re-read ``$GPUFENCE_FAILPOINTS`` (tests that set it in-process)."""
    global _rules
    with _lock:
        _rules = parse(os.environ.get(ENV, ""))


def hit(name: str) -> None:
    """The failpoint ``name`` is reached: act if ``$GPUFENCE_FAILPOINTS`` says so."""
    if not _rules:
        return
    with _lock:
        rule = _rules.get(name)
        if rule is None:
            return
        rule.hits += 1
        if rule.nth is not None and rule.hits != rule.nth:
            return
    if rule.action == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # SIGKILL is asynchronous; never run past the point
    elif rule.action == "raise":
        raise FailpointError(f"failpoint {name}")
    else:
        time.sleep(rule.arg)
