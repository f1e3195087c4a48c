"""Starvation property: a 64-GPU gang starts in bounded time under a stream of 1-GPU jobs.

A simulated front end steps the scheduler on a fixed tick grid: jobs submitted during a tick are
submitted at its end, jobs finish at their durations (reported at the next tick), and the gang
(8 replicas x 8 GPUs) arrives while the partition is full and small jobs keep arriving faster
than they finish. Estimates, where given, are upper bounds of the true duration (a time limit):
a backfilled job never overruns its estimate.

Bound: the gang starts no later than the moment every job running when it arrived has ended
(which is at most its submission + the longest duration among them), plus one tick. Where a job
gave an estimate, "ended" means by its estimate: a job may backfill until then (with exact
estimates, slack = 0, the two are the same).
"""

from __future__ import annotations

import heapq
import os
import random
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Bind, Reason
from gpufence.model.events import Event, JobFinished, JobSubmitted, Tick
from gpufence.model.job import Job
from gpufence.sched.jobs import JobState
from gpufence.sched.scheduler import Scheduler, SchedulerConfig
from gpufence.testing.builders import ClusterBuilder, job

GANG = "gang"
SCALE = float(os.environ.get("GPUFENCE_PROP_SCALE", "1"))  # more examples when bug-hunting


def cluster(nodes: int, racks: int) -> Cluster:
    cb = ClusterBuilder("starve")
    per_rack = nodes // racks
    for r in range(racks):
        cb.nodes(f"g{r}", per_rack, gpus=8, rack=f"r{r}", nvlink=(4, 4) if r % 2 else (8,))
    return cb.partition("train", groups=[f"g{r}" for r in range(racks)]).build()


@dataclass
class Stream:
    """Small 1-GPU jobs: arrival times, true durations and (optional) estimates."""

    rng: random.Random
    mean_gap: float
    dur: tuple[float, float]
    est_share: float  # fraction of jobs that give an estimate
    slack: float  # estimate = duration * (1 + up to slack)
    n: int = 0

    def next(self, now: float) -> tuple[float, Job, float]:
        self.n += 1
        at = now + self.rng.expovariate(1.0 / self.mean_gap)
        d = float(round(self.rng.uniform(*self.dur)))
        b = job(f"s{self.n}").gpus(1).at(at)
        if self.rng.random() < self.est_share:
            b = b.est(float(round(d * (1 + self.rng.uniform(0, self.slack)))) or 1.0)
        return at, b.build(), d


@dataclass
class Sim:
    sched: Scheduler
    tick: float
    ends: list[tuple[float, str]] = field(default_factory=list)  # heap of (end, job)
    duration: dict[str, float] = field(default_factory=dict)
    end_at: dict[str, float] = field(default_factory=dict)
    binds: list[tuple[float, Bind]] = field(default_factory=list)

    def step(self, now: float, submitted: list[Job]) -> None:
        events: list[Event] = [JobSubmitted(j) for j in submitted]
        while self.ends and self.ends[0][0] <= now:
            events.append(JobFinished(heapq.heappop(self.ends)[1]))
        for d in self.sched.step(events or [Tick()], now):
            if isinstance(d, Bind):
                self.binds.append((now, d))
                end = now + self.duration[d.job_id]
                self.end_at[d.job_id] = end
                heapq.heappush(self.ends, (end, d.job_id))

    def known_end(self, jid: str) -> float:
        """When the scheduler can know the job ends: by its estimate if it gave one (an upper
        bound of its true end), else its true end."""
        rec = self.sched.job(jid)
        est = rec.job.est_runtime_s
        if est is None or rec.started_at is None:
            return self.end_at[jid]
        return rec.started_at + est

    def running(self) -> list[str]:
        return [j for j, r in self.sched.jobs().items() if r.state is JobState.RUNNING]


def run_until_gang(
    c: Cluster, stream: Stream, tick: float, gang_at: float, gang_est: float | None
) -> tuple[Sim, float, float, list[str]]:
    """Fill the partition, stream small jobs, submit the gang at ``gang_at``; run until the gang
    starts (or well past the bound). Returns (sim, gang arrival step time, bound, running-then)."""
    sched = Scheduler(c, SchedulerConfig(validate=True))
    sim = Sim(sched, tick)
    capacity = len(c.gpus)
    first: list[Job] = []
    for _ in range(capacity):  # a full partition at t=0
        _, j, d = stream.next(0.0)
        sim.duration[j.id] = d
        first.append(j)
    sim.step(0.0, first)
    next_at, nxt, nd = stream.next(0.0)
    now = 0.0
    arrival: float | None = None
    bound = float("inf")
    running_then: list[str] = []
    while True:
        now += tick
        batch: list[Job] = []
        while next_at <= now:
            sim.duration[nxt.id] = nd
            batch.append(nxt)
            next_at, nxt, nd = stream.next(next_at)
        gang_now = arrival is None and now >= gang_at
        if gang_now:
            b = job(GANG).gang(8, gpus=8).at(now)
            if gang_est is not None:
                b = b.est(gang_est)
            gang = b.build()
            sim.duration[GANG] = 10.0
            batch.append(gang)
        sim.step(now, batch)
        if gang_now:
            arrival = now
            running_then = [j for j in sim.running() if j != GANG]
            bound = max((sim.known_end(j) for j in running_then), default=now)
        if GANG in sim.end_at:
            assert arrival is not None
            return sim, arrival, bound, running_then
        assert now <= bound + tick, (
            f"gang submitted at t={arrival} not started by t={now}; every job running at its "
            f"arrival ended by t={bound}; pending: {sched.why_pending(GANG)}"
        )


@settings(max_examples=int(12 * SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.sampled_from((8, 16)),
    racks=st.sampled_from((1, 2)),
    tick=st.sampled_from((1.0, 5.0, 10.0)),
    seed=st.integers(0, 2**32 - 1),
    est_share=st.sampled_from((0.0, 0.3, 0.7, 1.0)),
    slack=st.sampled_from((0.0, 0.5, 3.0)),
    gang_at=st.floats(20.0, 300.0),
    gang_est=st.sampled_from((None, 100.0)),
    durations=st.sampled_from(((20.0, 400.0), (100.0, 900.0), (5.0, 60.0))),
)
def test_gang_starts_within_bound_under_small_job_stream(
    nodes: int,
    racks: int,
    tick: float,
    seed: int,
    est_share: float,
    slack: float,
    gang_at: float,
    gang_est: float | None,
    durations: tuple[float, float],
) -> None:
    c = cluster(nodes, racks)
    capacity = len(c.gpus)
    mean_dur = sum(durations) / 2
    # arrivals at 1.5-3x the rate at which a full partition completes jobs
    gap = mean_dur / capacity / random.Random(seed).uniform(1.5, 3.0)
    stream = Stream(random.Random(seed), gap, durations, est_share, slack)
    sim, arrival, bound, running_then = run_until_gang(c, stream, tick, gang_at, gang_est)
    start = sim.end_at[GANG] - sim.duration[GANG]
    assert start <= bound + tick
    longest = max(sim.known_end(j) - sim.end_at[j] + sim.duration[j] for j in running_then)
    assert start <= arrival + longest + tick
    if slack == 0.0:  # exact estimates: the bound in true durations
        assert start <= arrival + max(sim.duration[j] for j in running_then) + tick
    # the stream really was faster than completions: small jobs were still waiting
    assert sim.sched.pending_count() > 0


@settings(max_examples=int(10 * SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tick=st.sampled_from((1.0, 5.0)),
    seed=st.integers(0, 2**32 - 1),
    slack=st.sampled_from((0.0, 0.5)),
    gang_at=st.floats(20.0, 200.0),
)
def test_small_jobs_backfill_without_delaying_the_gang(
    tick: float, seed: int, slack: float, gang_at: float
) -> None:
    """Every small job estimates its runtime: the gang's start is known, GPUs freed before it
    are used by small jobs that end in time (BACKFILL), and the gang still starts on time."""
    c = cluster(8, 1)
    stream = Stream(random.Random(seed), 0.5, (30.0, 600.0), 1.0, slack)
    sched = Scheduler(c, SchedulerConfig(validate=True))
    sim = Sim(sched, tick)
    first: list[Job] = []
    for _ in range(len(c.gpus)):
        _, j, d = stream.next(0.0)
        sim.duration[j.id] = d
        first.append(j)
    sim.step(0.0, first)
    # after the gang arrives, short jobs keep arriving: these can end before the reservation
    short = Stream(random.Random(seed + 1), 2.0, (5.0, 40.0), 1.0, 0.0)
    next_at, nxt, nd = stream.next(0.0)
    now = 0.0
    arrival: float | None = None
    reserved_start: float | None = None
    backfilled: list[str] = []
    while GANG not in sim.end_at:
        now += tick
        batch: list[Job] = []
        src = stream if arrival is None else short
        while next_at <= now:
            sim.duration[nxt.id] = nd
            batch.append(nxt)
            next_at, nxt, nd = src.next(next_at)
        if arrival is None and now >= gang_at:
            batch.append(job(GANG).gang(8, gpus=8).at(now).est(100.0).build())
            sim.duration[GANG] = 100.0
            arrival = now
            next_at, nxt, nd = short.next(now)
        n_binds = len(sim.binds)
        sim.step(now, batch)
        new = sim.binds[n_binds:] if arrival is not None and arrival < now else []
        if arrival is None or GANG in sim.end_at:
            continue
        res = sched.query.reservation("train")
        assert res is not None and res.job_id == GANG, sched.why_pending(GANG)
        if reserved_start is None:
            reserved_start = res.start
            assert reserved_start != float("inf")
            latest = max(sim.known_end(j) for j in sim.running())
            assert reserved_start <= latest
        # the gang is never pushed back
        assert res.start <= reserved_start
        for _, b in new:
            assert b.job_id != GANG
            assert b.reason is Reason.BACKFILL, b
            assert sim.end_at[b.job_id] <= res.start
            backfilled.append(b.job_id)
        # no idle GPU while a waiting job could have used it without delaying the gang
        idle = sum(1 for g in range(len(c.gpus)) if sched.ledger.is_free(g))
        fits = [
            j
            for j, r in sched.jobs().items()
            if r.state is JobState.PENDING
            and j != GANG
            and r.job.est_runtime_s is not None
            and now + r.job.est_runtime_s <= res.start
        ]
        assert not (idle and fits), f"t={now}: {idle} idle GPUs while {fits[:3]} could backfill"
        assert now <= reserved_start + tick
    assert arrival is not None and reserved_start is not None
    start = sim.end_at[GANG] - sim.duration[GANG]
    assert start <= reserved_start + tick
    assert backfilled, "no small job backfilled before the gang's reservation"
