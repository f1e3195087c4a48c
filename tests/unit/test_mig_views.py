"""The incremental views of dynamic-MIG pools (``mig_rank.ranked``, ``migindex.refresh`` and the
groups ``migdyn`` may re-cut) kept current from the ledger's MIG log equal the same views built
from scratch, after every kind of ledger change: binds and releases on instances, re-cuts, GPUs
blocked and unblocked, nodes down and up, trial placements rolled back, and the logs cut short."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import cast

import pytest

from gpufence.model.cluster import Cluster
from gpufence.model.decisions import Assignment
from gpufence.model.mig import MigInstance
from gpufence.sched import migdyn, migindex
from gpufence.sched.context import Core
from gpufence.sched.migindex import PoolIndex
from gpufence.sched.placement.mig_rank import ranked
from gpufence.state import ledger as ledger_mod
from gpufence.state.ledger import Allocation, Ledger
from gpufence.testing.builders import ClusterBuilder, MigConfig, SharingMode, job

PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb")
LAYOUTS = (
    ("3g.40gb@4", "2g.20gb@0", "1g.10gb@2", "1g.10gb@3"),
    tuple(f"1g.10gb@{i}" for i in range(7)),
    ("1g.10gb@0", "1g.10gb@1", "1g.10gb@2", "1g.10gb@3", "3g.40gb@4"),
    ("7g.80gb@0",),
)


def _cluster() -> Cluster:
    mig = MigConfig(layout=("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"), dynamic=True)
    return (
        ClusterBuilder()
        .nodes("n", 3, gpus=2)
        .partition("m", ["n"], sharing=SharingMode.MIG, mig=mig)
        .queue("q", "m")
        .build()
    )


def _layout(specs: tuple[str, ...]) -> list[MigInstance]:
    return [MigInstance(s.split("@")[0], int(s.split("@")[1])) for s in specs]


class _World:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.cluster = _cluster()
        self.led = Ledger(self.cluster)
        self.core = cast(Core, SimpleNamespace(ledger=self.led, cluster=self.cluster))
        self.ix = PoolIndex()
        self.n = 0

    def _bind(self) -> None:
        led = self.led
        free = [
            (g, i)
            for g, st in led.mig.items()
            for i, o in zip(st.instances, st.occupant, strict=True)
            if o is None
        ]
        if not free:
            return
        g, inst = self.rng.choice(free)
        self.n += 1
        node = self.cluster.gpus[g].node
        a = Assignment(node=node, gpus=(g,), mig_profile=inst.profile, mig_start=inst.start)
        j = job(f"j{self.n}").mig(inst.profile).partition("m").build()
        led.allocate(Allocation(j, "m", "q", "m", (a,), 1000))

    def _recut(self) -> None:
        idle = [g for g, st in self.led.mig.items() if not st.busy()]
        if idle:
            self.led.set_mig_layout(self.rng.choice(idle), _layout(self.rng.choice(LAYOUTS)))

    def step(self) -> None:
        led, rng = self.led, self.rng
        op = rng.randrange(6)
        if op == 0:
            self._bind()
        elif op == 1 and led.allocs:
            led.release(rng.choice(sorted(led.allocs)))
        elif op == 2:
            self._recut()
        elif op == 3:
            g = rng.randrange(len(self.cluster.gpus))
            led.set_blocked(g, g not in led.blocked)
        elif op == 4:
            node = rng.randrange(len(self.cluster.nodes))
            led.set_node_up(node, not led.node_up[node])
        else:  # a trial placement, undone
            m = led.mark()
            self._bind()
            self._recut()
            led.rollback(m)

    def check(self) -> None:
        led = self.led
        for p in PROFILES:
            got = list(ranked(led, "m", p))
            fresh = led.derived.pop(("mig-ranked", "m", p))
            try:
                assert got == ranked(led, "m", p), p
            finally:
                led.derived[("mig-ranked", "m", p)] = fresh
        self.ix = migindex.refresh(self.core, self.ix, "m", {})
        new = migindex.refresh(self.core, PoolIndex(), "m", {})
        assert _groups(self.ix) == _groups(new)
        assert self.ix.order == new.order == sorted(new.sig_of)
        for p in PROFILES:  # the groups where a re-cut makes room, kept as groups come and go
            every = [(migdyn._rank(new, sid, p), sid) for sid in new.groups]
            ranked_new = sorted(
                ((r, new.groups[sid][0], sid) for r, sid in every if r is not None),
                key=lambda rgs: (rgs[0], rgs[1]),
            )
            fit = [(r, new.sigs[sid]) for r, _, sid in ranked_new]
            got = [(r, self.ix.sigs[sid]) for r, sid in migdyn._fitting_groups(self.ix, p, False)]
            assert got == fit, p


def _groups(ix: PoolIndex) -> dict[migindex.Sig, list[int]]:
    return {ix.sigs[sid]: gids for sid, gids in ix.groups.items()}


@pytest.mark.parametrize("seed", range(12))
def test_incremental_mig_views_equal_views_built_anew(seed: int) -> None:
    w = _World(seed)
    for _ in range(150):
        w.step()
        if w.rng.random() < 0.5:  # (views also catch up over several changes at once)
            w.check()
    w.check()


def test_views_resync_when_the_logs_are_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger_mod, "_LOG_MAX", 7)
    w = _World(99)
    for _ in range(200):
        w.step()
        w.check()
    assert w.led.log_epoch > 0
