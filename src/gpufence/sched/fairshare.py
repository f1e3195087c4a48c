"""Weighted fair share with usage decay, and its explanation per tenant.

A queue's share = (GPUs it holds now + decayed past usage / half-life) / weight, all in milli-GPU.
Holding GPUs counts at once (so one cycle cannot hand everything to one tenant); past usage fades
with the half-life (Slurm PriorityDecayHalfLife, Kueue admission fair sharing).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gpufence.model.cluster import Cluster
from gpufence.state.ledger import Ledger


@dataclass(frozen=True, slots=True)
class TenantShare:
    queue: str
    tenant: str
    weight: float
    holding_gpus: float
    decayed_usage_gpu_h: float
    share: float
    """GPUs per unit of weight -- held now plus the decayed usage's GPU-equivalent -- in the
    unit of ``holding_gpus`` beside it (``FairShare.share`` ranks in milli-GPUs)."""
    rank: int
    explanation: str


class FairShare:
    def __init__(self, cluster: Cluster, half_life_s: float = 86400.0) -> None:
        if half_life_s <= 0:
            raise ValueError("fair-share half_life_s must be > 0")
        self._cluster = cluster
        self.half_life_s = half_life_s
        self.usage: dict[str, float] = dict.fromkeys(cluster.queues, 0.0)  # milli-GPU-seconds
        self._last: float | None = None

    def advance(self, now: float, ledger: Ledger) -> None:
        """Decay past usage and add what each queue held since the last call."""
        if self._last is None or now <= self._last:
            self._last = now if self._last is None else self._last
            return
        dt = now - self._last
        factor = 0.5 ** (dt / self.half_life_s)
        for q in self.usage:
            held = ledger.queue_used[q] + ledger.queue_lent_used[q]
            # exact integral of a constant holding under exponential decay
            gained = held * self.half_life_s / 0.6931471805599453 * (1.0 - factor)
            self.usage[q] = self.usage[q] * factor + gained
        self._last = now

    def restore(self, usage: Mapping[str, float], at: float, now: float) -> None:
        """Take back usage saved at ``at``, decayed to ``now``. The time in between is charged
        nothing: what ran while the front end was down was not observed. Unknown queues (no
        longer configured) and values that are not finite and >= 0 are ignored."""
        factor = 0.5 ** (max(0.0, now - at) / self.half_life_s)
        for q, v in usage.items():
            if q in self.usage and math.isfinite(v) and v >= 0.0:
                self.usage[q] = v * factor

    def share(self, queue: str, ledger: Ledger) -> float:
        spec = self._cluster.queues[queue]
        held = ledger.queue_used[queue] + ledger.queue_lent_used[queue]
        return (held + self.usage[queue] / self.half_life_s) / spec.weight

    def owed(self, queue: str) -> float:
        """The queue's decayed past usage per weight (milli-GPU, like ``share``) without what it
        holds now: the long-run account that says which queue fair share owes GPU time (Slurm's
        fair-share factor is built on the same decayed usage). Reservations follow it
        (sched/passing.py ``ahead_by_share``)."""
        return self.usage[queue] / self.half_life_s / self._cluster.queues[queue].weight

    def explain(self, partition: str, ledger: Ledger) -> list[TenantShare]:
        queues = self._cluster.partition_queues[partition]
        ranked = sorted(queues, key=lambda q: (self.share(q, ledger), q))
        out: list[TenantShare] = []
        for rank, q in enumerate(ranked, 1):
            spec = self._cluster.queues[q]
            s = self.share(q, ledger)
            held = (ledger.queue_used[q] + ledger.queue_lent_used[q]) / 1000
            if rank == 1:
                why = "lowest weighted share: its jobs are tried first among equal priorities"
            else:
                ahead = ranked[rank - 2]
                order = _compare(self.share(ahead, ledger) / 1000, s / 1000, ahead)
                why = (
                    f"behind {ahead} ({order}): "
                    f"it holds {held:g} GPUs and used {self.usage[q] / 3.6e6:.1f} GPU-h "
                    f"(decayed) at weight {spec.weight:g}"
                )
            out.append(
                TenantShare(
                    queue=q,
                    tenant=spec.tenant or q,
                    weight=spec.weight,
                    holding_gpus=held,
                    decayed_usage_gpu_h=self.usage[q] / 3.6e6,
                    share=s / 1000,  # milli-GPUs -> GPUs, the unit of every other column
                    rank=rank,
                    explanation=why,
                )
            )
        return out


def _compare(before: float, share: float, ahead: str) -> str:
    """Why ``ahead`` (share ``before``) ranks before a queue with ``share``: with as many
    decimals as it takes to show the difference, or the tie and its rule."""
    if before == share:
        return f"shares tied at {share:.2f}: ties go by queue name"
    for digits in range(2, 10):
        a, b = f"{before:.{digits}f}", f"{share:.{digits}f}"
        if a != b:
            return f"share {a} < {b}"
    return f"share {before!r} < {share!r}"
