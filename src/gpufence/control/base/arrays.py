"""Job arrays: ``0-99``, ``1,3,5-7``, ``0-99%8`` -> the task indices and the concurrency cap.

Each index becomes one job (its own id) whose environment carries ``GPUFENCE_ARRAY_TASK_ID``
(the index) and ``GPUFENCE_ARRAY_JOB_ID`` (the id of the array's first task, which every task
shares). ``%N`` caps how many tasks are queued or running at once; the scheduling core enforces
it (``sched/gates.py``), the control plane only passes it on.
"""

from __future__ import annotations

import functools
import re

MAX_TASKS = 10_000
MAX_INDEX = 1_000_000
# ASCII digits only: \d would take '٣' (Arabic-Indic three), which int() reads as 3
_RANGE = re.compile(r"([0-9]{1,18})(?:-([0-9]{1,18})(?::([0-9]{1,18}))?)?")
_CAP = re.compile(r"[0-9]{1,18}")


class ArraySpecError(ValueError):
    pass


@functools.lru_cache(maxsize=256)
def parse_array(text: str) -> tuple[tuple[int, ...], int]:
    """(indices in ascending order, cap or 0) of an array spec; ``ArraySpecError`` says what is
    wrong with it (and what a right one looks like). Cached: every task of an array carries
    its spec, and a restart validates each task's (10,000 tasks re-parsing a 10,000-index
    range was quadratic: most of a restart's time, issue 30 case 7)."""
    body, percent, cap_text = text.strip().partition("%")
    example = "e.g. 0-99, 1,3,5-7, 0-99%8 or 0-20:2 (every second index)"
    cap = 0
    if percent:
        if not _CAP.fullmatch(cap_text) or not 1 <= int(cap_text) <= MAX_TASKS:
            raise ArraySpecError(
                f"the cap after % must be a whole number from 1 to {MAX_TASKS} ({example})"
            )
        cap = int(cap_text)
    indices: set[int] = set()
    for part in body.split(","):
        m = _RANGE.fullmatch(part.strip())
        if m is None:
            what = repr(part.strip()) if part.strip() else "an empty item"
            raise ArraySpecError(f"{what} is not an index or range ({example})")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        step = int(m.group(3)) if m.group(3) is not None else 1
        if step < 1:
            raise ArraySpecError(f"the step of {part.strip()!r} must be at least 1 ({example})")
        if hi < lo:
            raise ArraySpecError(f"range {part.strip()!r} is empty ({example})")
        if hi > MAX_INDEX:
            raise ArraySpecError(f"indices go up to {MAX_INDEX} (got {hi})")
        if (hi - lo) // step + 1 + len(indices) > MAX_TASKS:
            raise ArraySpecError(f"an array has at most {MAX_TASKS} tasks")
        indices.update(range(lo, hi + 1, step))  # an index given twice is one task (Slurm's)
    return tuple(sorted(indices)), cap
