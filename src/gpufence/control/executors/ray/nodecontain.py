"""Containment on a Ray node: the node agent fences its members as the local executor does.

Each agent detects its own node's cgroup mode once (``Containment.detect`` with the control
plane's ``control.containment`` settings) and refuses to start a member if the node has none
(the control plane then sees a failed launch). A member gets its cgroup (same name scheme, so an
agent restarted on the node re-opens it), its device rules, its limits and its user; its
directories are made for that user. The GPU device nodes of the node come from the fake-GPU
template when the settings give one, else from NVML on the node itself.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from gpufence.control.base.containment_settings import ContainmentSettings
from gpufence.control.base.executor import Launch, Member
from gpufence.control.containment.cgroup import ContainmentError, MemberCgroup
from gpufence.control.containment.members import Containment

log = logging.getLogger("gpufence.executor.ray")


def template_nodes(settings: ContainmentSettings, gpus: int) -> tuple[str, ...]:
    """Every GPU device node of a node with ``gpus`` fake GPUs (none without a template)."""
    return tuple(n for i in range(gpus) if (n := settings.fake_device(i)) is not None)


def member_nodes(settings: ContainmentSettings, devices: Sequence[str]) -> tuple[str, ...]:
    """The template device nodes of a member's GPU indices (MIG UUIDs have none)."""
    return tuple(
        n for d in devices if d.isdigit() and (n := settings.fake_device(int(d))) is not None
    )


def _nvml_nodes() -> dict[int, tuple[str, ...]]:
    """GPU index -> device nodes on this node, from NVML; empty where NVML finds no GPU."""
    from gpufence.control.gpus.discovery import DiscoveryError, discover

    try:
        return {g.index: g.device_nodes for g in discover().gpus}
    except DiscoveryError as exc:
        log.info("no NVML on this node (%s): GPU device nodes are not isolated", exc)
        return {}


class NodeContainment:
    """The agent's containment (detected on first use, per settings)."""

    def __init__(self) -> None:
        self._by_settings: dict[ContainmentSettings, Containment] = {}
        self._nvml: dict[int, tuple[str, ...]] | None = None

    def _containment(
        self, settings: ContainmentSettings, gpu_nodes: tuple[str, ...]
    ) -> Containment:
        c = self._by_settings.get(settings)
        if c is None:
            if not gpu_nodes and settings.fake_gpu_devices is None:
                if self._nvml is None:
                    self._nvml = _nvml_nodes()
                gpu_nodes = tuple(n for nodes in self._nvml.values() for n in nodes)
            c = Containment.detect(settings, gpu_nodes)
            c.sweep()
            log.info("containment on this node: %s", c.describe())
            self._by_settings[settings] = c
        return c

    def _member(self, settings: ContainmentSettings, member: Member) -> Member:
        if member.device_nodes or settings.fake_gpu_devices is not None or not self._nvml:
            return member
        own = [n for d in member.devices if d.isdigit() for n in self._nvml.get(int(d), ())]
        return replace(member, device_nodes=tuple(own))

    def create(
        self, settings: ContainmentSettings, gpu_nodes: tuple[str, ...], launch: Launch, rank: int
    ) -> MemberCgroup:
        """The member's new cgroup; RuntimeError (the agent's failure) if the node has none."""
        try:
            c = self._containment(settings, gpu_nodes)
            member = next(m for m in launch.members if m.rank == rank)
            return c.create(launch, self._member(settings, member))
        except ContainmentError as exc:
            raise RuntimeError(f"containment on this node: {exc}") from exc

    def open(self, settings: ContainmentSettings, launch: Launch, rank: int) -> MemberCgroup | None:
        try:
            return self._containment(settings, ()).open(launch, rank)
        except ContainmentError:
            return None
