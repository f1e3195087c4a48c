"""Who makes a requeued job's next pods (kube/objects.py ``controller_of``): a pod's
controller, except that a JobSet's pod (Pod -> Job -> JobSet) names its JobSet, whose restarts
make new child Jobs."""

from __future__ import annotations

from lightkube.models.meta_v1 import ObjectMeta, OwnerReference

from gpufence.kube.objects import controller_of

JOBSET = {"jobset.sigs.k8s.io/jobset-name": "pretrain"}


def _meta(kind: str | None, labels: dict[str, str] | None = None) -> ObjectMeta:
    owners = (
        [OwnerReference(apiVersion="v1", kind=kind, name="x", uid="u-1", controller=True)]
        if kind
        else None
    )
    return ObjectMeta(name="p", namespace="ns", labels=labels, ownerReferences=owners)


def test_a_pod_names_its_controller_and_a_jobset_pod_its_jobset() -> None:
    assert controller_of(_meta(None)) == ""  # a bare pod: nothing makes it again
    assert controller_of(_meta("Job")) == "Job/u-1"
    assert controller_of(_meta("ReplicaSet")) == "ReplicaSet/u-1"
    # two restarts of a JobSet make Jobs of new uids: the JobSet is what stays
    assert controller_of(_meta("Job", JOBSET)) == "JobSet/ns/pretrain"
    # the label means a JobSet's Job only when a Job controls the pod
    assert controller_of(_meta(None, JOBSET)) == ""
    assert controller_of(_meta("ReplicaSet", JOBSET)) == "ReplicaSet/u-1"


def test_a_non_controller_owner_is_not_who_makes_the_pod_again() -> None:
    meta = _meta(None)
    meta.ownerReferences = [OwnerReference(apiVersion="v1", kind="Job", name="x", uid="u-2")]
    assert controller_of(meta) == ""
