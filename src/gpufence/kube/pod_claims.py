"""The scheduler loop's side of DRA (kube/dra.py holds the devices and claims): which pods wait
for their ResourceClaims and why, which bound pods' claims were released, and the claim writes
a bind carries.

Kept apart from the loop so that the loop only routes changes: a pod is seen through its claims
(``view``), a bind becomes the claim writes before it (``with_claims``), a pod that ends gives
its claims back once (``release``).
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufence.kube import names
from gpufence.kube.actions import Action, BindPod, ShowPending
from gpufence.kube.dra import DraBook
from gpufence.kube.dra_objects import observe_claim, observe_slice
from gpufence.kube.objects import ObservedPod


class PodClaims:
    def __init__(self) -> None:
        self.book = DraBook()  # ResourceSlices and ResourceClaims (kube/dra.py)
        self.waits: dict[str, str] = {}  # pod -> why its claims hold it back
        self._released: set[str] = set()  # pod uids whose claims were released

    def view(self, pod: ObservedPod) -> ObservedPod | None:
        """The pod with the GPUs its ResourceClaims ask for; None while it waits for a claim
        (the reason is shown on it meanwhile: ``waits``)."""
        view, why = self.book.view(pod)
        if why and not pod.node:
            self.waits[pod.key] = why
            return None
        self.waits.pop(pod.key, None)
        return view

    def release(self, pod: ObservedPod) -> list[Action]:
        """A bound pod with claims ended or went: the writes that release its reservations and
        free its devices with the core's GPUs, once (the claim controller does it too where it
        runs; the writes are read-modify-update, so the two never undo each other)."""
        if not (pod.claims and pod.node) or pod.uid in self._released:
            return []
        self._released.add(pod.uid)
        return list(self.book.releases(pod))

    def gone(self, pod: ObservedPod, ours: bool) -> list[Action]:
        """The pod is gone for good: nothing more to wait for or release after this."""
        self.waits.pop(pod.key, None)
        if not ours:
            return []
        out = self.release(pod)
        self._released.discard(pod.uid)
        return out

    def with_claims(self, a: Action, pods: dict[str, ObservedPod]) -> Action | str:
        """A bind of a pod with ResourceClaims carries their allocation: the GPUs the core
        chose, as the node's devices (kube/dra.py); a str: why it cannot (the bind fails)."""
        pod = pods.get(f"{a.namespace}/{a.pod}") if isinstance(a, BindPod) else None
        if pod is None or not pod.claims or not isinstance(a, BindPod):
            return a
        return self.book.claim_writes(a, pod)

    def held_by_others(self, ours: set[str]) -> dict[str, frozenset[int]]:
        """Node -> GPU indices that claims of pods not in ``ours`` (uids) hold."""
        return self.book.held_by_others(ours)

    def change(
        self, kind: str, objs: Iterable[object], *, deleted: bool, whole: bool, ours: set[str]
    ) -> tuple[bool, set[str] | None]:
        """A ResourceSlice or ResourceClaim change: whether the model needs a rebuild (the GPUs
        of nodes that publish only slices, or devices others allocated, changed), and the claim
        keys that arrived (None: every claim was read anew), for the pods waiting on them."""
        before = (self.book.shape(), self.held_by_others(ours))
        keys: set[str] | None = set()
        if kind == "resourceslice":
            self.book.take_slices(map(observe_slice, objs), deleted=deleted, whole=whole)
        else:
            got = self.book.take_claims(map(observe_claim, objs), deleted=deleted, whole=whole)
            keys = None if whole else got
        return (self.book.shape(), self.held_by_others(ours)) != before, keys

    def unblocked(self, pods: dict[str, ObservedPod], keys: set[str] | None) -> list[ObservedPod]:
        """The waiting pods whose claims are among ``keys`` (None: all of them)."""
        out = []
        for k in list(self.waits):
            pod = pods.get(k)
            if pod is not None and (keys is None or any(c in keys for c in claim_keys(pod))):
                out.append(pod)
        return out

    def shown(self, pods: dict[str, ObservedPod], due: float) -> list[ShowPending]:
        """Why each pod that waits for its claims (and is older than ``due``) waits."""
        return [
            ShowPending(pod.namespace, pod.name, names.CONDITION_REASON_PENDING, why)
            for key, why in self.waits.items()
            if (pod := pods.get(key)) is not None and pod.created <= due
        ]


def claim_keys(pod: ObservedPod) -> list[str]:
    return [f"{pod.namespace}/{c}" for _, c in pod.claims if c]
