"""Each dynamic-MIG GPU's best free instance of a profile, ranked across its pool.

A one-replica MIG job takes the first row of this ranking whose node admits it (``place_mig``).
The ranking is dear to build (a pool of hundreds of GPUs, each with its free instances) and
every bind in the pool changes it, but only on one GPU: so it is kept current from the ledger's
MIG log like ``sched/migindex.py`` -- the rows of GPUs that changed are made again, the rest
stay.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field

from gpufence.model.mig import MigInstance
from gpufence.sched.placement.mig_room import CutKey, cut_key, fixed_of
from gpufence.state.ledger import Ledger

Row = tuple[CutKey, int, int]  # (key, GPU, start): smaller is better


@dataclass(slots=True)
class Ranking:
    epoch: int
    pos: int  # how far into the ledger's MIG log the rows are current
    version: int  # the pool's ledger version then
    rows: list[Row] = field(default_factory=list)  # sorted
    row_of: dict[int, Row] = field(default_factory=dict)  # GPU -> its row


def best_free(
    ledger: Ledger, g: int, profile: str, mine: list[MigInstance]
) -> tuple[CutKey, int] | None:
    """GPU ``g``'s free ``profile`` instance to take next (its key and start), beside the
    running instances and those this job already took there; memoised on the GPU's state."""
    st = ledger.mig[g]
    if not mine and profile in st.memo:
        return st.memo[profile]  # type: ignore[return-value]
    model = ledger.cluster.gpu_type_of(g).mig_model
    assert model is not None
    fixed = fixed_of([*(i for i, o in zip(st.instances, st.occupant, strict=True) if o), *mine])
    best: tuple[CutKey, int] | None = None
    for inst, occ in zip(st.instances, st.occupant, strict=True):
        if occ is None and inst.profile == profile and inst not in mine:
            key = cut_key(model, fixed, profile, inst.start)
            if best is None or (key, inst.start) < best:
                best = (key, inst.start)
    if not mine:
        st.memo[profile] = best
    return best


def _row(ledger: Ledger, pool: str, profile: str, g: int) -> Row | None:
    if not ledger.mig_free.get((pool, profile), {}).get(g) or not ledger.gpu_usable(g):
        return None
    pick = best_free(ledger, g, profile, [])
    return None if pick is None else (pick[0], g, pick[1])


def _update(r: Ranking, ledger: Ledger, pool: str, profile: str, g: int, full: bool) -> None:
    st = ledger.mig[g]
    mark = ("ranked", profile)  # in the GPU's memo: its row is current unless usability changed
    usable = ledger.gpu_usable(g)
    if not full and st.memo.get(mark) is usable:  # (emptied when its instances or jobs change)
        return
    st.memo[mark] = usable
    new = _row(ledger, pool, profile, g)
    old = r.row_of.get(g)
    if new == old:  # e.g. a change undone since (a trial placement rolled back)
        return
    if old is not None:
        del r.rows[bisect_left(r.rows, old)]
        del r.row_of[g]
    if new is not None:
        insort(r.rows, new)
        r.row_of[g] = new


def ranked(ledger: Ledger, pool: str, profile: str) -> list[Row]:
    """The usable GPUs of ``pool`` with a free ``profile`` instance, best row first."""
    log = ledger.mig_log
    key = ("mig-ranked", pool, profile)
    r = ledger.derived.get(key)
    if not isinstance(r, Ranking) or r.epoch != ledger.log_epoch:
        r = Ranking(ledger.log_epoch, len(log), ledger.pool_version[pool])
        for g in ledger.mig_free.get((pool, profile), {}):
            _update(r, ledger, pool, profile, g, True)
        ledger.derived[key] = r
        return r.rows
    version = ledger.pool_version[pool]
    if version != r.version:  # else the log grew with other pools' changes only
        gpus = ledger.cluster.gpus
        for g in dict.fromkeys(log[r.pos :]):
            if gpus[g].partition == pool:
                _update(r, ledger, pool, profile, g, False)
        r.version = version
    r.pos = len(log)
    return r.rows
