"""The Ray executor's health thread (mixed into ``RayExecutor``): node up / down from Ray.

Every ``health_poll_s`` (or at once, when the exit watcher saw an agent die) it lists the Ray
nodes, compares them with the executor's (``bookkeeping.node_changes``) and reports each change
through ``on_node``. The members of a node that went down end with code None (their attempt's
exit then waits for the scheduler's stop, see ``ray_executor``) and are sent SIGKILL through
the node's agent in case it is still reachable, so a requeued job never runs twice.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from gpufence.control.base.executor import NodeCallback, notify
from gpufence.control.executors.ray.bookkeeping import RayAttempt, RayMember, node_changes
from gpufence.control.executors.ray.nodes import RayNode, nodes_now

log = logging.getLogger("gpufence.executor.ray")


class NodeHealth:
    """Needs the attributes below, set by ``RayExecutor.__init__``."""

    health_poll_s: float
    _lock: threading.Lock
    _closing: threading.Event
    _poll_now: threading.Event
    _wake: threading.Event
    _nodes: dict[str, RayNode]
    _up: dict[str, bool]
    _agents: dict[str, Any]
    _attempts: dict[tuple[str, int], RayAttempt]
    _refs: dict[Any, tuple[RayAttempt, RayMember]]
    _on_node: NodeCallback

    def _member_ended_locked(
        self, att: RayAttempt, m: RayMember, code: int | None, lost: bool
    ) -> None:
        raise NotImplementedError

    def _poll(self) -> None:
        while not self._closing.is_set():
            self._poll_now.wait(self.health_poll_s)
            self._poll_now.clear()
            if self._closing.is_set():
                return
            try:
                now_nodes = nodes_now()
            except Exception as exc:
                log.warning("ray executor: cannot list Ray nodes: %s", exc)
                continue
            with self._lock:
                changes = node_changes(self._nodes, self._up, now_nodes)
                on_node = self._on_node
            for name, up, old_id in changes:
                if up:
                    log.warning("node %s is up (Ray node %s)", name, self._nodes[name].node_id)
                else:
                    log.warning("node %s is down (Ray node %s)", name, old_id)
                notify(on_node, name, up)
                if not up:
                    self._node_lost(old_id)

    def _node_lost(self, node_id: str) -> None:
        """Members on a node declared down end with code None; they get SIGKILL if reachable."""
        with self._lock:
            self._agents.pop(node_id, None)
            for att in self._attempts.values():
                gone = [m for m in att.live() if m.node_id == node_id]
                if not gone:
                    continue
                adir = str(att.launch.attempt_dir.absolute())
                gone[0].agent.signal.remote(adir, [m.rank for m in gone], int(signal.SIGKILL))
                for ref, (a, m) in list(self._refs.items()):
                    if a is att and m in gone:
                        del self._refs[ref]
                for m in gone:
                    self._member_ended_locked(att, m, None, lost=True)
        self._wake.set()
