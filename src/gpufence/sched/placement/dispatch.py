"""Placement dispatch: each pool's placer (chosen by its sharing mode in ``sched/registry.py``),
a fence check of the request kind against what the placer offers, a cache of failures, and the
nodes an operator closed (``state/closures.py``): a maintenance window that has not begun keeps
the jobs it would find running off its nodes, and a job that would fit but for a drain or a
window is told so by name."""

from __future__ import annotations

from gpufence.model.decisions import Reason
from gpufence.model.job import Job
from gpufence.sched.placement.fit import NotPlaced, Placed, Placer, PlaceResult, refusal
from gpufence.sched.placement.fractional import FractionalPlacer
from gpufence.sched.placement.scoring import Scorer
from gpufence.state.closures import NodeClosures
from gpufence.state.ledger import Ledger

CAPACITY = (Reason.NO_FIT, Reason.FRAGMENTED, Reason.MIG_LAYOUT)


class PlacementEngine:
    def __init__(self, placers: dict[str, Placer]) -> None:
        self._placers = placers  # per partition
        self.scorers: dict[str, Scorer] = {  # per fractional partition
            p: pl.scorer for p, pl in placers.items() if isinstance(pl, FractionalPlacer)
        }
        self._failed: dict[tuple[object, ...], tuple[int, NotPlaced]] = {}
        self.closures: NodeClosures | None = None  # drains and maintenance (the Scheduler's)

    def observe(self, job: Job, home: str) -> None:
        scorer = self.scorers.get(home)
        if scorer is not None:
            scorer.observe(job)

    def place(
        self,
        ledger: Ledger,
        job: Job,
        pool: str,
        max_gpus: int | None = None,
        request_id: int | None = None,
    ) -> PlaceResult:
        """Where the whole gang fits in ``pool`` (no ledger change), or why it does not.

        Placement in a pool is a function of the state of the nodes hosting it, so a request
        shape that failed at one version of the pool fails again until that version changes:
        remembered, not recomputed (the pool's version, not the ledger's, so that binds in
        other pools do not forget it)."""
        # the interned request shape when the caller has it: hashing the shape itself is dear
        shut: tuple[int, ...] = ()
        closures = self.closures
        if closures is not None and (closures.windows or closures.drained):
            pool_nodes = tuple(ledger.cluster.partition_nodes[pool])
            shut = closures.closed_for(job.time_limit_s, pool_nodes)
            shape = job.shape() if request_id is None else request_id
            key: tuple[object, ...] = (pool, shape, job.time_limit_s, max_gpus, shut)
            key = (*key, closures.version)
        else:
            key = (pool, job.shape() if request_id is None else request_id, max_gpus)
        hit = self._failed.get(key)
        version = ledger.pool_version[pool]
        if hit is not None and hit[0] == version:
            return hit[1]
        got = self._place_open(ledger, job, pool, max_gpus, shut)
        if isinstance(got, NotPlaced):
            if len(self._failed) > 4096:
                self._failed.clear()
            self._failed[key] = (version, got)
        return got

    def _place_open(
        self, ledger: Ledger, job: Job, pool: str, max_gpus: int | None, shut: tuple[int, ...]
    ) -> PlaceResult:
        """Place with the nodes in ``shut`` taken out for this job; when it does not fit and
        would with the closed nodes open, the reason names the drains and windows."""
        closures = self.closures
        if closures is None or not (closures.windows or closures.drained):
            return self._place(ledger, job, pool, max_gpus)
        with ledger.fork():
            for n in shut:
                ledger.set_node_up(n, False, count=False)
            got = self._place(ledger, job, pool, max_gpus)
        if isinstance(got, Placed) or got.reason not in CAPACITY:
            return got
        closed = (*closures.opened(tuple(ledger.cluster.partition_nodes[pool])), *shut)
        if not closed:
            return got
        with ledger.fork():
            for n in closed:
                if not ledger.node_up[n]:
                    ledger.set_node_up(n, True, count=False)
            would = self._place(ledger, job, pool, max_gpus)
        if isinstance(would, Placed):  # the same reason code: reservations and protection
            # treat it as the capacity it is; the message says what holds it back
            return NotPlaced(got.reason, closures.describe(closed))
        return got

    def _place(self, ledger: Ledger, job: Job, pool: str, max_gpus: int | None) -> PlaceResult:
        if max_gpus is not None and job.total_gpus > max_gpus:
            return NotPlaced(Reason.NO_FIT, f"needs {job.total_gpus} GPUs, {max_gpus} lendable")
        placer = self._placers[pool]
        refused = refusal(pool, job.request.kind, placer.offers)
        if refused is not None:
            return NotPlaced(Reason.FENCE, refused)
        return placer.place(ledger, job, pool)
