"""A test's own corner of the shared API server: a scheduler name, nodes labelled for it, a
namespace, a fence file, and the scheduler processes it started."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

import kobjects as k
from cluster import KubeCluster
from scheduler_proc import SchedulerProc

FENCED = """
name: k8s-test
kubernetes: {{scheduler_name: {sched}}}
partitions:
  serving:
    node_selector: {{test.gpufence.io/run: {run}, gpufence.io/fence: serving}}
    admits: [serving]
  training:
    node_selector: {{test.gpufence.io/run: {run}, gpufence.io/fence: training}}
    admits: [training, batch]
queues:
  - {{name: online, partition: serving, tenant: ns-{run}}}
  - {{name: research, partition: training, tenant: ns-{run}}}
"""


@dataclass
class Env:
    kc: KubeCluster
    ns: str
    run: str
    sched: str
    config: Path
    tmp: Path
    procs: list[SchedulerProc]

    def node(self, fence: str = "training", gpus: int = 8, **kw: object) -> str:
        labels = {"test.gpufence.io/run": self.run, "gpufence.io/fence": fence}
        return k.gpu_node(
            self.kc, f"{self.run}-{fence}-{secrets.token_hex(2)}", gpus=gpus, labels=labels, **kw
        )  # type: ignore[arg-type]

    def pod(self, name: str | None = None, **kw: object) -> str:
        return k.pod(self.kc, self.ns, name, scheduler=self.sched, **kw)  # type: ignore[arg-type]

    def start(self, **kw: object) -> SchedulerProc:
        p = SchedulerProc(
            self.kc.kubeconfig, self.config, self.tmp / f"sched-{len(self.procs)}.log", **kw
        )  # type: ignore[arg-type]
        self.procs.append(p)
        return p

    def bound(self, pod: str, timeout: float = 20.0) -> str:
        return str(k.wait(f"{pod} bound", lambda: k.node_of(self.kc, self.ns, pod), timeout))
