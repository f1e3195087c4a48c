"""The names gpufence reads and writes on Kubernetes objects: labels, annotations, resources.

One place, so that docs/kubernetes.md, the front end and the tests agree. Every key a user sets
on a Pod starts with ``gpufence.io/``; the keys gpufence writes through a binding say what it
decided (the front end rebuilds its state from them after a restart: the API server is its
store).
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "gpufence.io/"

# -- set by users on Pods -------------------------------------------------------------------
LABEL_CLASS = PREFIX + "class"  # serving | training | interactive | batch
LABEL_QUEUE = PREFIX + "queue"
LABEL_PARTITION = PREFIX + "partition"
ANN_PRIORITY = PREFIX + "priority"
ANN_CHECKPOINTABLE = PREFIX + "checkpointable"
ANN_EST_RUNTIME = PREFIX + "est-runtime-s"
ANN_TIME_LIMIT = PREFIX + "time-limit-s"
ANN_GPU_FRACTION = PREFIX + "gpu-fraction"
ANN_GPU_MEMORY = PREFIX + "gpu-memory-mib"
ANN_GANG_NAME = PREFIX + "gang-name"
ANN_GANG_SIZE = PREFIX + "gang-size"

# every annotation a user may set, with what it holds (for errors naming the field and the fix)
USER_ANNOTATIONS = {
    ANN_PRIORITY: "an integer (higher goes first)",
    ANN_CHECKPOINTABLE: '"true" or "false"',
    ANN_EST_RUNTIME: "seconds, a positive number",
    ANN_TIME_LIMIT: "seconds, a positive number",
    ANN_GPU_FRACTION: "a share of one GPU, 0 < f < 1 (e.g. 0.25)",
    ANN_GPU_MEMORY: "MiB of GPU memory the share needs, a non-negative integer",
    ANN_GANG_NAME: "the gang's name, shared by its pods in one namespace",
    ANN_GANG_SIZE: "how many pods the gang has, an integer >= 1",
}

# -- written by gpufence through the binding (and read back at start-up) ---------------------
ANN_GPUS = PREFIX + "gpus"  # "0,1": the GPU indices on the node it planned for the pod
ANN_BOUND_PARTITION = PREFIX + "bound-partition"
ANN_LENT_FROM = PREFIX + "lent-from"
ANN_BOUND_AT = PREFIX + "bound-at"  # the core's clock at the bind (seconds since the epoch)
ANN_ATTEMPT = PREFIX + "attempt"
ANN_JOB = PREFIX + "job"  # the core's job id (a gang's pods share it)
ANN_GANG_PLAN = PREFIX + "gang-plan"  # "pod=node:gpus;..." the whole gang's placement
ANN_NOTICE = PREFIX + "notice"  # a preemption/reclaim notice: "reason deadline"
# -- set by the workload on its own pod ---------------------------------------------------------
# the acknowledgement of a notice: the workload copies the notice's value here once its
# checkpoint is written (a value that is not the current notice acknowledges nothing)
ANN_CHECKPOINTED = PREFIX + "checkpointed"
# GPU activity for idle reclaim, "<utilisation 0..1> <seconds since the epoch>": refreshed by a
# notebook's sidecar (kube/activity.py; DCGM through Prometheus is the other source)
ANN_GPU_ACTIVITY = PREFIX + "gpu-activity"

# -- set by JobSet (sigs.k8s.io/jobset) on its child Jobs' pods ----------------------------------
# the JobSet that owns the pod's Job: the controller that makes a requeued job's next pods
LABEL_JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"

# -- resources and node labels (NVIDIA's GPU operator and feature discovery) -----------------
RES_GPU = "nvidia.com/gpu"
RES_MIG_PREFIX = "nvidia.com/mig-"
NODE_GPU_PRODUCT = "nvidia.com/gpu.product"
NODE_GPU_MEMORY = "nvidia.com/gpu.memory"  # MiB per GPU
NODE_GPU_COUNT = "nvidia.com/gpu.count"
NODE_HOSTNAME = "kubernetes.io/hostname"
NODE_ZONE = "topology.kubernetes.io/zone"
# the GPU operator's MIG manager: the node's mig-parted config, and how applying it went
# (pending | rebooting | success | failed); gpufence's own record of the re-cut it asked for
NODE_MIG_CONFIG = "nvidia.com/mig.config"
NODE_MIG_STATE = "nvidia.com/mig.config.state"
ANN_MIG_RECUT = PREFIX + "mig-recut"

EVENT_COMPONENT = "gpufence-scheduler"
CONDITION_REASON_PENDING = "Unschedulable"
CONDITION_REASON_REJECTED = "gpufence/Rejected"


@dataclass(frozen=True, slots=True)
class KubeNames:
    """What an operator may rename: the scheduler's name, and the node labels that carry
    topology (clusters label racks and NVLink domains differently)."""

    scheduler_name: str = "gpufence"
    rack_label: str = PREFIX + "rack"
    nvlink_label: str = PREFIX + "nvlink-domains"  # sizes on the node joined by ".": "4.4"
    # the taints a node may carry and still take gpufence's pods (beyond the ones a pod tolerates)
    tolerated_taints: tuple[str, ...] = ()
