"""Gates under random workloads: a job never starts before its after-ok parents are done, an
array never runs more tasks than its cap, and every gated job ends up run or cancelled."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as hs

from gpufence.model.decisions import Bind, Cancel
from gpufence.model.events import Event, JobFinished, JobSubmitted, Tick
from gpufence.model.job import Job
from gpufence.model.job import WorkloadClass as W
from gpufence.sched.jobs import TERMINAL, JobState
from gpufence.sched.scheduler import Scheduler, SchedulerConfig
from gpufence.testing.builders import ClusterBuilder, job

CLUSTER = (
    ClusterBuilder()
    .nodes("n", 2, gpus=4)
    .partition("p", ["n"], admits=frozenset({W.TRAINING}))
    .build()
)


@hs.composite
def workloads(draw: hs.DrawFn) -> tuple[list[Job], list[bool]]:
    """Jobs in submission order: singles with after-ok parents among earlier jobs, and arrays
    (a group id, a cap) of identical tasks; plus whether each job succeeds when it runs."""
    jobs: list[Job] = []
    n = draw(hs.integers(1, 14))
    for i in range(n):
        gpus = draw(hs.integers(1, 4))
        if draw(hs.booleans()) and jobs:
            parents = draw(hs.lists(hs.sampled_from([j.id for j in jobs]), max_size=2, unique=True))
            jobs.append(job(f"j{i}").gpus(gpus).after("after-ok", *parents).build())
        elif draw(hs.booleans()):
            cap = draw(hs.integers(1, 3))
            size = draw(hs.integers(1, 6))
            jobs += [job(f"j{i}_{k}").gpus(gpus).array(f"j{i}", cap).build() for k in range(size)]
        else:
            jobs.append(job(f"j{i}").gpus(gpus).build())
    ok = draw(hs.lists(hs.booleans(), min_size=len(jobs), max_size=len(jobs)))
    return jobs, ok


@settings(max_examples=120, deadline=None)
@given(workloads(), hs.integers(0, 3))
def test_dependencies_and_caps_hold(work: tuple[list[Job], list[bool]], batches: int) -> None:
    jobs, ok = work
    succeeds = {j.id: o for j, o in zip(jobs, ok, strict=True)}
    by_id = {j.id: j for j in jobs}
    s = Scheduler(CLUSTER, SchedulerConfig(validate=True))
    # submit in up to 4 batches, then let one running job end per step
    cut = [len(jobs) * k // (batches + 1) for k in range(batches + 2)]
    running: list[str] = []
    t = 0.0
    pending_submits = [jobs[cut[k] : cut[k + 1]] for k in range(batches + 1)]
    for _ in range(200):
        events: list[Event] = []
        if pending_submits:
            events += [JobSubmitted(j) for j in pending_submits.pop(0)]
        if running:
            done = running.pop(0)
            events.append(JobFinished(done, succeeds[done]))
        t += 1.0
        for d in s.step(events or [Tick()], t):
            if isinstance(d, Bind):
                j = by_id[d.job_id]
                for _kind, parent in j.after:
                    assert s.job(parent).state is JobState.DONE, (d.job_id, parent)
                running.append(d.job_id)
            elif isinstance(d, Cancel):
                j = by_id[d.job_id]
                assert any(s.job(p).state is not JobState.DONE for _k, p in j.after)
        groups: dict[str, int] = {}
        for rec in s.jobs().values():
            if rec.job.array_group and rec.state in (JobState.RUNNING, JobState.STOPPING):
                groups[rec.job.array_group] = groups.get(rec.job.array_group, 0) + 1
        for g, n in groups.items():
            cap = next(j.array_cap for j in jobs if j.array_group == g)
            assert n <= cap, (g, n, cap)
        if not pending_submits and not running:
            break
    assert all(s.job(j.id).state in TERMINAL for j in jobs), {j.id: s.job(j.id).state for j in jobs}
