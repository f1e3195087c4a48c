"""What the fake kubelet (kubelet.py) writes: fake GPU Node objects and the pod statuses a
kubelet reports, as plain JSON-able dicts (no client, no I/O)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

GPU = "nvidia.com/gpu"
RUN_S = "sim.gpufence.io/run-s"
EXIT_CODE = "sim.gpufence.io/exit-code"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def now_utc() -> datetime:
    return datetime.now(UTC)


def rfc3339(when: datetime | None = None) -> str:
    """RFC 3339 seconds, the form the API server stores (``metav1.Time``)."""
    return (when or now_utc()).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(when: datetime | None = None) -> str:
    """``metav1.MicroTime`` (a Lease's renewTime)."""
    return (when or now_utc()).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class FakeNode:
    """One fake GPU node: what its kubelet and GPU feature discovery would report."""

    name: str
    gpus: int = 8
    product: str = "NVIDIA-H100-80GB-HBM3"
    gpu_memory_mib: int = 81559
    cpu: str = "128"
    memory: str = "1024Gi"
    max_pods: int = 256
    mig: Mapping[str, int] = field(default_factory=dict)  # {"1g.10gb": 7}: nvidia.com/mig-1g.10gb
    labels: Mapping[str, str] = field(default_factory=dict)

    def resources(self) -> dict[str, str]:
        res = {"cpu": self.cpu, "memory": self.memory, "pods": str(self.max_pods)}
        res[GPU] = str(self.gpus)
        for profile, count in self.mig.items():
            res[f"nvidia.com/mig-{profile}"] = str(count)
        return res

    def manifest(self) -> dict[str, Any]:
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "nvidia.com/gpu.product": self.product,
            "nvidia.com/gpu.memory": str(self.gpu_memory_mib),
            "nvidia.com/gpu.count": str(self.gpus),
            "type": "fake-kubelet",
            **self.labels,
        }
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": labels},
        }

    def status(self, ready: bool) -> dict[str, Any]:
        now = rfc3339()
        cond = {
            "type": "Ready",
            "status": "True" if ready else "False",
            "reason": "KubeletReady" if ready else "KubeletNotReady",
            "message": "fake kubelet is posting ready status"
            if ready
            else "fake kubelet stopped (set_ready(False))",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        res = self.resources()
        return {
            "status": {
                "capacity": res,
                "allocatable": res,
                "conditions": [cond],
                "addresses": [{"type": "Hostname", "address": self.name}],
                "nodeInfo": {
                    "machineID": "fake",
                    "systemUUID": "fake",
                    "bootID": "fake",
                    "kernelVersion": "fake",
                    "osImage": "fake",
                    "containerRuntimeVersion": "fake://1.0",
                    "kubeletVersion": "fake",
                    "kubeProxyVersion": "",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                },
            }
        }


def status_patch(
    phase: str, started: datetime, ready: bool, containers: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    now = rfc3339()
    flag = "True" if ready else "False"
    reason = None if ready else "PodCompleted"
    conditions = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": rfc3339(started)},
        {"type": "Initialized", "status": "True", "lastTransitionTime": rfc3339(started)},
        {"type": "ContainersReady", "status": flag, "lastTransitionTime": now, "reason": reason},
        {"type": "Ready", "status": flag, "lastTransitionTime": now, "reason": reason},
    ]
    statuses = [
        {
            "name": name,
            "ready": ready,
            "restartCount": 0,
            "image": "fake",
            "imageID": "fake",
            "containerID": f"fake://{name}",
            "started": ready,
            "state": state,
        }
        for name, state in containers.items()
    ]
    return {
        "status": {
            "phase": phase,
            "startTime": rfc3339(started),
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "conditions": conditions,
            "containerStatuses": statuses,
        }
    }


def gpu_nodes(
    count: int, gpus: int = 8, prefix: str = "gpu", rack_size: int = 32
) -> list[FakeNode]:
    """``count`` identical GPU nodes named ``prefix-000..``, ``rack_size`` to a rack label."""
    return shaped_gpu_nodes([gpus] * count, prefix, rack_size)


def shaped_gpu_nodes(
    counts: Sequence[int],
    prefix: str = "gpu",
    rack_size: int = 32,
    cpu_mem: Sequence[tuple[int, int]] = (),
) -> list[FakeNode]:
    """GPU nodes named ``prefix-000..``, node ``i`` with ``counts[i]`` GPUs (and ``cpu_mem[i]``:
    CPU in milli-cores and memory in MiB, where given), ``rack_size`` to a rack label (a
    heterogeneous cluster such as openb's: 8-, 4-, 2- and 1-GPU nodes)."""
    width = len(str(len(counts) - 1))
    nodes = []
    for i, gpus in enumerate(counts):
        node = FakeNode(
            f"{prefix}-{i:0{width}d}",
            gpus=gpus,
            labels={"gpufence.io/rack": f"rack-{i // rack_size}"},
        )
        if cpu_mem:
            cpu, mem = cpu_mem[i]
            node = replace(node, cpu=f"{cpu}m", memory=f"{mem}Mi")
        nodes.append(node)
    return nodes
