"""``gpufence k8s``: the scheduler on Kubernetes (``run``), its fence file (``validate``) and
who holds what (``status``, read from a replica's ``/v1/fences``). See docs/kubernetes.md."""

from __future__ import annotations

import json
import logging
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from gpufence.cli.k8s_mig_verbs import mig_config
from gpufence.spec import SpecError, format_spec_error

k8s_app = typer.Typer(help="Schedule pods on Kubernetes (a secondary scheduler, with fences).")

ConfigOpt = Annotated[
    Path,
    typer.Option("--config", metavar="FILE", help="the cluster YAML (partitions by node_selector)"),
]


def _fences(config: Path):  # type: ignore[no-untyped-def]
    from gpufence.kube.fences import load_fence_spec

    try:
        return load_fence_spec(config)
    except SpecError as exc:
        typer.echo(format_spec_error(exc), err=True)
        raise typer.Exit(2) from None


def _http(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise typer.BadParameter(
            f"{value!r}: give HOST:PORT, e.g. 127.0.0.1:10259", param_hint="--http"
        )
    return host, int(port)


def _prometheus(url: str) -> str:
    if url and not url.startswith(("http://", "https://")):
        raise typer.BadParameter(
            f"{url!r}: give the server's URL, e.g. http://prometheus:9090",
            param_hint="--prometheus",
        )
    return url


def _configmap(value: str) -> str:
    namespace, _, name = value.partition("/")
    if value and not (namespace and name and "/" not in name):
        raise typer.BadParameter(
            f"{value!r}: give NAMESPACE/NAME, e.g. gpu-operator/gpufence-mig-parted",
            param_hint="--mig-configmap",
        )
    return value


@k8s_app.command("run")
def run(
    config: ConfigOpt,
    kubeconfig: Annotated[
        str | None,
        typer.Option(
            metavar="FILE", help="kubeconfig file (default: in-cluster, then $KUBECONFIG)"
        ),
    ] = None,
    scheduler_name: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            help="schedule pods with this schedulerName (default: the file's "
            "kubernetes.scheduler_name, else gpufence)",
        ),
    ] = None,
    http: Annotated[
        str,
        typer.Option(
            metavar="HOST:PORT", help="where /healthz, /readyz, /metrics, /v1/fences and / answer"
        ),
    ] = "127.0.0.1:10259",
    leader_elect: Annotated[
        bool, typer.Option(help="campaign for a Lease; only the leader schedules")
    ] = True,
    identity: Annotated[
        str,
        typer.Option(metavar="NAME", help="this replica's name in the Lease (default host_pid)"),
    ] = "",
    lease_namespace: Annotated[
        str, typer.Option(metavar="NAMESPACE", help="where the leader-election Lease lives")
    ] = "gpufence-system",
    lease_name: Annotated[
        str, typer.Option(metavar="NAME", help="the Lease the replicas campaign for")
    ] = "gpufence-scheduler",
    lease_seconds: Annotated[
        float,
        typer.Option(min=2.0, metavar="SECONDS", help="a dead leader is replaced after this long"),
    ] = 15.0,
    reason_delay: Annotated[
        float,
        typer.Option(
            min=0.0,
            metavar="SECONDS",
            help="how long a pod waits before its pending reason is written",
        ),
    ] = 5.0,
    prometheus: Annotated[
        str,
        typer.Option(
            metavar="URL",
            help="Prometheus with NVIDIA's DCGM exporter: each pod's GPU utilisation, for idle "
            "reclaim of interactive pods (besides their gpufence.io/gpu-activity annotation)",
        ),
    ] = "",
    activity_interval: Annotated[
        float,
        typer.Option(min=1.0, metavar="SECONDS", help="how often --prometheus is asked"),
    ] = 30.0,
    mig_configmap: Annotated[
        str,
        typer.Option(
            metavar="NAMESPACE/NAME",
            help="the GPU operator MIG manager's ConfigMap (its migManager.config.name): each "
            "MIG re-cut's config is written there before the node is labelled, so nodes of any "
            "GPU count can be re-cut (default: none, configs come from a pre-installed "
            "catalogue: k8s mig-config)",
        ),
    ] = "",
    mig_config_settle: Annotated[
        float,
        typer.Option(
            min=0.0,
            metavar="SECONDS",
            help="after writing a new config into --mig-configmap, wait this long before the "
            "label: the MIG manager reads a mounted copy the kubelet refreshes on its sync "
            "period (1 min by default)",
        ),
    ] = 70.0,
) -> None:
    """Schedule every pod whose spec.schedulerName names this scheduler."""
    from dataclasses import replace

    from gpufence.kube.run import RunOptions, run_replica

    mig_configmap = _configmap(mig_configmap)
    fences = _fences(config)
    if scheduler_name:
        fences = replace(fences, names=replace(fences.names, scheduler_name=scheduler_name))
    host, port = _http(http)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    for noisy in ("httpx", "httpx2", "httpcore"):  # one line per request otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    opts = RunOptions(
        kubeconfig=kubeconfig,
        http_host=host,
        http_port=port,
        leader_elect=leader_elect,
        identity=identity,
        lease_namespace=lease_namespace,
        lease_name=lease_name,
        lease_s=lease_seconds,
        renew_s=max(0.5, min(2.0, lease_seconds / 5)),
        reason_delay_s=reason_delay,
        prometheus_url=_prometheus(prometheus),
        activity_interval_s=activity_interval,
        mig_configmap=mig_configmap,
        mig_config_settle_s=mig_config_settle,
    )
    from lightkube.core.exceptions import ConfigError

    try:
        code = run_replica(fences, opts)
    except ConfigError as exc:  # no kubeconfig, a bad one, not in a cluster
        typer.echo(f"error: cannot reach Kubernetes: {exc} (give --kubeconfig FILE)", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


@k8s_app.command("validate")
def validate(config: ConfigOpt) -> None:
    """Check a cluster YAML for Kubernetes (field, line and fix for each problem)."""
    fences = _fences(config)
    for p, sel in fences.selectors.items():
        shown = ", ".join(f"{k}={v}" for k, v in sel.items()) or "(every GPU node no other selects)"
        typer.echo(f"partition {p}: nodes labelled {shown}")
    typer.echo(f"ok: pods with schedulerName {fences.names.scheduler_name} are scheduled")


@k8s_app.command("status")
def status(
    url: Annotated[
        str, typer.Option(metavar="URL", help="a replica's HTTP address (k8s run --http)")
    ] = "http://127.0.0.1:10259",
    output: Annotated[
        str, typer.Option("-o", "--output", metavar="FORMAT", help="table or json")
    ] = "table",
) -> None:
    """Who holds what: each fence's GPUs (used, lent, borrowed) and pending jobs, per queue."""
    if output not in ("table", "json"):
        raise typer.BadParameter(f"{output!r}: give table or json", param_hint="-o")
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/v1/fences", timeout=10) as r:
            body = json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        typer.echo(
            f"error: cannot read {url}/v1/fences: {exc} (is a replica serving there? see "
            "--http of k8s run)",
            err=True,
        )
        raise typer.Exit(1) from None
    if output == "json":
        typer.echo(json.dumps(body, indent=2))
        return
    # piped: wide enough that no column is folded (a script greps the rows)
    console = Console() if sys.stdout.isatty() else Console(width=200)
    t = Table(
        "FENCE", "NODES", "GPUS", "USED", "LENT", "BORROWED", "RUNNING", "PENDING", "LARGEST GANG"
    )
    for f in body["fences"]:
        t.add_row(
            f["name"],
            str(f["nodes"]),
            str(f["capacity_gpus"]),
            f"{f['used_gpus']:g}",
            str(f["lent_gpus"]),
            str(f["borrowed_gpus"]),
            str(f["running"]),
            str(f["pending"]),
            str(f["largest_gang"]),
        )
    console.print(t)
    q = Table("QUEUE", "FENCE", "TENANT", "NOMINAL", "USED", "BORROWED", "RUNNING", "PENDING")
    for row in body["queues"]:
        nominal = "-" if row["nominal_gpus"] is None else f"{row['nominal_gpus']:g}"
        q.add_row(
            row["name"],
            row["partition"],
            row["tenant"] or "-",
            nominal,
            f"{row['used_gpus']:g}",
            f"{row['borrowed_gpus']:g}",
            str(row["running"]),
            str(row["pending"]),
        )
    console.print(q)
    for line in body.get("problems", []):
        console.print(f"[yellow]warning:[/] {line}")


k8s_app.command("mig-config")(mig_config)  # (cli/k8s_mig_verbs.py)
