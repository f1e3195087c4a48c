"""Failover of gpufence on Kubernetes: kill -9 the leading replica while pods are pending.

A fresh etcd + kube-apiserver on 127.0.0.1 (tests/k8s/harness), ``--nodes`` fake 8-GPU nodes,
two ``gpufence k8s run`` replicas with leader election (``--lease-seconds``). It creates
``--pods`` one-GPU pods, kills the leader with SIGKILL as soon as its first binds land (so most
pods are still pending, some binds may be in flight), and measures:

- takeover_s: SIGKILL -> the standby's first bind (a pod's bound-at note written by it);
- bound_twice: pods whose placement note changed after the kill (a second bind would change
  it; the API server also refuses a second bind of one pod with 409) -- must be 0;
- lost: waiting pods never bound once the room is there, or pods gone -- must be 0.

The cluster is first filled with running pods (nodes x 8), then ``--pods`` more are created and
wait; the leader is killed and, at once, that many running pods end: the standby must take
over, restore who holds what from the pods' notes, and bind the waiting pods into the room
(never onto GPUs still held: gpu_overlaps counts any).

Prints, last: takeover_s=T bound_twice=N lost=N pending_at_kill=P lease_s=L
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "k8s"))

import kobjects as k  # noqa: E402
from cluster import KubeCluster  # noqa: E402
from scheduler_proc import SchedulerProc  # noqa: E402

CONFIG = """
name: failover
partitions:
  training: {node_selector: {}, admits: [training]}
queues:
  - {name: default, partition: training, tenant: bench}
"""


def _bin_dir() -> Path:
    import subprocess

    out = subprocess.run(
        ["bash", str(ROOT / "tests/k8s/harness/build.sh")],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def _notes(kc: KubeCluster, ns: str) -> dict[str, str]:
    """pod -> its bound-at note ("" while unbound)."""
    return {
        p["metadata"]["name"]: (p["metadata"].get("annotations") or {}).get(
            "gpufence.io/bound-at", ""
        )
        for p in k.pods(kc, ns)
    }


def _overlaps(kc: KubeCluster, ns: str) -> int:
    """GPUs given to two live pods at once (from the placement notes): must be 0."""
    seen: dict[tuple[str, int], str] = {}
    clashes = 0
    for p in k.pods(kc, ns):
        if p.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        plan = (p["metadata"].get("annotations") or {}).get("gpufence.io/gang-plan")
        for member in json.loads(plan) if plan else ():
            if member["pod"] != p["metadata"]["name"]:
                continue
            for g in member["gpus"]:
                clashes += (member["node"], g) in seen
                seen[(member["node"], g)] = p["metadata"]["name"]
    return clashes


def _all_bound(kc: KubeCluster, ns: str, pods: list[str]) -> bool:
    notes = _notes(kc, ns)  # one list, not one per pod
    return all(notes.get(p) for p in pods)


def _create(kc: KubeCluster, ns: str, prefix: str, n: int) -> list[str]:
    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(lambda i: k.pod(kc, ns, f"{prefix}-{i:05d}", gpus=1), range(n)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=250)
    ap.add_argument("--pods", type=int, default=2000, help="pending when the leader dies")
    ap.add_argument("--lease-seconds", type=float, default=15.0)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpufence-failover-"))
    config = work / "cluster.yaml"
    config.write_text(CONFIG)
    capacity = args.nodes * 8
    with KubeCluster(_bin_dir(), work / "k8s") as kc:
        ns = k.namespace(kc, "bench")
        k.namespace(kc, "gpufence-system")
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: k.gpu_node(kc, f"node-{i:04d}"), range(args.nodes)))
        lease = ["--lease-seconds", str(args.lease_seconds)]
        leader = SchedulerProc(
            kc.kubeconfig, config, work / "a.log", leader_elect=True, identity="a", extra=lease
        )
        leader.wait_ready(60)
        standby = SchedulerProc(
            kc.kubeconfig, config, work / "b.log", leader_elect=True, identity="b", extra=lease
        )
        k.wait("the standby", lambda: standby.readyz()[0] == 503, 60)
        # the cluster full of running pods, then --pods more that must wait
        fillers = _create(kc, ns, "run", capacity)
        k.wait(
            "the fillers bound",
            lambda: sum(1 for n in _notes(kc, ns).values() if n) >= capacity,
            300,
            0.5,
        )
        waiting = _create(kc, ns, "wait", args.pods)
        time.sleep(2)
        before = {p: n for p, n in _notes(kc, ns).items() if n}
        leader.kill()
        killed = time.time()
        with ThreadPoolExecutor(16) as pool:  # the running pods end: room for the waiting ones
            list(pool.map(lambda p: k.set_phase(kc, ns, p, "Succeeded"), fillers[: args.pods]))
        first_bind = k.wait(
            "the standby's first bind",
            lambda: min(
                (float(n) for n in _notes(kc, ns).values() if n and float(n) > killed), default=0
            ),
            args.lease_seconds * 4 + 60,
            every=0.05,
        )
        k.wait("every waiting pod bound", lambda: _all_bound(kc, ns, waiting), 300, 0.5)
        time.sleep(2)
        after = _notes(kc, ns)
        clashes = _overlaps(kc, ns)
        standby.stop()
    bound_twice = sum(1 for p, n in before.items() if after.get(p) != n) + clashes
    lost = sum(1 for p in waiting if not after.get(p)) + (len(fillers) + len(waiting) - len(after))
    print(
        json.dumps(
            {
                "takeover_s": round(first_bind - killed, 2),
                "bound_twice": bound_twice,
                "gpu_overlaps": clashes,
                "lost": lost,
                "pending_at_kill": args.pods,
                "bound_before_kill": len(before),
            }
        )
    )
    print(
        f"takeover_s={first_bind - killed:.2f} bound_twice={bound_twice} lost={lost} "
        f"pending_at_kill={args.pods} lease_s={args.lease_seconds:g}"
    )
    return 0 if bound_twice == 0 and lost == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
