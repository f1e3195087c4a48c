"""Every rule gpufence advises on: its id, its family, and what it catches (the README's list).

Spec rules read the cluster spec (plus a scenario's or the history's numbers where they need a
peak, an SLO or a gang size); live rules read what the control plane (or a simulated run) did.
"""

from __future__ import annotations

from typing import Final

# spec rules (gpufence validate / up / sim start-up)
SERVING_SHARES_PARTITION: Final = "serving-shares-partition"
MIG_NOT_A_FENCE: Final = "mig-not-a-fence"
SERVING_NO_FAILURE_MARGIN: Final = "serving-no-failure-margin"
LENDING_RECLAIM_SLOW: Final = "lending-reclaim-slow"
GANG_EXCEEDS_CAPACITY: Final = "gang-exceeds-capacity"
WRONG_SHAPE: Final = "wrong-shape"
PREEMPTS_NON_CHECKPOINTABLE: Final = "preempts-non-checkpointable"
QUOTA_BORROW_UNBOUNDED: Final = "quota-borrow-unbounded"
# live rules (gpufence advise, GET /v1/advice, a simulated run)
CHRONIC_PREEMPTION: Final = "chronic-preemption"
BATCH_IN_SERVING: Final = "batch-in-serving"
IDLE_INTERACTIVE: Final = "idle-interactive"
LENDING_LOSES_WORK: Final = "lending-loses-work"
FRAGMENTATION_STRANDING: Final = "fragmentation-stranding"

SPEC_RULES: Final[dict[str, str]] = {
    SERVING_SHARES_PARTITION: "a partition admits serving together with interactive, batch or "
    "training work",
    MIG_NOT_A_FENCE: "MIG slices are the only thing between serving and other classes",
    SERVING_NO_FAILURE_MARGIN: "the serving partition holds less than its peak plus one node's "
    "GPUs (needs a peak: scenario or history)",
    LENDING_RECLAIM_SLOW: "serving lends GPUs with a reclaim deadline not shorter than its SLO "
    "window (needs an SLO: the partition's slo or a scenario)",
    GANG_EXCEEDS_CAPACITY: "a queue admits, or the workload brings, gangs larger than the "
    "partition can ever hold",
    WRONG_SHAPE: "a contractual serving SLO beside training gangs that are a large fraction of "
    "the farm, with a fence that is not hardware",
    PREEMPTS_NON_CHECKPOINTABLE: "serving may preempt, or reclaim lent GPUs from, work that "
    "cannot checkpoint",
    QUOTA_BORROW_UNBOUNDED: "nominal quotas promise the whole partition and a queue may borrow "
    "without a limit",
}
LIVE_RULES: Final[dict[str, str]] = {
    CHRONIC_PREEMPTION: "incident preemptions on more than N of the last M days: the serving "
    "reserve is too small (with the size to give it and what it costs training)",
    BATCH_IN_SERVING: "serving-class jobs without an SLO that behave like batch (finish on "
    "their own after a long run, checkpoint, estimate their run time)",
    IDLE_INTERACTIVE: "interactive sessions that keep idle GPUs beyond what a reclaim policy "
    "allows (or where none reclaims them)",
    LENDING_LOSES_WORK: "lent GPUs reclaimed so often that borrowers lose most of the work done "
    "on them",
    FRAGMENTATION_STRANDING: "free GPUs scattered so that waiting gangs cannot be placed, for "
    "long periods",
}
RULES: Final[dict[str, str]] = {**SPEC_RULES, **LIVE_RULES}
