"""``gpufence up --executor ray``: the control plane on a Ray cluster.

Connects to Ray (``--ray-address``, default ``auto``: the cluster ``ray start`` left on this
machine, or ``RAY_ADDRESS``), describes its nodes (``nodes``: each alive GPU node one node
group; or the ``--config`` spec, its nodes matched to Ray nodes by ``gpufence_node``), and builds
the ``ControlPlane`` with a ``RayExecutor``. Ray is an optional dependency, imported here only.
"""

from __future__ import annotations

from pathlib import Path

from gpufence.control.base.config import cluster_from_spec_dict, control_config, load_config
from gpufence.control.executors.ray.nodes import (
    RayNodesError,
    auto_names,
    cluster_spec,
    match_config,
    nodes_now,
)
from gpufence.control.gpus.records import Discovery
from gpufence.control.plane.control_plane import ControlPlane

INSTALL_HINT = "pip install 'gpufence[ray]'"


class RayStartError(ValueError):
    """The Ray control plane cannot start; the message says what to do."""


def ray_plane(
    config: Path | None,
    data_dir: Path,
    address: str | None = None,
    check_integrity: bool = True,
    contain: bool = True,
) -> ControlPlane:
    """``contain``: every node agent puts its members in cgroups (each detects its own node's
    cgroup mode; a node without containment refuses to start members)."""
    try:
        import ray
    except ImportError:
        raise RayStartError(
            f"--executor ray needs Ray, which is not installed: {INSTALL_HINT}"
        ) from None
    from gpufence.control.executors.ray.ray_executor import NAMESPACE, RayExecutor

    owns = not ray.is_initialized()
    if owns:
        where = address or "auto"
        try:
            ray.init(address=where, namespace=NAMESPACE, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise RayStartError(
                f"cannot connect to a Ray cluster at {where!r}: {exc}\n  start one with "
                "`ray start --head --num-gpus N` or give --ray-address HOST:PORT"
            ) from None
    try:
        nodes = nodes_now()
        if config is not None:
            cluster, cc = load_config(config, data_dir)
            names = match_config(cluster, nodes)
        else:
            cluster = cluster_from_spec_dict(cluster_spec(nodes))
            names = auto_names(nodes)
            cc = control_config(None, data_dir)
        gpus = sum(len(n.gpu_ids) for n in cluster.nodes)
        source = f"Ray cluster: {len(names)} node(s), {gpus} GPUs declared by `ray start`"
        discovery = Discovery(gpus=(), fake=True, driver=None, source=source)
        executor = RayExecutor(
            names,
            cc.notice_signal,
            owns_ray=owns,
            containment=cc.containment if contain else None,
        )
        return ControlPlane(
            cluster, cc, discovery, data_dir, executor=executor, check_integrity=check_integrity
        )
    except RayNodesError as exc:
        if owns:
            ray.shutdown()
        raise RayStartError(str(exc)) from None
    except BaseException:
        if owns:
            ray.shutdown()
        raise
