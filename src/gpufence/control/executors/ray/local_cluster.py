"""A multi-node Ray cluster on this machine, on 127.0.0.1 only (tests and benchmarks).

``ray.cluster_utils.Cluster`` with a GPU-less head and one Ray node per entry of ``nodes``
(fake GPUs: Ray only counts them), connected with ``ray.init`` in gpufence's namespace.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LocalNode:
    gpus: int
    cpus: int = 1
    resources: dict[str, float] = field(default_factory=dict)


@contextmanager
def local_ray_cluster(nodes: Sequence[LocalNode]) -> Iterator[Any]:
    """Yield the ``Cluster`` (for ``remove_node``); Ray is shut down on the way out."""
    # loopback only: read at import time; without it Ray advertises the outward address
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray
    from ray.cluster_utils import Cluster

    from gpufence.control.executors.ray.ray_executor import NAMESPACE

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "num_gpus": 0, "node_ip_address": "127.0.0.1"},
    )
    try:
        for n in nodes:
            cluster.add_node(
                num_cpus=n.cpus,
                num_gpus=n.gpus,
                resources=dict(n.resources),
                node_ip_address="127.0.0.1",
            )
        ray.init(
            address=cluster.address,
            namespace=NAMESPACE,
            log_to_driver=False,
            _node_ip_address="127.0.0.1",
        )
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
