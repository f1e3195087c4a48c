"""An upper bound on the GPU allocation any place-it-if-it-fits policy can reach on one openb
arrival sequence (the FGD protocol: pods only arrive, a pod that does not fit is dropped).

Why a bound exists: take a share size ``b`` above half a GPU (openb's 810 milli). Two such pods
never share a GPU, and the ``1000 - b`` milli left beside one can only ever hold pods of at most
``1000 - b`` milli, which are rare. A policy that places every pod that fits must place each
``b`` pod that arrives before the first one that fails; and once a ``b`` pod has failed, no GPU
will ever again have ``b`` milli free on a node with that pod's CPU and memory (nothing leaves),
so from then on only smaller shares, or pods asking less CPU or memory, can still be placed.
For every possible moment ``k`` of that first failure the final allocation is at most

* ``capacity - (1000 - b) x (b pods arrived before k) + (milli of all pods <= 1000 - b)``, and
* ``(milli arrived before k) + (milli of the pods after k that could still fit)``;

the bound is the largest over ``k`` of the smaller of the two, and the smallest over ``b``.
It assumes everything else packs perfectly (no CPU shortage, no pairing waste), so the truth is
lower; it is a ceiling to measure a policy against, not a target.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from gpufence.model.job import MILLI_PER_GPU
from gpufence.sim.workloads.openb import OpenbPod


def allocation_ceiling(seq: Sequence[OpenbPod], capacity_milli: int) -> float:
    """Upper bound (milli) on the GPU milli allocated after the whole sequence, any policy
    that places every pod that fits; ``capacity_milli`` when no share above half a GPU."""
    best = float(capacity_milli)
    sizes = {p.gpu_milli for p in seq if _share(p) and 2 * p.gpu_milli > MILLI_PER_GPU}
    for b in sorted(sizes):
        best = min(best, _ceiling_for(seq, capacity_milli, b))
    return best


def _share(p: OpenbPod) -> bool:
    return p.num_gpu == 1 and 0 < p.gpu_milli < MILLI_PER_GPU


def _ceiling_for(seq: Sequence[OpenbPod], capacity: int, b: int) -> float:
    hole = MILLI_PER_GPU - b
    big = np.array([_share(p) and p.gpu_milli == b for p in seq], dtype=np.bool_)
    bigs = [p for p, is_big in zip(seq, big, strict=True) if is_big]
    min_cpu = min(p.cpu_milli for p in bigs)
    min_mem = min(p.mem_mib for p in bigs)
    milli = np.array([p.total_milli for p in seq], dtype=np.float64)
    fillers = float(sum(p.total_milli for p in seq if _share(p) and p.gpu_milli <= hole))
    # after the first b pod failed: only pods under b milli per GPU, or asking less CPU or
    # memory than every b pod, can still find room
    late_ok = np.array(
        [
            (p.gpu_milli < b if p.num_gpu > 0 else True)
            or p.cpu_milli < min_cpu
            or p.mem_mib < min_mem
            for p in seq
        ],
        dtype=np.bool_,
    )
    n = len(seq)
    arrived = np.concatenate([[0.0], np.cumsum(milli)])  # before k, k = 0..n
    bigs_before = np.concatenate([[0], np.cumsum(big)])
    # milli that could still be placed after arrival k (k itself failed): suffix sums from k+1
    late = np.concatenate([np.cumsum((milli * late_ok)[::-1])[::-1], [0.0]])
    after = np.concatenate([late[1:], [0.0]])  # after[k] = sum over j > k; after[n] = 0
    first = capacity - hole * bigs_before + fillers
    second = arrived + after
    ks = np.append(np.flatnonzero(big), n)  # where the first b pod can fail; n: none fails
    return float(np.minimum(np.minimum(first[ks], second[ks]), capacity).max())


def repacked_idle(gpus: Sequence[Sequence[int]]) -> int:
    """Idle milli left if the shares on these GPUs (one list of share sizes per GPU) were
    packed again offline, best-fit decreasing, onto as few GPUs as that takes; the GPUs it
    frees count as busy (whole-GPU pods that were turned away would take them).

    Not a bound -- best-fit decreasing is a heuristic, and another policy would have placed
    other pods -- but a clairvoyant yardstick for how much of a policy's idle capacity is
    pairing: what it leaves idle beyond this figure, better pairing could have recovered.
    """
    items = sorted((m for g in gpus for m in g), reverse=True)
    room: list[int] = []  # residual of each bin, kept sorted
    for m in items:
        i = bisect.bisect_left(room, m)  # the tightest bin that still fits m
        if i == len(room):
            bisect.insort(room, MILLI_PER_GPU - m)
        else:
            left = room.pop(i) - m
            bisect.insort(room, left)
    return sum(room)
