"""Placement dispatch: pick the placement plugin for a pool's sharing mode and request kind."""

from __future__ import annotations

from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Reason
from gpufence.model.job import Job, RequestKind
from gpufence.model.partition import SharingMode
from gpufence.sched.placement.fit import NotPlaced, PlaceResult
from gpufence.sched.placement.fractional import place_fractional
from gpufence.sched.placement.mig_instances import place_mig
from gpufence.sched.placement.scoring import Scorer
from gpufence.sched.placement.timeslice import place_timeslice
from gpufence.sched.placement.whole import place_whole
from gpufence.state.ledger import Ledger


class PlacementEngine:
    def __init__(self, cluster: Cluster, scorers: dict[str, Scorer]) -> None:
        self._cluster = cluster
        self.scorers = scorers  # per fractional partition
        self._failed: dict[tuple[object, ...], tuple[int, NotPlaced]] = {}

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
        key = (pool, job.shape() if request_id is None else request_id, max_gpus)
        hit = self._failed.get(key)
        version = ledger.pool_version[pool]
        if hit is not None and hit[0] == version:
            return hit[1]
        got = self._place(ledger, job, pool, max_gpus)
        if isinstance(got, NotPlaced):
            if len(self._failed) > 4096:
                self._failed.clear()
            self._failed[key] = (version, got)
        return got

    def _place(self, ledger: Ledger, job: Job, pool: str, max_gpus: int | None) -> PlaceResult:
        sharing = self._cluster.partitions[pool].sharing
        kind = job.request.kind
        if max_gpus is not None and job.total_gpus > max_gpus:
            return NotPlaced(Reason.NO_FIT, f"needs {job.total_gpus} GPUs, {max_gpus} lendable")
        if kind is RequestKind.MIG:
            if sharing is not SharingMode.MIG:
                return NotPlaced(Reason.FENCE, f"{pool} has no MIG instances")
            return place_mig(ledger, job, pool)
        if sharing is SharingMode.MIG:
            return NotPlaced(Reason.FENCE, f"{pool} offers only MIG instances")
        if sharing is SharingMode.FRACTIONAL:
            return place_fractional(ledger, job, pool, self.scorers[pool])
        if kind is RequestKind.FRACTION:
            return NotPlaced(Reason.FENCE, f"{pool} does not share GPUs by fraction")
        if sharing is SharingMode.TIME_SLICE:
            return place_timeslice(ledger, job, pool)
        return place_whole(ledger, job, pool)
