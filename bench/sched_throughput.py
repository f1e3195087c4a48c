"""Scheduling throughput on the 1,000-node x 8-GPU example cluster.

Drives ``gpufence.sched.scheduler.Scheduler`` with a seeded stream of mixed jobs (training gangs
of 1-64 whole GPUs, serving, MIG interactive sessions, fractional batch shares) through a small
discrete-event loop, keeping about ``--pending`` jobs pending, and times each ``step()`` call
(only the step, not the driver).

The last line printed (stdout) is always ``decisions_per_s=N p99_cycle_ms=M``:
N = Bind decisions / seconds spent inside ``step()``, M = p99 of the per-step wall time (ms).
Exit status 1 when N is below the target (2,000 placements per second).

    PYTHONPATH=src python bench/sched_throughput.py --quick
    PYTHONPATH=src python bench/sched_throughput.py --jobs 100000 --pending 10000 --seed 1
    PYTHONPATH=src python bench/sched_throughput.py --profile   # cProfile of step(), to stderr

Progress and the profile go to stderr; see bench/README.md.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import heapq
import io
import math
import pstats
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Bind, Decision, MigReconfigure, Notice, Reject, Requeue, Stop
from gpufence.model.events import (
    CheckpointAck,
    Event,
    JobFinished,
    JobStopped,
    JobSubmitted,
    MigReconfigured,
    Tick,
)
from gpufence.model.job import GpuRequest, Job, WorkloadClass
from gpufence.sched.scheduler import Scheduler
from gpufence.spec import load_cluster

TARGET_DECISIONS_PER_S = 2000
ROOT = Path(__file__).resolve().parent.parent
CLUSTER_FILE = "cluster-1000.yaml"


def default_cluster() -> Path:
    """examples/cluster-1000.yaml of the checkout, else the copy shipped in the package."""
    local = ROOT / "examples" / CLUSTER_FILE
    if local.is_file():
        return local
    import gpufence

    return Path(gpufence.__file__).resolve().parent / "examples" / CLUSTER_FILE


# Share of the pending target kept per partition, so that every fence stays saturated (a single
# global mix would let the slowest-draining fence absorb the whole backlog and idle the others).
PENDING_SHARE: dict[str, float] = {
    "training": 0.55,
    "batch": 0.20,
    "interactive": 0.20,
    "serving": 0.05,
}

GIB = 1024  # MiB
PROGRESS_WALL_S = 60.0  # progress line at least this often (and at every 10% of the stream)
STOP_LATENCY_S = 2.0  # Stop -> JobStopped
ACK_LATENCY_S = 30.0  # Notice -> CheckpointAck (inside every grace period of the example)


# ---------------------------------------------------------------------------------- workload
def _weighted(rng: random.Random, table: list[tuple[float, object]]) -> object:
    x = rng.random() * sum(w for w, _ in table)
    for w, v in table:
        x -= w
        if x < 0:
            return v
    return table[-1][1]


def _lognormal(rng: random.Random, median_s: float, sigma: float, lo: float, hi: float) -> float:
    return min(hi, max(lo, median_s * math.exp(rng.gauss(0.0, sigma))))


# training gang sizes (total GPUs), heavy-tailed: many 1-8 GPU single-node jobs, a long tail of
# 2x8 .. 8x8 multi-node gangs
TRAINING_SIZES: list[tuple[float, object]] = [
    (26, 1), (14, 2), (14, 4), (16, 8),
    (9, 16), (4, 24), (6, 32), (2, 40), (2, 48), (1, 56), (6, 64),
]  # fmt: skip
TRAINING_QUEUES: list[tuple[float, object]] = [
    (40, "pretrain"), (20, "finetune"), (25, "research"), (15, "product"),
]  # fmt: skip
# H100-80GB MIG profiles (the interactive fence's GPUs)
MIG_PROFILES: list[tuple[float, object]] = [
    (45, "1g.10gb"), (10, "1g.20gb"), (20, "2g.20gb"), (15, "3g.40gb"), (5, "4g.40gb"),
    (5, "7g.80gb"),
]  # fmt: skip
# openb-like fractional shares: (milli, GPU memory MiB)
FRACTIONS: list[tuple[float, object]] = [
    (20, (100, 4 * GIB)), (15, (200, 8 * GIB)), (15, (250, 10 * GIB)), (15, (300, 16 * GIB)),
    (20, (500, 24 * GIB)), (10, (700, 40 * GIB)), (5, (900, 60 * GIB)),
]  # fmt: skip
SERVING_SIZES: list[tuple[float, object]] = [(40, (1, 1)), (25, (1, 2)), (20, (1, 4)),
                                              (10, (1, 8)), (5, (2, 4))]  # fmt: skip


@dataclass(slots=True)
class Spec:
    job: Job
    duration_s: float


class Workload:
    """Seeded job generator; one random stream for shapes and durations."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.n = 0

    def _id(self) -> str:
        self.n += 1
        return f"j{self.n:06d}"

    def make(self, partition: str, now: float) -> Spec:
        return getattr(self, f"_{partition}")(now)  # type: ignore[no-any-return]

    def _training(self, now: float) -> Spec:
        rng = self.rng
        queue = str(_weighted(rng, TRAINING_QUEUES))
        prio = 10 if rng.random() < 0.05 else 0
        if rng.random() < 0.1:  # batch-class whole-GPU work in the training fence
            gpus = int(_weighted(rng, [(50, 1), (30, 2), (20, 4)]))
            dur = _lognormal(rng, 1800, 1.0, 60, 86400)
            job = Job(
                id=self._id(),
                workload_class=WorkloadClass.BATCH,
                request=GpuRequest.whole(gpus),
                queue=queue,
                priority=prio,
                submit_time=now,
                cpu_milli=8000 * gpus,
                mem_mib=64 * GIB * gpus,
            )
            return Spec(job, dur)
        size = int(_weighted(rng, TRAINING_SIZES))
        replicas, per = (size // 8, 8) if size > 8 else (1, size)
        dur = _lognormal(rng, 7200, 1.2, 120, 7 * 86400)
        est = dur * rng.uniform(1.0, 1.5) if rng.random() < 0.6 else None
        cpu = 8000 if rng.random() < 0.7 else 16000
        job = Job(
            id=self._id(),
            workload_class=WorkloadClass.TRAINING,
            request=GpuRequest.whole(per),
            replicas=replicas,
            queue=queue,
            priority=prio,
            checkpointable=rng.random() < 0.7,
            est_runtime_s=est,
            submit_time=now,
            cpu_milli=cpu * per,
            mem_mib=128 * GIB * per,
        )
        return Spec(job, dur)

    def _serving(self, now: float) -> Spec:
        rng = self.rng
        replicas, per = _weighted(rng, SERVING_SIZES)  # type: ignore[misc]
        job = Job(
            id=self._id(),
            workload_class=WorkloadClass.SERVING,
            request=GpuRequest.whole(per),
            replicas=replicas,
            queue="online" if rng.random() < 0.6 else "offline",
            submit_time=now,
            cpu_milli=12000 * per,
            mem_mib=96 * GIB * per,
        )
        return Spec(job, _lognormal(rng, 4 * 3600, 1.0, 300, 7 * 86400))

    def _interactive(self, now: float) -> Spec:
        rng = self.rng
        job = Job(
            id=self._id(),
            workload_class=WorkloadClass.INTERACTIVE,
            request=GpuRequest.mig(str(_weighted(rng, MIG_PROFILES))),
            submit_time=now,
            cpu_milli=4000,
            mem_mib=32 * GIB,
        )
        return Spec(job, _lognormal(rng, 1200, 0.8, 60, 86400))

    def _batch(self, now: float) -> Spec:
        rng = self.rng
        if rng.random() < 0.1:
            req = GpuRequest.whole(int(_weighted(rng, [(70, 1), (30, 2)])))
            cpu = 8000 * req.gpus
        else:
            milli, mem = _weighted(rng, FRACTIONS)  # type: ignore[misc]
            req = GpuRequest.fraction(milli, mem)
            cpu = 2000 if milli < 500 else 4000
        job = Job(
            id=self._id(),
            workload_class=WorkloadClass.BATCH,
            request=req,
            partition="batch",
            submit_time=now,
            cpu_milli=cpu,
            mem_mib=16 * GIB,
        )
        return Spec(job, _lognormal(rng, 1800, 1.0, 60, 86400))


# ---------------------------------------------------------------------------------- driver
@dataclass
class Stats:
    steps: int = 0
    step_s: float = 0.0
    # CPU time of the thread in step() (steadier than wall time on a shared machine)
    step_cpu_s: float = 0.0
    step_times: list[float] = field(default_factory=list)
    binds: int = 0
    decisions: Counter[str] = field(default_factory=Counter)
    rejects: Counter[str] = field(default_factory=Counter)
    lent_binds: int = 0
    submitted: int = 0


class Driver:
    """Discrete-event front end: turns decisions into future events, keeps the backlog full."""

    def __init__(self, cluster: Cluster, args: argparse.Namespace) -> None:
        self.cluster = cluster
        self.sched = Scheduler(cluster)
        self.workload = Workload(args.seed)
        self.jobs = args.jobs
        self.stats = Stats()
        total = sum(PENDING_SHARE.values())
        self.target = {p: round(args.pending * s / total) for p, s in PENDING_SHARE.items()}
        self.pending: Counter[str] = Counter()  # driver's view, by home partition
        self.home: dict[str, str] = {}
        self.duration: dict[str, float] = {}
        self.token: dict[str, int] = {}  # bumped on Bind and Stop: older job events are stale
        # heap of (time, seq, event, job id or "", token)
        self.heap: list[tuple[float, int, Event, str, int]] = []
        self.seq = 0
        self.now = 0.0
        self.profiler: cProfile.Profile | None = cProfile.Profile() if args.profile else None
        self.truncated = False
        # every decision in order, hashed: refactors of the core must leave it unchanged
        self.decision_hash = hashlib.sha256()

    def _push(self, t: float, ev: Event, job_id: str = "") -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, ev, job_id, self.token.get(job_id, 0)))

    def _submissions(self) -> list[Event]:
        out: list[Event] = []
        for p, want in self.target.items():
            while self.pending[p] < want and self.stats.submitted < self.jobs:
                spec = self.workload.make(p, self.now)
                jid = spec.job.id
                self.home[jid] = p
                self.duration[jid] = spec.duration_s
                self.pending[p] += 1
                self.stats.submitted += 1
                out.append(JobSubmitted(spec.job))
        return out

    def _apply(self, decisions: list[Decision]) -> None:
        st = self.stats
        now = self.now
        digest = self.decision_hash
        for d in decisions:
            digest.update(repr(d).encode())
            st.decisions[type(d).__name__] += 1
            if isinstance(d, Bind):
                st.binds += 1
                if d.lent_from is not None:
                    st.lent_binds += 1
                self.pending[self.home[d.job_id]] -= 1
                self.token[d.job_id] = self.token.get(d.job_id, 0) + 1
                self._push(now + self.duration[d.job_id], JobFinished(d.job_id), d.job_id)
            elif isinstance(d, Stop):
                self.token[d.job_id] = self.token.get(d.job_id, 0) + 1
                self._push(now + STOP_LATENCY_S, JobStopped(d.job_id), d.job_id)
            elif isinstance(d, Notice):
                self._push(now + ACK_LATENCY_S, CheckpointAck(d.job_id), d.job_id)
            elif isinstance(d, MigReconfigure):
                self._push(now + d.ready_after_s, MigReconfigured(d.gpu))
            elif isinstance(d, Requeue):
                self.pending[self.home[d.job_id]] += 1
            elif isinstance(d, Reject):
                st.rejects[f"{d.reason}: {d.message}"] += 1
                self.pending[self.home[d.job_id]] -= 1

    def _due(self) -> list[Event]:
        """Pop the events of the next event time (stale job events dropped) and advance."""
        heap = self.heap
        out: list[Event] = []
        if not heap:
            return out
        t = heap[0][0]
        self.now = max(self.now, t)
        while heap and heap[0][0] == t:
            _, _, ev, jid, tok = heapq.heappop(heap)
            if jid and tok != self.token.get(jid, 0):
                continue
            out.append(ev)
        return out

    def step(self, events: list[Event]) -> None:
        prof = self.profiler
        c0 = time.thread_time()
        t0 = time.perf_counter()
        if prof is not None:
            prof.enable()
        decisions = self.sched.step(events, self.now)
        if prof is not None:
            prof.disable()
        dt = time.perf_counter() - t0
        st = self.stats
        st.steps += 1
        st.step_s += dt
        st.step_cpu_s += time.thread_time() - c0
        st.step_times.append(dt)
        self._apply(decisions)

    def utilisation(self) -> dict[str, float]:
        led = self.sched.ledger
        c = self.cluster
        return {
            p: led.pool_used[p] / (1000 * len(c.partition_gpus[p])) if c.partition_gpus[p] else 0
            for p in c.partitions
        }

    def progress(self, wall0: float, final: bool = False) -> None:
        st = self.stats
        util = " ".join(f"{p}={u:.0%}" for p, u in self.utilisation().items())
        pend = " ".join(f"{p}={n}" for p, n in self.pending.items())
        rate = st.binds / st.step_s if st.step_s else 0.0
        print(
            f"[{'done' if final else 'prog'}] t={self.now:,.0f}s"
            f" wall={time.perf_counter() - wall0:.0f}s"
            f" submitted={st.submitted} steps={st.steps} binds={st.binds} ({rate:,.0f}/s in step)"
            f" pending={self.sched.pending_count()} ({pend})"
            f" running={len(self.sched.ledger.allocs)} util: {util}",
            file=sys.stderr,
            flush=True,
        )

    def run(self, drain: bool, max_wall_s: float | None = None) -> None:
        wall0 = time.perf_counter()
        every = max(1, self.jobs // 10)
        next_report = every
        next_wall = wall0 + PROGRESS_WALL_S
        while True:
            events = self._due()
            events.extend(self._submissions())
            if not events:
                if self.heap:
                    continue  # only stale events at that time
                wake = self.sched.next_wakeup()
                if wake is None or self.sched.pending_count() == 0:
                    break
                self.now = max(self.now, wake)
                events = [Tick()]
            self.step(events)
            wall = time.perf_counter()
            if self.stats.submitted >= next_report or wall >= next_wall:
                self.progress(wall0)
                while next_report <= self.stats.submitted:
                    next_report += every
                next_wall = wall + PROGRESS_WALL_S
            if self.stats.submitted >= self.jobs and not drain:
                break
            if max_wall_s is not None and wall - wall0 >= max_wall_s:
                self.truncated = True
                print(
                    f"stopping early: wall-clock limit {max_wall_s:g} s reached "
                    f"({self.stats.submitted} of {self.jobs} jobs submitted)",
                    file=sys.stderr,
                )
                break
        self.progress(wall0, final=True)


def p99(values: list[float]) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, math.ceil(0.99 * len(s)) - 1)]


def print_profile(prof: cProfile.Profile, step_s: float) -> None:
    for key in ("cumulative", "tottime"):
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf)
        stats.sort_stats(key).print_stats(25)
        print(
            f"\n=== cProfile of Scheduler.step() only (top 25 by {key}; {step_s:.1f} s in step,"
            " profiler overhead included) ===",
            file=sys.stderr,
        )
        print(buf.getvalue(), file=sys.stderr)
    sys.stderr.flush()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--jobs", type=int, default=None, help="jobs in the stream (100000)")
    ap.add_argument("--pending", type=int, default=None, help="pending backlog to keep (10000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cluster", type=Path, default=None, help="cluster YAML")
    ap.add_argument("--profile", action="store_true", help="cProfile step() calls, to stderr")
    ap.add_argument("--quick", action="store_true", help="smoke run: 5,000 jobs, 1,000 pending")
    ap.add_argument(
        "--drain", action="store_true", help="after the last submission, run until idle"
    )
    ap.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="stop the stream early after this much wall time (the figures cover what ran)",
    )
    args = ap.parse_args(argv)
    if args.cluster is None:
        args.cluster = default_cluster()
    if args.jobs is None:
        args.jobs = 5000 if args.quick else 100_000
    if args.pending is None:
        args.pending = 1000 if args.quick else 10_000
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cluster = load_cluster(args.cluster)
    print(
        f"cluster {cluster.name}: {len(cluster.nodes)} nodes, {len(cluster.gpus)} GPUs; "
        f"jobs={args.jobs} pending={args.pending} seed={args.seed}",
        file=sys.stderr,
    )
    drv = Driver(cluster, args)
    max_wall = args.max_minutes * 60 if args.max_minutes is not None else None
    drv.run(args.drain, max_wall)
    st = drv.stats
    if drv.profiler is not None:
        print_profile(drv.profiler, st.step_s)
    kinds = " ".join(f"{k}={v}" for k, v in sorted(st.decisions.items()))
    print(
        f"steps={st.steps} step_s={st.step_s:.2f} step_cpu_s={st.step_cpu_s:.2f} "
        f"(binds per CPU second in step: {st.binds / max(st.step_cpu_s, 1e-9):.0f}) "
        f"binds={st.binds} (lent {st.lent_binds}) "
        f"decisions={sum(st.decisions.values())} [{kinds}] "
        f"mean_cycle_ms={1000 * st.step_s / max(1, st.steps):.3f} "
        f"max_cycle_ms={1000 * max(st.step_times, default=0):.1f}"
        + (" (stopped early at --max-minutes)" if drv.truncated else ""),
        file=sys.stderr,
    )
    print(f"decision_hash={drv.decision_hash.hexdigest()[:16]}", file=sys.stderr)
    for msg, n in st.rejects.most_common(5):
        print(f"rejected x{n}: {msg}", file=sys.stderr)
    sys.stderr.flush()
    rate = st.binds / st.step_s if st.step_s > 0 else 0.0
    print(f"decisions_per_s={rate:.0f} p99_cycle_ms={1000 * p99(st.step_times):.3f}", flush=True)
    return 0 if rate >= TARGET_DECISIONS_PER_S else 1


if __name__ == "__main__":
    sys.exit(main())
