"""A pod's own node constraints on a real API server: a nodeSelector or required affinity that
amounts to GPU types is honoured exactly; one that every GPU node meets constrains nothing; one
that cuts across a GPU type is refused on the pod, naming it -- never dropped (the kubelet would
refuse the pod where gpufence put it)."""

from __future__ import annotations

import kobjects as k
from kenv import Env

A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"


def _exists(key: str) -> dict[str, object]:
    term = {"matchExpressions": [{"key": key, "operator": "Exists"}]}
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
            }
        }
    }


def test_k8s_pod_node_selector_on_gpu_product_is_honoured(env: Env) -> None:
    # best fit alone would put a 1-GPU pod on the 1-GPU H100 node
    env.node("training", gpus=1, product=H100)
    a100 = env.node("training", gpus=8, product=A100)
    env.start().wait_ready()
    pod = env.pod(gpus=1, spec={"nodeSelector": {"nvidia.com/gpu.product": A100}})
    assert env.bound(pod) == a100


def test_k8s_pod_node_constraint_every_node_meets_constrains_nothing(env: Env) -> None:
    small = env.node("training", gpus=1)
    env.node("training", gpus=8)
    env.start().wait_ready()
    pod = env.pod(gpus=1, spec=_exists("kubernetes.io/hostname"))
    assert env.bound(pod) == small


def test_k8s_pod_node_selector_cutting_across_a_gpu_type_is_refused(env: Env) -> None:
    ssd = env.node("training", gpus=8)
    k.ok(
        env.kc,
        "PATCH",
        f"/api/v1/nodes/{ssd}",
        {"metadata": {"labels": {"disk": "ssd"}}},
        content_type=k.MERGE,
    )
    env.node("training", gpus=8)
    env.start().wait_ready()
    bad = env.pod(gpus=1, spec={"nodeSelector": {"disk": "ssd"}})
    cond = k.wait("a rejection", lambda: k.scheduled_condition(k.get_pod(env.kc, env.ns, bad)))
    assert cond["reason"] == "gpufence/Rejected", cond
    assert "spec.nodeSelector disk=ssd selects 1 of the 2 GPU nodes" in cond["message"], cond
    assert "gpufence.io/partition" in cond["message"]
    assert not k.node_of(env.kc, env.ns, bad)
    none = env.pod(gpus=1, spec={"nodeSelector": {"disk": "nvme"}})
    cond = k.wait("a rejection", lambda: k.scheduled_condition(k.get_pod(env.kc, env.ns, none)))
    assert "selects none of the 2 GPU nodes" in cond["message"], cond
