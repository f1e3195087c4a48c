"""The fault-injection suite's long run: hundreds of crash points, 0 lost, 0 double runs.

Repeats ``gpufence.testing.crashrun.run_once`` (a mixed workload through a real
``gpufence up`` on 127.0.0.1, crashed at every named failpoint in turn and killed with SIGKILL at
random moments, then checked from the jobs' own logs) over seeds until ``--crash-points`` crashes
have happened. Each run uses its own temporary data directory.

Prints one line per run, then last:
    crash_points=N jobs=J lost=0 double_runs=0 overlaps=0 disagreements=0
and exits 1 if fewer than ``--crash-points`` crashes happened or anything was lost, run twice,
overlapped or disagreed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from gpufence.testing.crashrun import Report, run_once


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--crash-points", type=int, default=200, help="stop after this many")
    ap.add_argument("--per-run", type=int, default=15, help="crashes planned per run")
    ap.add_argument("--scale", type=int, default=4, help="workload copies per run")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--keep-failed",
        type=Path,
        metavar="DIR",
        help="copy the data directory of each run that found a problem to DIR/seed-N (its "
        "store, job logs and server logs, to find out why)",
    )
    args = ap.parse_args()
    total = Report()
    seed = args.seed
    t0 = time.monotonic()
    while total.crash_points < args.crash_points:
        with tempfile.TemporaryDirectory(prefix="gpufence-crash-") as tmp:
            r = run_once(Path(tmp) / "run", seed=seed, crashes=args.per_run, scale=args.scale)
            if not r.ok and args.keep_failed is not None:
                shutil.copytree(Path(tmp) / "run", args.keep_failed / f"seed-{seed}", symlinks=True)
        total.add(r)
        elapsed = time.monotonic() - t0
        print(
            f"seed={seed} {r.line()} failpoints={r.failpoint_crashes} random={r.random_kills} "
            f"total_crash_points={total.crash_points} elapsed_s={elapsed:.0f}",
            file=sys.stderr,
            flush=True,
        )
        for problem in r.lost + r.double_runs + r.overlaps + r.disagreements:
            print(f"  {problem}", file=sys.stderr, flush=True)
        seed += 1
    print(
        f"{total.line()} failpoint_crashes={total.failpoint_crashes} "
        f"random_kills={total.random_kills}"
    )
    return 0 if total.ok and total.crash_points >= args.crash_points else 1


if __name__ == "__main__":
    sys.exit(main())
