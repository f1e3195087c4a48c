"""``gpufence k8s run``: one scheduler replica -- campaign for the lease, then schedule.

A replica that loses the lease exits (status 3) instead of scheduling beside the new leader;
its Deployment restarts it as a standby. SIGTERM releases the lease, so a rolling update hands
over at once instead of waiting the lease out.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from dataclasses import dataclass

from gpufence.kube.activity import ActivityFeed, PrometheusPoller
from gpufence.kube.api import KubeApi
from gpufence.kube.crd_status import StatusPublisher
from gpufence.kube.fences import FenceSpec
from gpufence.kube.http import make_app, serve
from gpufence.kube.leader import LeaderElector
from gpufence.kube.loop import KubeScheduler
from gpufence.kube.mig_configmap import MigConfigMap
from gpufence.kube.state_record import StateRecord
from gpufence.sched.holdings import partition_figures, queue_figures

log = logging.getLogger("gpufence.kube")

EXIT_LOST_LEASE = 3


@dataclass(frozen=True)
class RunOptions:
    kubeconfig: str | None
    http_host: str = "127.0.0.1"
    http_port: int = 10259
    leader_elect: bool = True
    identity: str = ""
    lease_namespace: str = "gpufence-system"
    lease_name: str = "gpufence-scheduler"
    lease_s: float = 15.0
    renew_s: float = 2.0
    reason_delay_s: float = 5.0
    prometheus_url: str = ""  # DCGM's GPU utilisation per pod, for idle reclaim ("": none)
    activity_interval_s: float = 30.0
    # the MIG manager's ConfigMap ("namespace/name"): each re-cut's config is written there
    # before its label (kube/mig_configmap.py); "": a pre-installed catalogue holds them
    mig_configmap: str = ""
    mig_config_settle_s: float = 70.0


def default_identity() -> str:
    return f"{socket.gethostname()}_{os.getpid()}"


def run_replica(fences: FenceSpec, opts: RunOptions) -> int:
    api = KubeApi(opts.kubeconfig)
    record = StateRecord(api, opts.lease_namespace, f"{opts.lease_name}-state")
    poller = (
        PrometheusPoller(opts.prometheus_url, opts.activity_interval_s)
        if opts.prometheus_url
        else None
    )
    mig_configs = None
    if opts.mig_configmap:
        namespace, _, name = opts.mig_configmap.partition("/")
        mig_configs = MigConfigMap(api, namespace, name, settle_s=opts.mig_config_settle_s)
    loop = KubeScheduler(
        api,
        fences,
        reason_delay_s=opts.reason_delay_s,
        state=record,
        activity=ActivityFeed(poller),
        mig_configs=mig_configs,
    )
    elector = None
    if opts.leader_elect:
        elector = LeaderElector(
            api,
            opts.lease_namespace,
            opts.lease_name,
            opts.identity or default_identity(),
            lease_s=opts.lease_s,
            renew_s=opts.renew_s,
        )
    serve(make_app(loop, elector), opts.http_host, opts.http_port)
    done = threading.Event()

    def _term(signum: int, frame: object) -> None:
        done.set()
        loop.stop.set()
        if elector is not None:
            elector.stop()

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    if elector is not None:
        threading.Thread(target=elector.run, name="leader", daemon=True).start()
        while not (elector.leading.is_set() or done.is_set()):
            elector.leading.wait(0.2)
        if done.is_set():
            return 0
        threading.Thread(target=_watch_lease, args=(elector, loop), daemon=True).start()
    log.info("scheduling pods with schedulerName %s", fences.names.scheduler_name)
    publisher = StatusPublisher(api, fences)
    threading.Thread(target=_publish, args=(loop, publisher), name="status", daemon=True).start()
    if poller is not None:
        poller.start()  # (the leader's: a standby has no sessions to reclaim)
    loop.run()
    if poller is not None:
        poller.stop.set()
    if elector is not None:
        if elector.lost.is_set():
            return EXIT_LOST_LEASE
        elector.stop()
        elector.release()
    api.close()
    return 0


def _publish(loop: KubeScheduler, publisher: StatusPublisher, every_s: float = 5.0) -> None:
    """Mirror who holds what into the Fence and Queue objects, off the scheduling thread."""
    while not loop.stop.wait(every_s):
        with loop.lock:
            core = loop.core
            if core is None:
                continue
            rows = partition_figures(core), queue_figures(core)
        try:
            publisher.publish(*rows)
        except Exception as exc:  # the status is for people; scheduling goes on
            log.warning("publishing fence status: %s", exc)


def _watch_lease(elector: LeaderElector, loop: KubeScheduler) -> None:
    elector.lost.wait()
    if not loop.stop.is_set():
        # not a clean stop: another replica may be leading already; leave at once, without
        # one more cycle (os._exit: no thread may write after this point)
        log.error("lease lost: exiting so that only the new leader schedules")
        os._exit(EXIT_LOST_LEASE)
