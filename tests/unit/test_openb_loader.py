"""openb (Alibaba GPU v2023) loader: real rows from fixtures (the full traces' counts are checked
by ``bench/trace_counts.py``, a benchmark, never by a test)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from gpufence.model.decisions import Bind
from gpufence.model.events import JobSubmitted
from gpufence.model.job import MILLI_PER_GPU, RequestKind
from gpufence.sched.scheduler import Scheduler, SchedulerConfig
from gpufence.sim.workloads.openb import (
    PARTITION,
    arrivals,
    build_cluster,
    load_nodes,
    load_pods,
    pod_job,
    resolve_csv,
    typical_counts,
)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "openb"


def test_fixture_rows_map_to_requests() -> None:
    pods = load_pods(FIXTURES / "pods.csv")
    kinds = Counter(
        "cpu" if p.num_gpu == 0 else "share" if p.sharing else f"whole{p.num_gpu}" for p in pods
    )
    assert kinds == {"cpu": 3, "share": 4, "whole1": 3, "whole8": 2, "whole2": 1}
    jobs = {p.name: pod_job(p, p.name) for p in pods}
    share = jobs["openb-pod-0001"]
    assert share.request.kind is RequestKind.FRACTION and share.request.milli == 460
    assert (share.cpu_milli, share.mem_mib) == (6000, 12288)
    assert jobs["openb-pod-0017"].request.gpus == 8
    cpu_only = jobs["openb-pod-0005"]
    assert cpu_only.request.kind is RequestKind.WHOLE and cpu_only.request.gpus == 0
    assert cpu_only.total_gpus == 0


def test_fixture_nodes_build_one_fractional_partition() -> None:
    nodes = load_nodes(FIXTURES / "nodes.csv")
    cluster = build_cluster(nodes, "fgd")
    assert [n.gpu_type for n in cluster.nodes] == ["G2", "T4", "P100", "G3", "V100M16"]
    assert len(cluster.gpus) == 26
    assert cluster.gpu_types["V100M16"].memory_mib == 16 * 1024
    part = cluster.partitions[PARTITION]
    assert part.placement == "fgd" and part.sharing == "fractional"


def test_gpu_spec_and_bad_rows(tmp_path: Path) -> None:
    f = tmp_path / "p.csv"
    f.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
        "a,1000,1024,1,500,V100M16|V100M32\nb,1000,1024,0,0,\n"
    )
    a, b = load_pods(f)
    assert a.gpu_spec == ("V100M16", "V100M32") and pod_job(a, "a").gpu_types == a.gpu_spec
    assert b.gpu_spec == () and b.spec().gpus == 0
    f.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\nc,1,1,2,500\n")
    with pytest.raises(ValueError, match="whole"):
        load_pods(f)
    f.write_text("name,cpu_milli,memory_mib\nc,1,1\n")
    with pytest.raises(ValueError, match="missing columns"):
        load_pods(f)


def test_cpu_only_pod_binds_without_gpus() -> None:
    cluster = build_cluster(load_nodes(FIXTURES / "nodes.csv"), "best-fit")
    sched = Scheduler(cluster, SchedulerConfig(validate=True))
    pods = {p.name: p for p in load_pods(FIXTURES / "pods.csv")}
    d = sched.step([JobSubmitted(pod_job(pods["openb-pod-0005"], "cpu"))], 0.0)
    (bind,) = [x for x in d if isinstance(x, Bind)]
    (a,) = bind.assignments
    assert a.gpus == ()
    assert sched.ledger.cpu_used[a.node] == 20000 and sched.ledger.pool_used[PARTITION] == 0


def test_arrivals_follow_the_tune_protocol() -> None:
    pods = load_pods(FIXTURES / "pods.csv")
    cap = 26 * MILLI_PER_GPU
    seq = arrivals(pods, 1.3, cap, seed=42)
    assert Counter(p.name for p in seq[: len(pods)]) == Counter(p.name for p in pods)
    total = sum(p.total_milli for p in seq)
    assert total <= 1.3 * cap
    assert seq == arrivals(pods, 1.3, cap, seed=42)
    assert seq != arrivals(pods, 1.3, cap, seed=43)


def test_resolve_csv_names_and_paths(tmp_path: Path) -> None:
    assert resolve_csv("pods", FIXTURES, "pod") == FIXTURES / "pods.csv"
    with pytest.raises(FileNotFoundError, match="known"):
        resolve_csv("nope", FIXTURES, "pod")


def test_typical_counts_cover_every_pod() -> None:
    pods = load_pods(FIXTURES / "pods.csv")
    assert sum(typical_counts(pods).values()) == len(pods)


def test_all_node_list_keeps_cpu_nodes_out_of_the_cluster() -> None:
    nodes = load_nodes(FIXTURES / "nodes_all.csv")  # real rows of openb_node_list_all_node.csv
    assert len(nodes) == 5 and sum(n.gpus == 0 for n in nodes) == 2
    cluster = build_cluster(nodes, "fgd")
    assert len(cluster.nodes) == 3 and len(cluster.gpus) == 12
