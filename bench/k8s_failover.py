"""Failover of gpufence on a real kube-apiserver: two replicas with leader election (a
coordination.k8s.io Lease); ``kill -9`` of the active one while ~2,000 pods are pending.

Steps (fresh etcd + kube-apiserver, fake nodes from tests/k8s/kubelet.py):
1. ``--pods`` pods (1-8 GPUs, the throughput benchmark's mix, each running 1-3 s) are created
   while no replica runs: all pending (2,200 on 50 x 8 GPUs: the leader's first cycle binds
   what fits, ~200, so ~2,000 are pending when it dies);
2. replica A starts and is waited on until it leads (/readyz 200), then replica B (standby,
   /readyz 503);
3. as soon as the first of A's binds is seen, A gets SIGKILL (the pending count is printed);
4. the run waits until every pod is bound (or ``--timeout``).

Figures:
* takeover_s: kill -> the first bind seen whose placement note (``gpufence.io/bound-at``, the
  deciding core's clock) is later than the kill, i.e. the standby's first bind;
* bound_twice: binds onto GPU indices another active pod on that node still held (from the
  ``gpufence.io/gpus`` notes, checked in the watch's resourceVersion order) plus pods seen on a
  second node; must be 0;
* lost: pods never bound by the end; must be 0.

The lease is ``--lease-seconds`` (gpufence's default, 15 s, unless set): a standby takes over
once the dead leader's lease has run out, so takeover_s is about that plus one cycle.

    PYTHONPATH=src python bench/k8s_failover.py --quick      # 20 nodes, 500 pods
    PYTHONPATH=src python bench/k8s_failover.py              # 50 nodes, 2,200 pods

Figures last on stdout: ``takeover_s=... bound_twice=... lost=...``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import k8s_common as kb
from k8s_throughput import workload

NAMESPACE = "bench"


def _readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://{kb.LOOPBACK}:{port}/readyz", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def _wait_readyz(port: int, want: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _readyz(port) != want:
        if time.monotonic() > deadline:
            raise SystemExit(f"replica on :{port} did not answer /readyz {want} in {timeout}s")
        time.sleep(0.1)


def run(args: argparse.Namespace, work: Path) -> tuple[float, int, int, int]:
    kc = kb.start_cluster(work, gang_api=False)
    lt = kb.LoopThread(kc.kubeconfig, "bench-client")
    kubelet: kb.KubeletProcess | None = None
    rec: kb.PodRecorder | None = None
    procs = []
    try:
        kubelet = kb.KubeletProcess(kc, args.nodes)
        kb.namespace(lt, NAMESPACE)
        kb.namespace(lt, "gpufence-system")  # the Lease's (deploy/ creates it in a cluster)
        rec = kb.PodRecorder(lt, NAMESPACE).start()
        specs = workload(args.pods, args.seed, gang_share=0.0)
        objs = [
            kb.pod_object(s, NAMESPACE, kb.GPUFENCE, gang_api=False, labels={"bench": "fo"})
            for s in specs
        ]
        kb.create_objects(lt, objs)
        kb.log(f"{len(objs)} pending pods created")
        cfg = kb.write_gpufence_config(work / "cluster.yaml")
        lease = ["--lease-seconds", f"{args.lease_seconds:g}"]
        ports = [kb.free_port(), kb.free_port()]
        for i, port in enumerate(ports):
            procs.append(
                kb.start_gpufence(
                    kc,
                    cfg,
                    work / "logs" / f"gpufence-{i}.log",
                    leader_elect=True,
                    identity=f"replica-{i}",
                    extra=lease,
                    port=port,
                )
            )
            _wait_readyz(port, 200 if i == 0 else 503, 60)
        kb.log("replica-0 leads, replica-1 stands by")
        rec.wait("the leader's first bind", lambda _p: rec.bound() > 0, 120)
        procs[0].kill()
        killed_epoch, killed = time.time(), time.monotonic()
        procs[0].wait()
        pending = len(specs) - rec.bound()
        kb.log(f"replica-0 killed (SIGKILL) with {pending} pods pending")
        names = [s.name for s in specs]
        rec.wait("all bound", lambda pods: all(pods[n].node for n in names), args.timeout)
        after = [
            r.bound_at
            for r in rec.pods.values()
            if r.bound_at is not None and r.decided_at is not None and r.decided_at > killed_epoch
        ]
        takeover = min(after) - killed if after else float("nan")
        lost = sum(1 for n in names if rec.pods[n].node is None)
        return takeover, rec.double_booked + rec.rebinds, lost, pending
    finally:
        for p in procs:
            kb.stop(p)
        if rec is not None:
            rec.stop()
        if kubelet is not None:
            kb.log(f"kubelet: {kubelet.stop()}")
        lt.close()
        kc.close()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    # 50 x 8 GPUs take ~180 pods at once: ~2,000 are still pending when the leader dies
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--pods", type=int, default=2200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lease-seconds", type=float, default=15.0)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--quick", action="store_true", help="20 nodes, 500 pods")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.pods = 20, 500
    work = Path(tempfile.mkdtemp(prefix="k8s-fo-"))
    try:
        takeover, twice, lost, pending = run(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(
        f"pending at the kill: {pending}; lease {args.lease_seconds:g}s;"
        f" calibration_ms={kb.calibration_ms():.0f}"
    )
    print(f"takeover_s={takeover:.2f} bound_twice={twice} lost={lost}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
