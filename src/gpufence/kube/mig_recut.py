"""The core's MIG re-cuts carried out by the GPU operator's MIG manager.

The core decides a ``MigReconfigure`` (one GPU, its new layout); the MIG manager re-cuts a
*node*: it applies the ``mig-parted`` config its ``nvidia.com/mig.config`` label names and
reports in ``nvidia.com/mig.config.state`` (``pending``, ``rebooting``, then ``success`` or
``failed``). So a re-cut here is:

1. one node patch: the label names the config that keeps every other GPU of the node as it is
   and cuts the chosen one anew (``kube/mig_parted.py`` names it by content), the stale state
   label is removed (a ``success`` left from the previous config must not be read as this
   one's), and ``gpufence.io/mig-recut`` records what was asked, when and for which job -- the
   API server is the store: a restarted scheduler reads the re-cut back from the node instead
   of asking again;
2. waiting: the GPU takes no job until the state is ``success`` *and* the node's allocatable
   ``nvidia.com/mig-<profile>`` counts are the config's (the device plugin advertises the new
   instances), then the core hears ``MigReconfigured`` and binds;
3. a ``failed`` state: the re-cut GPUs leave placement (``MigLayoutRead`` unusable: the MIG
   manager may have left them half cut) until the node reports ``success`` for that config --
   never retried by gpufence, so a broken node is not relabelled in a loop; the waiting pods'
   reason and an Event say so.

Only idle GPUs are re-cut (``MigConfig.recut_busy`` is off on Kubernetes: ``mig-parted``
re-creates every instance of a GPU it re-cuts), one re-cut per node at a time (a second GPU of
the node waits for the first), and a node whose advertised instances differ from what the core
holds is not relabelled at all: its config could not describe the busy GPUs truthfully.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from gpufence.kube import names
from gpufence.kube.actions import Action, LabelNode
from gpufence.kube.mig_parted import ConfigWrite, Counts, config_name, counts_of, describe, entries
from gpufence.kube.objects import ObservedNode
from gpufence.model.cluster import Cluster
from gpufence.model.decisions import MigReconfigure
from gpufence.model.events import Event, MigLayoutRead, MigReconfigured
from gpufence.model.hardware import Node

log = logging.getLogger("gpufence.kube")

SUCCESS, FAILED = "success", "failed"


def whole_gpu_recuts(cluster: Cluster) -> Cluster:
    """The cluster as the core must see it here: a MIG partition re-cuts idle GPUs only."""
    parts = {
        name: replace(p, mig=replace(p.mig, recut_busy=False)) if p.mig is not None else p
        for name, p in cluster.partitions.items()
    }
    return replace(cluster, partitions=parts)


@dataclass(slots=True)
class Recut:
    """One re-cut asked of a node's MIG manager."""

    node: str
    config: str  # the label value
    layouts: tuple[tuple[str, ...], ...]  # every GPU of the node ("profile@start"), by index
    gpus: tuple[int, ...]  # the indices on the node being re-cut
    at: float  # when it was asked (seconds since the epoch)
    job: str = ""  # the job it was made for
    state: str = ""  # the MIG manager's last word
    # seconds between writing its config into the ConfigMap and the label (None: the config
    # was there already, or gpufence does not write configs): a lagging mounted file suspect
    fresh_s: float | None = None

    def note(self) -> str:
        return json.dumps(
            {
                "config": self.config,
                "layouts": [list(lay) for lay in self.layouts],
                "gpus": list(self.gpus),
                "at": self.at,
                "job": self.job,
            },
            separators=(",", ":"),
        )

    @staticmethod
    def read(node: str, value: str) -> Recut | None:
        try:
            raw = json.loads(value) if value else None
            if not isinstance(raw, dict):
                return None
            layouts = tuple(tuple(str(e) for e in lay) for lay in raw["layouts"])
            gpus = tuple(int(k) for k in raw["gpus"])
            return Recut(node, str(raw["config"]), layouts, gpus, float(raw["at"]), str(raw["job"]))
        # (a hand-edited note: JSON nested past the parser's depth, an index of 1e999)
        except (ValueError, KeyError, TypeError, RecursionError, OverflowError):
            return None

    def target(self) -> str:
        """What the re-cut GPUs become: ``3g.40gb x1 + 1g.10gb x4``."""
        return describe(_sum(counts_of(self.layouts[k]) for k in self.gpus))

    def expected(self) -> dict[str, int]:
        """The node's allocatable MIG instances once the config is applied."""
        return dict(_sum(counts_of(lay) for lay in self.layouts))


def _sum(parts: Iterable[Counts]) -> Counts:
    out: dict[str, int] = {}
    for counts in parts:
        for profile, n in counts:
            out[profile] = out.get(profile, 0) + n
    return tuple(sorted(out.items()))


def _node(cluster: Cluster, name: str) -> Node | None:
    return next((n for n in cluster.nodes if n.name == name), None)


class MigRecuts:
    """The re-cuts in flight, done and failed, per node; owned by the loop's thread. What the
    core must hear is kept by node and GPU index (``outcomes``) and turned into events against
    the model of the moment (``take``), since a rebuild renumbers the GPUs."""

    def __init__(self, write_configs: bool = False) -> None:
        # each re-cut's config is written into the MIG manager's ConfigMap before its label
        # (kube/mig_configmap.py); off: a pre-installed catalogue is expected to hold it
        self.write_configs = write_configs
        self.asked: dict[str, Recut] = {}  # node -> in flight
        self.done: dict[str, Recut] = {}  # node -> the last one applied (its layouts hold)
        self.failed: dict[str, Recut] = {}  # node -> failed, its GPUs out of placement
        self.queued: dict[str, dict[int, tuple[tuple[str, ...], str]]] = {}  # node -> k -> ...
        # (node, GPU index, applied | failed | recovered) not yet told to the core
        self.outcomes: list[tuple[str, int, str]] = []
        self.newly_failed: list[Recut] = []  # for the loop's Events on the waiting pods
        self.actions: list[Action] = []

    # -- what the nodes say -------------------------------------------------------------------

    def load(self, nodes: Iterable[ObservedNode]) -> None:
        """Start-up (a new leader): the re-cuts the nodes carry, as the last leader left them."""
        for obs in nodes:
            r = Recut.read(obs.name, obs.mig_recut)
            if r is None or obs.labels.get(names.NODE_MIG_CONFIG) != r.config:
                continue  # none of ours, or relabelled by someone else since
            r.state = obs.labels.get(names.NODE_MIG_STATE, "")
            if r.state == SUCCESS and obs.mig == r.expected():
                self.done[obs.name] = r
            elif r.state == FAILED:
                self.failed[obs.name] = r
            else:
                self.asked[obs.name] = r
                log.info("MIG re-cut of node %s in flight (%s): waiting for it", r.node, r.state)

    def node_seen(self, obs: ObservedNode) -> None:
        """A node changed: has the MIG manager applied (or failed) what was asked?"""
        name = obs.name
        r = self.asked.get(name) or self.failed.get(name)
        if r is None or obs.labels.get(names.NODE_MIG_CONFIG) != r.config:
            return
        state = obs.labels.get(names.NODE_MIG_STATE, "")
        if state != r.state:
            log.info("node %s: MIG config %s is %s", name, r.config, state or "asked")
        r.state = state
        if state == SUCCESS and obs.mig == r.expected():
            # (a failed one the operator had applied since: its GPUs are placed on again)
            kind = "applied" if self.asked.pop(name, None) is not None else "recovered"
            self.failed.pop(name, None)
            self.done[name] = r
            self.outcomes += [(name, k, kind) for k in r.gpus]
        elif state == FAILED and name in self.asked:
            del self.asked[name]
            self.failed[name] = r
            self.newly_failed.append(r)
            held = self.queued.pop(name, {})
            self.outcomes += [(name, k, FAILED) for k in (*r.gpus, *held)]

    def config_written(self, node: str, fresh_s: float | None, wait_s: float) -> None:
        """The re-cut's config is in the MIG manager's ConfigMap (``fresh_s``: written this
        long before the label is due; None: it was there already); the label follows in
        ``wait_s``, once the kubelet can have synced the MIG manager's mounted file."""
        r = self.asked.get(node)
        if r is None:
            return
        r.fresh_s = fresh_s
        if wait_s > 0 and not r.state:
            r.state = f"config written, label in {wait_s:.0f} s"

    def refused(self, node: str, why: str) -> None:
        """The API server refused the node patch (RBAC, the node gone): the re-cut failed
        before the MIG manager saw it."""
        r = self.asked.pop(node, None)
        if r is None:
            return
        r.state = f"not written: {why}"
        self.failed[node] = r
        self.newly_failed.append(r)
        held = self.queued.pop(node, {})
        self.outcomes += [(node, k, FAILED) for k in (*r.gpus, *held)]

    # -- what the core decided ----------------------------------------------------------------

    def decide(
        self,
        cluster: Cluster,
        d: MigReconfigure,
        current: Mapping[int, tuple[str, ...]],
        nodes: Mapping[str, ObservedNode],
        job: str,
        now: float,
    ) -> list[Event]:
        """Ask the MIG manager for the core's re-cut (or queue it behind the node's re-cut in
        flight); ``current`` is each GPU's layout as the core holds it. Returns what the core
        must hear at once (a node that cannot be relabelled)."""
        gpu = cluster.gpus[d.gpu]
        node = cluster.nodes[gpu.node]
        if node.name in self.asked:
            self.queued.setdefault(node.name, {})[gpu.index] = (d.layout, job)
            return []
        return self._ask(node, {gpu.index: (d.layout, job)}, current, nodes, now)

    def _ask(
        self,
        node: Node,
        changes: Mapping[int, tuple[tuple[str, ...], str]],
        current: Mapping[int, tuple[str, ...]],
        nodes: Mapping[str, ObservedNode],
        now: float,
    ) -> list[Event]:
        obs = nodes.get(node.name)
        layouts = tuple(
            changes[k][0] if k in changes else current.get(gid, ())
            for k, gid in enumerate(node.gpu_ids)
        )
        held = dict(_sum(counts_of(current.get(gid, ())) for gid in node.gpu_ids))
        if obs is None or obs.mig != held:
            # the config would misstate GPUs the core does not re-cut (maybe busy ones): the
            # MIG manager would cut them anew under their pods. Out of placement instead.
            has = ", ".join(f"{p}={n}" for p, n in sorted((obs.mig if obs else {}).items()))
            why = (
                f"node {node.name} advertises MIG instances {has or 'none'}, not the "
                f"{', '.join(f'{p}={n}' for p, n in sorted(held.items()))} gpufence holds: "
                "not relabelled"
            )
            log.error("%s", why)
            return [MigLayoutRead(node.gpu_ids[k], (), usable=False, failed=why) for k in changes]
        job = next((j for _, j in changes.values() if j), "")
        gpus = tuple(sorted(changes))
        per_gpu = [counts_of(lay) for lay in layouts]
        config = config_name(per_gpu)
        r = Recut(node.name, config, layouts, gpus, now, job)
        self.asked[node.name] = r
        write = None
        if self.write_configs:
            in_use = [o.labels.get(names.NODE_MIG_CONFIG, "") for o in nodes.values()]
            keep = frozenset(n for n in (*in_use, *(a.config for a in self.asked.values())) if n)
            write = ConfigWrite(config, tuple(entries(per_gpu)), keep)
        self.actions.append(
            LabelNode(
                node.name,
                {names.NODE_MIG_CONFIG: config, names.NODE_MIG_STATE: None},
                {names.ANN_MIG_RECUT: r.note()},
                write,
            )
        )
        log.info("node %s: MIG re-cut to %s asked (config %s)", node.name, r.target(), config)
        return []

    def take(
        self,
        cluster: Cluster,
        current: Mapping[int, tuple[str, ...]],
        nodes: Mapping[str, ObservedNode],
        now: float,
    ) -> tuple[list[Event], list[Action]]:
        """The core's events for what the nodes reported, and the node patches to send (a
        re-cut queued behind one that just ended is asked now)."""
        events: list[Event] = []
        # a re-cut queued behind one that ends in this batch waits for the next call: only
        # then does ``current`` hold the cut the core takes from these events
        ending = {name for name, _, _ in self.outcomes}
        ready = [n for n in self.queued if n not in self.asked and n not in ending]
        for name, k, kind in self.outcomes:
            node = _node(cluster, name)
            if node is None or k >= len(node.gpu_ids):
                continue
            gid = node.gpu_ids[k]
            if kind == "applied":
                events.append(MigReconfigured(gid))
            elif kind == "recovered":
                events.append(MigLayoutRead(gid, self.done[name].layouts[k]))
            else:
                why = f"node {name}: the MIG manager failed to apply {self.failed[name].config}"
                events.append(MigLayoutRead(gid, (), usable=False, failed=why))
        self.outcomes = []
        for name in ready:
            node = _node(cluster, name)
            changes = self.queued.pop(name)
            if node is not None:
                events += self._ask(node, changes, current, nodes, now)
        actions, self.actions = self.actions, []
        return events, actions

    def restore_events(self, cluster: Cluster) -> list[Event]:
        """What a fresh core (a rebuild, a restart) must hold before any job is restored: the
        layouts gpufence's re-cuts left, the re-cuts still in flight, the GPUs a failed one
        took out. Queued re-cuts and unsent outcomes are the old core's: dropped (the fresh
        core decides again)."""
        self.queued.clear()
        self.outcomes = []
        out: list[Event] = []
        for table, kind in ((self.done, SUCCESS), (self.asked, ""), (self.failed, FAILED)):
            for name, r in sorted(table.items()):
                node = _node(cluster, name)
                if node is None or len(node.gpu_ids) != len(r.layouts):
                    continue
                for k, gid in enumerate(node.gpu_ids):
                    if kind == FAILED and k in r.gpus:
                        why = f"node {name}: the MIG manager failed to apply {r.config}"
                        out.append(MigLayoutRead(gid, (), usable=False, failed=why))
                    else:
                        recutting = kind == "" and k in r.gpus
                        out.append(MigLayoutRead(gid, r.layouts[k], recutting=recutting))
        return out

    # -- what a waiting pod is told -----------------------------------------------------------

    def waiting_for(self, cluster: Cluster, gids: Iterable[int], now: float) -> tuple[str, str]:
        """The reason of a job that waits for the re-cut of one of ``gids``, and its gist."""
        names_of = {cluster.nodes[cluster.gpus[g].node].name for g in gids}
        for name in sorted(names_of):
            r = self.asked.get(name)
            if r is not None:
                head = f"waiting for node {name}'s MIG re-cut to {r.target()}"
                state = r.state or "asked"
                if state == SUCCESS:  # (the device plugin has not advertised the new cut yet)
                    state += ", not yet advertised by the node"
                return f"{head} (state {state}, {max(0, now - r.at):.0f} s)", f"{head} ({state})"
        return "", ""

    def failure_for(self, job: str) -> str:
        """A failed re-cut made for ``job``, as its reason names it ("" when none)."""
        for name, r in sorted(self.failed.items()):
            if r.job == job:
                said = f"{names.NODE_MIG_STATE}={FAILED}" if r.state == FAILED else r.state
                lag = ""
                if r.state == FAILED and r.fresh_s is not None:
                    # the MIG manager reads a mounted copy of the ConfigMap: a config written
                    # just before the label may not have reached it yet
                    lag = (
                        f" (the config was new in the ConfigMap, {r.fresh_s:.0f} s before the "
                        "label: if the kubelet syncs the MIG manager's ConfigMap volume less "
                        "often, its file lacked the config; raise --mig-config-settle)"
                    )
                return (
                    f"node {name}'s MIG re-cut to {r.target()} failed "
                    f"({said}, config {r.config}){lag}; its GPUs are out of "
                    "placement until the MIG manager reports success for that config"
                )
        return ""
