"""The operating wisdom the rules encode, quoted from the project's seed documents.

The advice texts quote these so that a reader sees the reason in the words platform teams use,
not only a threshold. Each constant is one sentence or two, verbatim.
"""

from __future__ import annotations

SPLIT_FIRST = (
    "The scheduler cannot keep a latency SLO and a 64-GPU all-reduce honest in the same "
    "partition. Split partitions first. Tune fairness second."
)
NOTEBOOKS = (
    "Interactive notebooks should not sit on the serving partition. They are closer to training: "
    "bursty, checkpoint-light, and socially sticky."
)
THIRD_PARTITION = (
    "A third interactive partition with reclaim is cheaper than explaining to product why a demo "
    "kernel moved p99."
)
EVAL = (
    "Offline eval looks like inference but behaves like training: it can wait, it can retry, and "
    "it should not steal replicas. If eval is in the serving queue, a leaderboard job will look "
    "like an outage."
)
MIG = (
    "MIG ... does not isolate a distributed training job from serving on the same node's NIC, "
    "PCIe, or storage path. Treat MIG as a seat-packing tool on the interactive or small-model "
    "partition, not as a substitute for a serving reservation."
)
RESERVE = (
    "Put online inference on a reserved partition sized for peak replicas plus a small failure "
    "margin."
)
HOPE = (
    "Preempting training to save serving is a backup, not a capacity plan. If you preempt "
    "nightly, you do not have an inference reservation. You have a hope."
)
CHRONIC = "Chronic preemption means the serving reservation is too small. Fix the reservation."
INCIDENT = (
    "Should we preempt training when inference latency rises? As an incident action, yes if the "
    "serving class is documented and training can checkpoint. As a daily plan, no."
)
WRONG_SHAPE = (
    "If inference SLO is contractual and training gang size is a large fraction of the farm, "
    "sharing one private cluster is a political compromise that will lose. Either buy a serving "
    "pool that training cannot borrow, or move training bursts to a separate exclusive "
    "environment."
)
FENCE_IN_HARDWARE = (
    "If the gang size and the replica set both need most of the farm, buy a fence in hardware, "
    "not in tickets."
)
RECLAIM_INTERACTIVE = "Reserve serving, reclaim interactive, and run gang training on what is left."
FRAGMENTATION = (
    "Fragmentation is the primary cost of spatial isolation: stranded MIG slices or whole GPUs "
    "that do not match queued job requirements leave capacity unused despite aggregate "
    "availability."
)


def quote(text: str) -> str:
    return f'"{text}"'
