"""MIG churn: gpufence's dynamic MIG against an on-demand smallest-fit baseline (HAMi-style).

A seeded stream of MIG requests (1g/2g/3g/4g/7g, Poisson arrivals, log-normal run times, a
patience after which a request that has not started is withdrawn) on N GPUs of one model, run
twice on the same stream:

* **gpufence**: the real ``Scheduler.step`` on one dynamic-MIG partition (GPUs start uncut;
  ``MigReconfigure`` decisions come back as ``MigReconfigured`` after ``--delay`` seconds, and a
  request's wait runs until its Bind, so the re-cut delay is charged to gpufence);
* **smallest-fit** (the baseline, re-implemented here from its documentation, no code used):
  HAMi v2.10's dynamic MIG as described in ../shared/research/anchors-2026-12b.md (HAMi row:
  reservation-first GPU + profile + placement, node-level fragmentation scoring listed as future
  work; "does not relocate an active GI/CI") and anchors-2026-12.md (HAMi row: creates the GI when
  the pod is allocated and destroys it when the pod ends, picks the smallest fitting choice). Here:
  on every event the waiting requests are tried in arrival order; a request goes to the GPU with
  the fewest free memory slices among those where its profile has a legal placement beside the
  instances that exist (``model/mig.py``: legal starts, no memory-slice overlap, per-profile caps,
  7 instances), at the lowest legal start; its instance is created at once (no delay charged) and
  destroyed when it ends; nothing is ever moved or re-cut.

Checkpointable work: a share of the requests (``--checkpointable``, default 0.5) is
training-like and checkpoints on a notice; the rest (inference replicas, notebooks) is not. No
public trace carries MIG profiles (../shared/research/traces.md, "MIG: no public trace found
here carries MIG profiles"), so the share is an assumption, not a measurement: MIG slices host
small training / fine-tuning / HPO trials beside inference and notebooks, and Alibaba's PAI
trace (the one public mix of both on shared GPUs) has training and inference side by side; one
in two is the neutral guess, fixed before any ratio was looked at. gpufence's partition has a
MIG defrag budget (``--defrag-budget``, default one stop per GPU per 24 h) and stops such jobs
in a drained GPU's way (``sched/migdefrag_stop.py``): a noticed job acknowledges its checkpoint
after ``--ckpt`` s, stops, requeues and resumes with what it had left plus ``--restart`` s of
reload (that time holds a GPU slice but is not counted as work). The baseline never stops
anything. The request mix (1g 40 %, 2g 20 %, 3g 17 %, 4g 13 %, 7g 10 % by count) and the 2 h
patience are the stream's earlier defaults, kept: no source gives a MIG mix either.

Figures per profile: requests, accepted (started before their patience ran out), accepted work
(compute slices x run time, GPU-slice-hours) and p95 wait (withdrawn requests count their
patience: a censored wait). The last line:
``accepted_ratio=<gpufence accepted work / baseline's> p95_wait_large_ratio=<gpufence p95 wait of
3g/4g/7g requests / baseline's>`` (the target: >= 1.10 and < 1). The line before it,
``accepted_ratio_bound=``, is the ratio of a policy that started every request: the most any
scheduler could reach against the baseline on this stream; the one before,
``accepted_ratio_without_mig_rules=``, the baseline's rule on GPUs whose slices are
interchangeable: how much of the gap is MIG's geometry (what placement can win back) at all.

    PYTHONPATH=src python bench/mig_churn.py                      # 32 GPUs, 24 h, seed 1
    PYTHONPATH=src python bench/mig_churn.py --gpus 16 --hours 8 --seed 2 --load 1.2
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpufence.model import mig as migmod
from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Bind, MigReconfigure, Notice, Reject, Stop
from gpufence.model.events import (
    CheckpointAck,
    Event,
    JobCancelled,
    JobFinished,
    JobStopped,
    JobSubmitted,
    MigReconfigured,
)
from gpufence.model.job import GpuRequest, Job
from gpufence.model.partition import MigConfig, SharingMode
from gpufence.sched.scheduler import Scheduler, SchedulerConfig
from gpufence.testing.builders import ClusterBuilder

SIZES = ("1g", "2g", "3g", "4g", "7g")
LARGE = ("3g", "4g", "7g")
# request mix by count, and the median run time (s) per size
MIX = {"1g": 0.40, "2g": 0.20, "3g": 0.17, "4g": 0.13, "7g": 0.10}
MEDIAN_S = 1800.0
SIGMA = 0.8


@dataclass(frozen=True, slots=True)
class Request:
    rid: str
    size: str  # "1g" .. "7g"
    arrive: float
    duration: float
    patience: float
    checkpointable: bool = False  # training-like: stops on a notice and resumes


def profile_names(model: str) -> dict[str, str]:
    """Size -> this model's plain profile of that many compute slices (the smallest memory)."""
    profiles = migmod.profiles_for(model)
    out: dict[str, str] = {}
    for name, p in sorted(profiles.items(), key=lambda kv: kv[1].mem_slices, reverse=True):
        if not p.media_ext:
            out[f"{p.compute_slices}g"] = name
    return out


def stream(args: argparse.Namespace) -> list[Request]:
    """Poisson arrivals at ``--load`` times the GPUs' compute slices, for ``--hours``."""
    rng = random.Random(args.seed)
    mean_slices = sum(MIX[s] * int(s[0]) for s in SIZES)
    mean_run = MEDIAN_S * math.exp(SIGMA**2 / 2)
    rate = args.load * args.gpus * migmod.COMPUTE_SLICES / (mean_slices * mean_run)
    out: list[Request] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t > args.hours * 3600:
            return out
        size = rng.choices(SIZES, weights=[MIX[s] for s in SIZES])[0]
        run = min(MEDIAN_S * math.exp(rng.gauss(0, SIGMA)), 8 * 3600.0)
        ckpt = rng.random() < args.checkpointable
        out.append(Request(f"r{len(out)}", size, round(t, 3), round(run, 3), args.patience, ckpt))


# ---------------------------------------------------------------- the smallest-fit baseline
def smallest_fit(
    args: argparse.Namespace, reqs: list[Request], ruled: bool = True
) -> dict[str, float]:
    """Start time of each request that started (see the module docstring for the rule).
    ``ruled=False``: the same rule on GPUs without MIG's placement rules -- a request fits a
    GPU with as many compute slices free, wherever they are (``_unruled_spot``)."""
    profiles = migmod.profiles_for(args.model)
    names = profile_names(args.model)
    gpus: list[list[tuple[migmod.MigInstance, str]]] = [[] for _ in range(args.gpus)]
    events: list[tuple[float, int, str, str]] = [(r.arrive, 1, "arrive", r.rid) for r in reqs]
    heapq.heapify(events)
    by_id = {r.rid: r for r in reqs}
    waiting: dict[str, None] = {}
    started: dict[str, float] = {}
    while events:
        now = events[0][0]
        while events and events[0][0] == now:
            _, _, what, rid = heapq.heappop(events)
            if what == "arrive":
                waiting[rid] = None
                heapq.heappush(events, (now + by_id[rid].patience, 2, "give-up", rid))
            elif what == "give-up":
                waiting.pop(rid, None)
            else:  # "end": the instance is destroyed with its pod
                gpus[int(what[4:])] = [(i, j) for i, j in gpus[int(what[4:])] if j != rid]
        for rid in list(waiting):
            name = names[by_id[rid].size]
            spot = (
                _smallest_fit_spot(profiles, gpus, name)
                if ruled
                else _unruled_spot(profiles, gpus, name)
            )
            if spot is None:
                continue
            g, start = spot
            gpus[g].append((migmod.MigInstance(name, start), rid))
            del waiting[rid]
            started[rid] = now
            heapq.heappush(events, (now + by_id[rid].duration, 0, f"end:{g}", rid))
    return started


def _smallest_fit_spot(
    profiles: Mapping[str, migmod.MigProfile],
    gpus: list[list[tuple[migmod.MigInstance, str]]],
    name: str,
) -> tuple[int, int] | None:
    best: tuple[int, int, int] | None = None  # (free memory slices, gpu, start)
    for g, held in enumerate(gpus):
        instances = [i for i, _ in held]
        starts = migmod.feasible_starts(profiles, instances, name)
        if not starts:
            continue
        used = bin(migmod.occupied_mask(profiles, instances)).count("1")
        cand = (migmod.MEM_SLICES - used, g, starts[0])
        if best is None or cand < best:
            best = cand
    return None if best is None else (best[1], best[2])


def _unruled_spot(
    profiles: Mapping[str, migmod.MigProfile],
    gpus: list[list[tuple[migmod.MigInstance, str]]],
    name: str,
) -> tuple[int, int] | None:
    """The GPU with the fewest compute slices free among those with enough, as if a GPU's
    slices were interchangeable (no legal starts, no memory-slice layout): what packing alone
    could reach on this stream, the reference for how much of a gap MIG's geometry makes."""
    need = profiles[name].compute_slices
    best: tuple[int, int] | None = None  # (free compute slices, gpu)
    for g, held in enumerate(gpus):
        free = migmod.COMPUTE_SLICES - sum(profiles[i.profile].compute_slices for i, _ in held)
        if free >= need and (best is None or (free, g) < best):
            best = (free, g)
    return None if best is None else (best[1], 0)


# ---------------------------------------------------------------- gpufence
@dataclass(slots=True)
class Stops:
    """What gpufence's defragmentation cost: jobs stopped, reload seconds, and how long the
    stopped jobs waited to resume (they are not withdrawn: their work is checkpointed)."""

    stops: int = 0
    restart_s: float = 0.0
    resume_waits: list[float] = field(default_factory=list)
    busy: list[tuple[int, float, float]] = field(default_factory=list)  # (slices, from, to) run


def _cluster(args: argparse.Namespace) -> Cluster:
    per_node = min(8, args.gpus)
    budget = args.defrag_budget if args.defrag_budget is not None else args.gpus
    mig = MigConfig(
        layout=(),
        dynamic=True,
        reconfigure_delay_s=args.delay,
        defrag_budget=budget,
        defrag_window_s=86400.0,
        defrag_grace_s=max(120.0, 2 * args.ckpt),
    )
    return (
        ClusterBuilder("mig-churn")
        .nodes(
            "n",
            math.ceil(args.gpus / per_node),
            gpus=per_node,
            gpu_type=args.model_type,
            cpu_cores=4096,
            mem_gib=65536,
        )
        .partition("m", ["n"], sharing=SharingMode.MIG, mig=mig)
        .build()
    )


def gpufence(
    args: argparse.Namespace, reqs: list[Request], stops: Stops | None = None
) -> dict[str, float]:
    """First start (Bind) time of each request that started, through ``Scheduler.step``."""
    sched = Scheduler(_cluster(args), SchedulerConfig())
    names = profile_names(args.model)
    by_id = {r.rid: r for r in reqs}
    events: list[tuple[float, int, str, str]] = [(r.arrive, 1, "arrive", r.rid) for r in reqs]
    heapq.heapify(events)
    started: dict[str, float] = {}
    left = {r.rid: r.duration for r in reqs}  # run time still to go
    ran_from: dict[str, float] = {}  # running job -> when this attempt started
    attempt: dict[str, int] = {}  # the end event of an earlier attempt is stale
    stopped_at: dict[str, float] = {}
    st = stops if stops is not None else Stops()
    while events:
        now = events[0][0]
        batch: list[Event] = []
        while events and events[0][0] == now:
            _, _, what, key = heapq.heappop(events)
            jid, _, n = key.partition("#")
            r = by_id.get(key)
            if what == "arrive" and r is not None:
                job = Job(
                    id=key,
                    request=GpuRequest.mig(names[r.size]),
                    submit_time=now,
                    checkpointable=r.checkpointable,
                )
                batch.append(JobSubmitted(job))
                heapq.heappush(events, (now + r.patience, 2, "give-up", key))
            elif what == "give-up" and key not in started:
                batch.append(JobCancelled(key))
            elif what == "end" and attempt.get(jid) == int(n):
                batch.append(JobFinished(jid))
                st.busy.append((int(by_id[jid].size[0]), ran_from.pop(jid), now))
            elif what == "ack":
                batch.append(CheckpointAck(key))
            elif what == "stopped":
                batch.append(JobStopped(key))
            elif what == "recut":
                batch.append(MigReconfigured(int(key)))
        for d in sched.step(batch, now):
            if isinstance(d, Bind):
                started.setdefault(d.job_id, now)
                if d.job_id in stopped_at:
                    st.resume_waits.append(now - stopped_at.pop(d.job_id))
                ran_from[d.job_id] = now
                k = attempt[d.job_id] = attempt.get(d.job_id, 0) + 1
                end = now + left[d.job_id]
                heapq.heappush(events, (end, 0, "end", f"{d.job_id}#{k}"))
            elif isinstance(d, Notice):
                heapq.heappush(events, (now + args.ckpt, 0, "ack", d.job_id))
            elif isinstance(d, Stop):
                st.stops += 1
                st.restart_s += args.restart
                began = ran_from.pop(d.job_id)
                st.busy.append((int(by_id[d.job_id].size[0]), began, now))
                left[d.job_id] -= now - began
                left[d.job_id] += args.restart  # reload from the checkpoint when it resumes
                attempt[d.job_id] += 1  # (its end event is stale now)
                stopped_at[d.job_id] = now
                heapq.heappush(events, (now, 0, "stopped", d.job_id))
            elif isinstance(d, MigReconfigure):
                heapq.heappush(events, (now + d.ready_after_s, 0, "recut", str(d.gpu)))
            elif isinstance(d, Reject):
                raise SystemExit(f"gpufence rejected {d.job_id}: {d.message}")
    return started


# ---------------------------------------------------------------- figures
def p95(values: list[float]) -> float:
    if not values:
        return 0.0
    v = sorted(values)
    return v[min(len(v) - 1, math.ceil(0.95 * len(v)) - 1)]


@dataclass(frozen=True, slots=True)
class Figures:
    requests: int
    accepted: int
    work_h: float  # compute slices x hours run, accepted requests
    p95_wait_s: float  # withdrawn requests count their patience


def figures(reqs: list[Request], started: dict[str, float], sizes: tuple[str, ...]) -> Figures:
    mine = [r for r in reqs if r.size in sizes]
    ok = [r for r in mine if r.rid in started]
    waits = [started[r.rid] - r.arrive if r.rid in started else r.patience for r in mine]
    work = sum(int(r.size[0]) * r.duration for r in ok) / 3600
    return Figures(len(mine), len(ok), work, p95(waits))


def slice_util(args: argparse.Namespace, busy: list[tuple[int, float, float]]) -> float:
    """Share of the GPUs' compute slices busy while requests arrive (0 .. ``--hours``): where
    the baseline already keeps most slices busy, more accepted work needs what it leaves idle,
    so 1 / its share caps what any policy adds during that window."""
    end = args.hours * 3600
    used = sum(n * max(0.0, min(b, end) - max(a, 0.0)) for n, a, b in busy)
    return used / (args.gpus * migmod.COMPUTE_SLICES * end)


def accepted_bound(reqs: list[Request], base: Figures) -> float:
    """The accepted ratio of a policy that starts every request: no policy can do better on
    this stream, so a target above it is out of reach whatever the scheduler does (on a stream
    where the baseline withdraws little, it is close to 1)."""
    offered = figures(reqs, {r.rid: r.arrive for r in reqs}, SIZES).work_h
    return offered / base.work_h if base.work_h else float("inf")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--gpus", type=int, default=32)
    ap.add_argument("--hours", type=float, default=24.0, help="arrivals for this long")
    ap.add_argument("--load", type=float, default=1.1, help="offered compute slices / capacity")
    ap.add_argument("--patience", type=float, default=7200.0, help="s before a request gives up")
    ap.add_argument("--delay", type=float, default=30.0, help="s a gpufence re-cut takes")
    ap.add_argument("--gpu", default="H100-80GB", choices=("H100-80GB", "A100-40GB"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--checkpointable", type=float, default=0.5, help="share of training-like requests"
    )
    ap.add_argument(
        "--defrag-budget",
        type=int,
        default=None,
        help="gpufence's MIG defrag stops per 24 h "
        "(default: one per GPU; 0: drain by attrition only)",
    )
    ap.add_argument("--ckpt", type=float, default=60.0, help="s a noticed job takes to checkpoint")
    ap.add_argument("--restart", type=float, default=120.0, help="s a resumed job reloads")
    args = ap.parse_args(argv)
    args.model_type = args.gpu
    args.model = args.gpu  # the GPU type's MIG model has the same name for both choices
    if args.gpus < 1 or args.hours <= 0 or args.load <= 0:
        ap.error("--gpus, --hours and --load must be positive")
    if not 0.0 <= args.checkpointable <= 1.0:
        ap.error(f"--checkpointable {args.checkpointable:g}: a share, give 0..1")
    if (args.defrag_budget or 0) < 0 or args.ckpt < 0 or args.restart < 0:
        ap.error("--defrag-budget, --ckpt and --restart must not be negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reqs = stream(args)
    print(
        f"{len(reqs)} requests on {args.gpus} x {args.gpu}, {args.hours:g} h, load {args.load:g},"
        f" patience {args.patience:g} s, re-cut delay {args.delay:g} s, seed {args.seed}",
        file=sys.stderr,
    )
    stops = Stops()
    runs = {"smallest-fit": smallest_fit(args, reqs), "gpufence": gpufence(args, reqs, stops)}
    rows = [*((s,) for s in SIZES), LARGE, SIZES]
    head = ("policy", "profile", "reqs", "accepted", "work_h", "p95_wait_s")
    print("{:<13} {:<9} {:>6} {:>8} {:>9} {:>10}".format(*head))
    for policy, started in runs.items():
        for sizes in rows:
            f = figures(reqs, started, sizes)
            label = sizes[0] if len(sizes) == 1 else ("3g/4g/7g" if sizes == LARGE else "all")
            print(
                f"{policy:<13} {label:<9} {f.requests:>6} {f.accepted:>8} {f.work_h:>9.1f} "
                f"{f.p95_wait_s:>10.0f}"
            )
    base_all = figures(reqs, runs["smallest-fit"], SIZES)
    ours_all = figures(reqs, runs["gpufence"], SIZES)
    base_large = figures(reqs, runs["smallest-fit"], LARGE)
    ours_large = figures(reqs, runs["gpufence"], LARGE)
    accepted = ours_all.work_h / base_all.work_h if base_all.work_h else float("inf")
    ckpt = sum(r.checkpointable for r in reqs)
    print(
        f"gpufence MIG defrag: {stops.stops} stops ({ckpt} checkpointable requests), "
        f"{stops.restart_s / 3600:.1f} h of reload (not counted as work), "
        f"p95 wait to resume {p95(stops.resume_waits):.0f} s"
    )
    print(f"preemptions={stops.stops}")
    base_busy = [
        (int(r.size[0]), t, t + r.duration)
        for r in reqs
        if (t := runs["smallest-fit"].get(r.rid)) is not None
    ]
    print(
        f"slice_util_in_window: smallest-fit {slice_util(args, base_busy):.3f} "
        f"gpufence {slice_util(args, stops.busy):.3f}"
    )
    unruled = figures(reqs, smallest_fit(args, reqs, ruled=False), SIZES)
    print(
        f"accepted_ratio_without_mig_rules={unruled.work_h / base_all.work_h:.3f} (smallest-fit "
        "on GPUs whose slices are interchangeable: the room packing alone leaves)"
    )
    print(f"accepted_ratio_bound={accepted_bound(reqs, base_all):.3f}", flush=True)
    wait = ours_large.p95_wait_s / base_large.p95_wait_s if base_large.p95_wait_s else float("inf")
    print(f"accepted_ratio={accepted:.3f} p95_wait_large_ratio={wait:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
