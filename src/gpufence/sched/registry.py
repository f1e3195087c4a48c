"""The one explicit registry of scheduling plugins (no import side effects).

Extension points and what implements them:
  queue order   -> sched.queues.PendingQueues.ordered + sched.fairshare.FairShare
  admission     -> sched.admission.quota_blocks (cohort quotas)
  filter/place  -> sched.placement.{whole,mig_instances,fractional,timeslice} via
                   sched.placement.dispatch
  score         -> SCORERS below (fractional partitions choose one by name)
  reserve       -> sched.backfill.reserve (head-of-line gang reservation)
  post-filter   -> sched.protect (lent reclaim, incident / on-demand preemption)
  permit        -> gang all-or-nothing: placers return a whole gang or nothing
  reclaim       -> sched.reclaim (idle interactive sessions)
"""

from __future__ import annotations

from collections.abc import Callable

from gpufence.sched.placement.scoring import (
    BestFit,
    FencePack,
    FragmentationGradient,
    RandomFit,
    Scorer,
)

SCORERS: dict[str, Callable[[int], Scorer]] = {
    "best-fit": lambda seed: BestFit(seed=seed),
    "random": lambda seed: RandomFit(seed),
    "fgd": lambda seed: FragmentationGradient(seed=seed),
    "fence-pack": lambda seed: FencePack(seed=seed),
}


def make_scorer(name: str, seed: int) -> Scorer:
    try:
        factory = SCORERS[name]
    except KeyError:
        known = ", ".join(sorted(SCORERS))
        raise ValueError(f"unknown placement policy '{name}' (known: {known})") from None
    return factory(seed)
