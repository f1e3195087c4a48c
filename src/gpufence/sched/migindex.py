"""The GPUs of a dynamic-MIG pool that may be re-cut now, grouped by what they hold.

A re-cut choice depends on a GPU's model, its running instances and its idle ones (``migdyn``);
many GPUs share those, so the choice is ranked once per group, not once per GPU. The groups are
kept current from the ledger's MIG log (only the GPUs that changed are looked at again), so a
placement cycle that asks about a 400-GPU pool pays for the few GPUs that changed.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Mapping
from dataclasses import dataclass, field
from operator import attrgetter

from gpufence.model import mig as migmod
from gpufence.sched.context import Core

# (MIG model, running instances sorted by start, idle instances sorted by start)
Sig = tuple[str, tuple[migmod.MigInstance, ...], tuple[migmod.MigInstance, ...]]


@dataclass(slots=True)
class PoolIndex:
    epoch: int = -1
    pos: int = 0
    version: int = -1  # the pool's ledger version when last brought up to date
    sig_of: dict[int, int] = field(default_factory=dict)  # re-cuttable GPU -> its group
    order: list[int] = field(default_factory=list)  # the re-cuttable GPUs, ascending
    groups: dict[int, list[int]] = field(default_factory=dict)  # group -> its GPUs, ascending
    # groups are numbered once (hashing a signature is dear; a number is not)
    ids: dict[Sig, int] = field(default_factory=dict)
    sigs: list[Sig] = field(default_factory=list)
    ranks: dict[object, object] = field(default_factory=dict)  # derived from a group alone
    memo: dict[object, object] = field(default_factory=dict)  # emptied when the index changes
    # profile -> group -> its re-cut rank there (migdyn; None: the profile does not fit)
    fits: dict[str, dict[int, object]] = field(default_factory=dict)
    born: list[int] = field(default_factory=list)  # groups as they were made (again), in order
    # profile -> (how far into ``born`` it was looked at, the groups made where it fits; some
    # may be gone since)
    fitting: dict[str, tuple[int, set[int]]] = field(default_factory=dict)
    seen: dict[int, Sig | None] = field(default_factory=dict)  # GPU -> the signature placed


def _sorted(instances: list[migmod.MigInstance]) -> tuple[migmod.MigInstance, ...]:
    return tuple(sorted(instances, key=_BY_START))


_BY_START = attrgetter("start", "profile")


def _sig(core: Core, pending: Mapping[int, object], g: int) -> Sig | None:
    led = core.ledger
    if g in pending or not led.gpu_usable(g):
        return None
    st = led.mig[g]
    sig = st.memo.get("sig")  # (the GPU's memo is emptied when its instances or jobs change)
    if sig is None:
        model = core.cluster.gpu_type_of(g).mig_model
        assert model is not None
        running = [i for i, o in zip(st.instances, st.occupant, strict=True) if o is not None]
        idle = [i for i, o in zip(st.instances, st.occupant, strict=True) if o is None]
        sig = st.memo["sig"] = (model, _sorted(running), _sorted(idle))
    return sig  # type: ignore[return-value]


def _place(ix: PoolIndex, g: int, sig: Sig | None) -> None:
    if g in ix.seen and ix.seen[g] is sig:  # the GPU's memo gave the same object: unchanged
        return
    ix.seen[g] = sig
    old = ix.sig_of.pop(g, None)
    if old is not None:
        members = ix.groups[old]
        members.remove(g)
        if not members:
            del ix.groups[old]
        if sig is None:
            del ix.order[bisect_left(ix.order, g)]
    elif sig is not None:
        insort(ix.order, g)
    if sig is not None:
        sid = ix.ids.get(sig)
        if sid is None:
            sid = ix.ids[sig] = len(ix.sigs)
            ix.sigs.append(sig)
        ix.sig_of[g] = sid
        group = ix.groups.get(sid)
        if group is None:
            group = ix.groups[sid] = []
            ix.born.append(sid)
        insort(group, g)


def refresh(core: Core, ix: PoolIndex, pool: str, pending: Mapping[int, object]) -> PoolIndex:
    """``ix`` brought up to date with the ledger (a GPU enters or leaves ``pending`` only
    together with a ledger change on it)."""
    led = core.ledger
    log = led.mig_log
    if ix.epoch != led.log_epoch:
        ix = PoolIndex(led.log_epoch, len(log), led.pool_version[pool])
        for g in core.cluster.partition_gpus[pool]:
            _place(ix, g, _sig(core, pending, g))
        return ix
    version = led.pool_version[pool]
    if version == ix.version:  # nothing changed on the pool's nodes
        ix.pos = len(log)
        return ix
    ix.version = version
    ix.memo.clear()  # (what it holds may depend on a node's CPU and memory too)
    gpus, mig, seen = core.cluster.gpus, led.mig, ix.seen
    for g in dict.fromkeys(log[ix.pos :]):
        if gpus[g].partition != pool:
            continue
        # (the common case inline: a change undone since -- a trial placement rolled back --
        # leaves the GPU's memo holding the signature placed)
        sig = mig[g].memo.get("sig")
        if sig is None or seen.get(g) is not sig or g in pending or not led.gpu_usable(g):
            _place(ix, g, _sig(core, pending, g))
    ix.pos = len(log)
    return ix


def running_jobs(core: Core, g: int) -> list[tuple[migmod.MigInstance, str]]:
    """The instances jobs run on, by start, with their jobs (for the pending reason)."""
    st = core.ledger.mig[g]
    held = [(i, o) for i, o in zip(st.instances, st.occupant, strict=True) if o is not None]
    return sorted(held, key=lambda io: (io[0].start, io[0].profile))
