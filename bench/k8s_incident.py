"""A serving surge in a full fence on a real kube-apiserver: gpufence's incident preemption
(notice, checkpoint, eviction) against kube-scheduler's PriorityClass preemption.

The cluster: ``--nodes`` fake 8-GPU nodes (tests/k8s/kubelet.py in its own process), the first
``--serving-nodes`` labelled ``gpufence.io/fence: serving`` and full of 2-GPU serving pods, the
rest ``gpufence.io/fence: training`` and full of training pods of 8, 4, 2 and 1 GPUs (each node
one of a few seeded mixes that sum to 8), about half of them checkpointable (seeded). Then the
surge: ``--surge-pods`` serving pods of 2 GPUs (16 GPUs by default) that the serving fence cannot
hold.

* gpufence (``gpufence k8s run``): the serving fence's policy is ``incident-only`` from
  ``training`` (budget 100 an hour, no minimum runtime, 120 s grace). Training pods are gpufence's
  own (it bound them, in waves of 8-, 4-, 2-, then 1-GPU pods so that they pack). A fake workload
  watches the training pods and, ``--checkpoint-s`` (30) after a ``gpufence.io/notice`` appears,
  copies it into ``gpufence.io/checkpointed`` (the README's PyTorch handshake: its checkpoint took
  that long); gpufence then evicts the pod and binds the serving pod.
* kube-scheduler (the default profile, the harness's build of the same release): the same pods
  on the same nodes (created with ``spec.nodeName`` from gpufence's layout), serving pods of a
  PriorityClass of 1000, training pods of 0; the surge pods may run on any node. Its preemption
  deletes the victims it picks; there is no notice, so a checkpointable victim checkpoints after
  SIGTERM, in its grace period.

Grace periods (``terminationGracePeriodSeconds``: how long a stopped container takes to exit, which
the fake kubelet waits in full): under kube-scheduler a checkpointable pod has ``--checkpoint-s``
(its checkpoint runs after SIGTERM), under gpufence 2 s (its checkpoint was written before the
eviction); a pod that cannot checkpoint has 2 s under both.

Figures: surge seconds = the surge pods' creation -> the last one seen Running; evicted GPUs =
the GPUs of training pods gone or terminating 3 s after that; the non-checkpointable pods among
them. Progress on stderr, a JSON line per scheduler, and last:

    demand_gpus=16 gpufence_evicted_gpus=… gpufence_surge_s=… kube_scheduler_evicted_gpus=…
    kube_scheduler_surge_s=… kube_scheduler_evicted_noncheckpointable=…

    PYTHONPATH=src python bench/k8s_incident.py          # ~4 min on 2 cores
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx2
from lightkube import ApiError
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

import k8s_common as kb

NS = "bench"
NOTICE, ACK = "gpufence.io/notice", "gpufence.io/checkpointed"
ROLE = "bench.gpufence.io/role"  # serving | training | surge
CKPT = "gpufence.io/checkpointable"
MERGE = "application/merge-patch+json"
SERVING_GPUS = 2
# the training nodes' mixes (GPUs of each pod; each sums to a node's 8)
MIXES = ((8,), (4, 4), (4, 2, 2), (2, 2, 2, 2), (4, 2, 1, 1), (2, 2, 2, 1, 1))
QUICK_GRACE_S = 2
CONFIG = """
name: incident-bench
partitions:
  serving:
    node_selector: {gpufence.io/fence: serving}
    admits: [serving]
    preemption: {mode: incident-only, from: [training], budget: 100, window_s: 3600,
                 min_runtime_s: 0, grace_s: 120}
  training:
    node_selector: {gpufence.io/fence: training}
    admits: [training, batch]
queues:
  - {name: online, partition: serving, tenant: bench}
  - {name: research, partition: training, tenant: bench}
"""


@dataclass
class BenchPod:
    name: str
    role: str  # serving | training | surge
    gpus: int
    checkpointable: bool = False
    node: str = ""  # where gpufence put it (the layout kube-scheduler's run starts from)


@dataclass
class Outcome:
    surge_s: float
    evicted_gpus: int
    evicted_pods: int
    evicted_noncheckpointable: int
    noticed: int = 0  # training pods the fake workload saw noticed
    last_notice_s: float | None = None  # the surge -> the last notice seen (gpufence)


def workload(args: argparse.Namespace) -> tuple[list[BenchPod], list[BenchPod], list[BenchPod]]:
    """Serving fill, training fill (largest first: the waves gpufence binds), the surge."""
    rng = random.Random(args.seed)
    per_node = 8 // SERVING_GPUS
    serving = [
        BenchPod(f"sv-{i:04d}", "serving", SERVING_GPUS)
        for i in range(args.serving_nodes * per_node)
    ]
    sizes = [g for _ in range(args.nodes - args.serving_nodes) for g in rng.choice(MIXES)]
    rng.shuffle(sizes)
    sizes.sort(reverse=True)
    training = [
        BenchPod(f"tr-{i:04d}", "training", g, checkpointable=rng.random() < 0.5)
        for i, g in enumerate(sizes)
    ]
    surge = [BenchPod(f"surge-{i:02d}", "surge", SERVING_GPUS) for i in range(args.surge_pods)]
    return serving, training, surge


def manifest(p: BenchPod, *, gpufence: bool, checkpoint_s: int) -> Pod:
    ann = {CKPT: "true" if p.checkpointable else "false", "gpufence.io/priority": "0"}
    labels = {ROLE: p.role}
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": "fake", "resources": {"limits": {kb.GPU: str(p.gpus)}}}
        ],
    }
    slow = p.checkpointable and not gpufence  # a checkpoint after SIGTERM, in the grace
    spec["terminationGracePeriodSeconds"] = checkpoint_s if slow else QUICK_GRACE_S
    if gpufence:
        spec["schedulerName"] = kb.GPUFENCE
        if p.role != "training":
            labels["gpufence.io/class"] = "serving"
    else:
        spec["schedulerName"] = kb.KUBE_SCHEDULER
        spec["priorityClassName"] = "training-low" if p.role == "training" else "serving-high"
        if p.node:
            spec["nodeName"] = p.node
    meta = {"name": p.name, "namespace": NS, "labels": labels, "annotations": ann}
    return cast(Pod, Pod.from_dict({"metadata": meta, "spec": spec}))


# ---- the fake workload: acks a notice after its checkpoint -----------------------------------


class FakeWorkload:
    """Watches the training pods; ``checkpoint_s`` after a pod's notice first shows, copies the
    notice's value into ``gpufence.io/checkpointed`` (what the README's snippet does)."""

    def __init__(self, lt: kb.LoopThread, checkpoint_s: float) -> None:
        self.lt, self.checkpoint_s = lt, checkpoint_s
        self.noticed: dict[str, float] = {}
        self.acked: dict[str, float] = {}
        self._task = asyncio.run_coroutine_threadsafe(self._watch(), lt.loop)

    def stop(self) -> None:
        self.lt.loop.call_soon_threadsafe(self._task.cancel)

    async def _watch(self) -> None:
        while True:
            try:
                async for _, pod in self.lt.client.watch(
                    Pod, namespace=NS, labels={ROLE: "training"}, server_timeout=600
                ):
                    self._seen(pod)
            except (ApiError, httpx2.HTTPError):
                await asyncio.sleep(0.2)

    def _seen(self, pod: Pod) -> None:
        meta = pod.metadata
        name = meta.name if meta is not None else None
        value = ((meta.annotations if meta is not None else None) or {}).get(NOTICE)
        if not name or not value or name in self.noticed:
            return
        self.noticed[name] = time.monotonic()
        self.lt.loop.call_later(
            self.checkpoint_s, lambda: asyncio.ensure_future(self._ack(name, value))
        )

    async def _ack(self, name: str, value: str) -> None:
        patch = {"metadata": {"annotations": {ACK: value}}}
        try:
            await self.lt.client.patch(Pod, name, patch, namespace=NS, patch_type=PatchType.MERGE)
            self.acked[name] = time.monotonic()
        except ApiError as e:
            kb.log(f"ack of {name} failed: {e}")


# ---- one run ----------------------------------------------------------------------------------


class Run:
    """A fresh API server with the fake kubelets of ``nodes`` nodes, fences labelled."""

    def __init__(self, work: Path, nodes: int, serving_nodes: int) -> None:
        self.kc = kb.start_cluster(work, gang_api=False)
        self.kubelet = kb.KubeletProcess(self.kc, nodes)
        names = [n.name for n in self.kubelet.nodes]
        self.serving_nodes, self.training_nodes = names[:serving_nodes], names[serving_nodes:]
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(self._label, names))
        self.lt = kb.LoopThread(self.kc.kubeconfig, "bench")
        kb.namespace(self.lt, NS)
        kb.namespace(self.lt, "gpufence-system")
        self.rec = kb.PodRecorder(self.lt, NS).start()
        self.proc: Any = None

    def _label(self, node: str) -> None:
        fence = "serving" if node in self.serving_nodes else "training"
        body = {"metadata": {"labels": {"gpufence.io/fence": fence}}}
        status, out = self.kc.request("PATCH", f"/api/v1/nodes/{node}", body, content_type=MERGE)
        assert status == 200, out

    def create(self, pods: Sequence[BenchPod], *, gpufence: bool, checkpoint_s: int) -> None:
        objs = [manifest(p, gpufence=gpufence, checkpoint_s=checkpoint_s) for p in pods]
        kb.create_objects(self.lt, objs)

    def running(self, pods: Sequence[BenchPod], what: str, timeout: float = 300) -> None:
        names = [p.name for p in pods]

        def ok(recs: dict[str, kb.PodRecord]) -> bool:
            return all((r := recs.get(n)) is not None and r.running_at is not None for n in names)

        if not self.rec.wait(what, ok, timeout):
            raise SystemExit(f"{what}: timed out ({self.rec.bound(names)}/{len(names)} bound)")

    def outcome(
        self, training: Sequence[BenchPod], surge: Sequence[BenchPod], t0: float
    ) -> Outcome:
        self.running(surge, "the surge Running", 600)
        last = max(self.rec.pods[p.name].running_at or 0.0 for p in surge)
        time.sleep(3)  # victims a preemption picked but the surge did not wait for show too
        status, body = self.kc.request(
            "GET", f"/api/v1/namespaces/{NS}/pods?labelSelector={ROLE}=training"
        )
        assert status == 200, body
        alive = {
            p["metadata"]["name"]
            for p in body["items"]
            if not p["metadata"].get("deletionTimestamp")
        }
        gone = [p for p in training if p.name not in alive]
        return Outcome(
            surge_s=round(last - t0, 2),
            evicted_gpus=sum(p.gpus for p in gone),
            evicted_pods=len(gone),
            evicted_noncheckpointable=sum(1 for p in gone if not p.checkpointable),
        )

    def close(self) -> None:
        kb.tear_down(self.proc, self.rec, self.kubelet, self.lt, self.kc)


def run_gpufence(args: argparse.Namespace, work: Path, pods: Any) -> Outcome:
    serving, training, surge = pods
    run = Run(work / "gpufence", args.nodes, args.serving_nodes)
    try:
        config = work / "cluster.yaml"
        config.write_text(CONFIG)
        run.proc = kb.start_gpufence(
            run.kc, config, work / "gpufence.log", extra=["--reason-delay", "0"]
        )
        run.create(serving, gpufence=True, checkpoint_s=args.checkpoint_s)
        run.running(serving, "the serving fence full")
        for size in (8, 4, 2, 1):  # largest first: they pack the training fence whole
            wave = [p for p in training if p.gpus == size]
            run.create(wave, gpufence=True, checkpoint_s=args.checkpoint_s)
            run.running(wave, f"the {size}-GPU training pods Running")
        for p in (*serving, *training):
            p.node = run.rec.pods[p.name].node or ""
        kb.log(f"gpufence: {len(serving)} serving and {len(training)} training pods Running")
        fake = FakeWorkload(run.lt, args.checkpoint_s)
        t0 = time.monotonic()
        run.create(surge, gpufence=True, checkpoint_s=args.checkpoint_s)
        out = run.outcome(training, surge, t0)
        fake.stop()
        out.noticed = len(fake.noticed)
        out.last_notice_s = round(max(fake.noticed.values(), default=t0) - t0, 2)
        return out
    finally:
        run.close()


def _priority_classes(kc: kb.KubeCluster) -> None:
    for name, value in (("serving-high", 1000), ("training-low", 0)):
        body = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
            "preemptionPolicy": "PreemptLowerPriority",
        }
        status, out = kc.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body)
        assert status == 201, out


def run_kube_scheduler(args: argparse.Namespace, work: Path, pods: Any) -> Outcome:
    serving, training, surge = pods
    run = Run(work / "kube", args.nodes, args.serving_nodes)
    try:
        _priority_classes(run.kc)
        # gpufence's layout, bound as it was (in the same waves: the same start-time order)
        run.create(serving, gpufence=False, checkpoint_s=args.checkpoint_s)
        for size in (8, 4, 2, 1):
            wave = [p for p in training if p.gpus == size]
            run.create(wave, gpufence=False, checkpoint_s=args.checkpoint_s)
        run.running([*serving, *training], "the layout Running")
        cfg = kb.write_kube_scheduler_config(work / "kube-scheduler.yaml", run.kc.kubeconfig)
        run.proc = kb.start_kube_scheduler(run.kc, cfg, gang_api=False)
        time.sleep(3)  # its informers synced
        t0 = time.monotonic()
        run.create(surge, gpufence=False, checkpoint_s=args.checkpoint_s)
        return run.outcome(training, surge, t0)
    finally:
        run.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--serving-nodes", type=int, default=20)
    ap.add_argument("--surge-pods", type=int, default=8, help=f"{SERVING_GPUS} GPUs each")
    ap.add_argument("--checkpoint-s", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpufence-incident-"))
    pods = workload(args)
    kb.log(f"calibration_ms={kb.calibration_ms():.0f}; work in {work}")
    results = {}
    for name, fn in (("gpufence", run_gpufence), ("kube_scheduler", run_kube_scheduler)):
        kb.log(f"{name}: starting")
        results[name] = fn(args, work, pods)
        print(json.dumps({"scheduler": name, **vars(results[name])}), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    g, ks = results["gpufence"], results["kube_scheduler"]
    demand = args.surge_pods * SERVING_GPUS
    print(
        f"demand_gpus={demand} gpufence_evicted_gpus={g.evicted_gpus} "
        f"gpufence_surge_s={g.surge_s:.1f} kube_scheduler_evicted_gpus={ks.evicted_gpus} "
        f"kube_scheduler_surge_s={ks.surge_s:.1f} "
        f"kube_scheduler_evicted_noncheckpointable={ks.evicted_noncheckpointable}"
    )
    return 0 if g.evicted_gpus == demand and g.evicted_noncheckpointable == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
