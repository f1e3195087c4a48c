"""The full public traces' counts, as the loaders read them (reads ../shared/traces).

The unit tests read small fixtures (tests/fixtures); this checks the loaders against the whole
files: request counts and spans of the Azure LLM and Stable Diffusion request traces, the DLRM
instance and replica counts, the PAI machine shapes, the Philly run-time distribution, the openb
pod and node lists. Exits 1 on a mismatch (or when the traces are absent); prints
``trace_checks_passed=N`` last.

    PYTHONPATH=src python bench/trace_counts.py
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gpufence.sim.workloads.openb import build_cluster, load_nodes, load_pods, typical_counts
from gpufence.sim.workloads.pai import load_pai_machines
from gpufence.sim.workloads.philly import philly_runtimes, sample_runtimes
from gpufence.sim.workloads.serving_traces import (
    load_azure_llm,
    load_dlrm_replicas,
    load_sd_requests,
    read_dlrm_instances,
)

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


class _Near:
    def __init__(self, value: float, tol: float) -> None:
        self.value, self.tol = value, tol

    def __eq__(self, other: object) -> bool:
        return isinstance(other, int | float) and abs(other - self.value) <= self.tol

    def __repr__(self) -> str:
        return f"{self.value} +- {self.tol}"


def check_azure_llm_counts() -> None:
    base = SHARED / "azure-llm-inference-2023"
    code = load_azure_llm(base / "AzureLLMInferenceTrace_code.csv")
    conv = load_azure_llm(base / "AzureLLMInferenceTrace_conv.csv")
    assert round(code.total_requests()) == 8819 and round(conv.total_requests()) == 19366
    assert code.duration_s <= 3600 and conv.duration_s <= 3600  # one hour, 60 s bins
    # code: long prompts, short answers; conv: the reverse -> conv requests cost more decode
    assert conv.service_s_mean > code.service_s_mean
    assert code.resampled(300.0).total_requests() == _Near(8819, 1e-6)


def check_sd_request_counts() -> None:
    path = SHARED / "alibaba-v2026-genai-sd-serving" / "lora_request_trace.csv.gz"
    every = load_sd_requests(path, only_succeeded=False)
    ok = load_sd_requests(path)
    assert round(every.total_requests()) == 26823 and round(ok.total_requests()) == 26392
    assert 22 * 86400 < every.duration_s < 24 * 86400  # ~23 days
    assert 28.0 < every.service_s_mean < 29.5  # README: exec_time mean 28.7 s


def check_dlrm_counts() -> None:
    path = SHARED / "alibaba-gpu-v2025-dlrm-serving" / "disaggregated_DLRM_trace.csv.gz"
    insts = read_dlrm_instances(path)
    assert len(insts) == 23871 and len({i.app_name for i in insts}) == 156
    hn = [i for i in insts if i.role == "HN"]
    assert len(hn) == 7386 and all(i.gpu_request == 1 for i in hn)
    assert sum(i.role == "CN" for i in insts) == 16485
    curves = load_dlrm_replicas(path)
    assert len(curves) == 156 and curves[0].name == "app_0" and curves[-1].name == "app_155"
    (total,) = load_dlrm_replicas(path, aggregate=True)
    assert total.at(0) == sum(i.creation_s == 0.0 for i in hn) == 3123
    assert total.peak() == 3414  # measured: peak GPU replicas over the ~31-day window
    assert sum(c.at(1e9) for c in curves) == sum(math.isinf(i.deletion_s) for i in hn)


def check_pai_machines() -> None:
    m = load_pai_machines(SHARED / "alibaba-gpu-v2020" / "pai_machine_spec.csv")
    assert m.n_machines == 1897 and m.n_gpus == 6742
    assert m.by_shape() == dict(P100x2=798, T4x2=497, MISCx8=280, V100M32x8=135, V100x8=104, CPU=83)
    assert list(m.by_shape())[:2] == ["P100x2", "T4x2"]  # most common first


def check_philly_runtimes() -> None:
    r = philly_runtimes(SHARED / "philly" / "philly_runtime_seconds.csv")
    assert r.size == 83154 and float(np.median(r)) == 1186.0
    assert float(r.mean()) == _Near(14613, 1) and float(r.max()) == 4628239.0
    draws = sample_runtimes(np.random.default_rng(0), 20000, r)
    assert 900 < float(np.median(draws)) < 1500


def check_openb_default_counts() -> None:
    trace = SHARED / "alibaba-gpu-v2023"
    pods = load_pods(trace / "openb_pod_list_default.csv")
    assert len(pods) == 8152
    assert sum(p.num_gpu == 0 for p in pods) == 1088
    assert sum(p.sharing for p in pods) == 3078
    assert sum(p.num_gpu == 8 for p in pods) == 44
    assert sum(p.total_milli for p in pods) == 6_086_800
    nodes = load_nodes(trace / "openb_node_list_gpu_node.csv")
    assert len(nodes) == 1213 and sum(n.gpus for n in nodes) == 6212
    assert sum(typical_counts(pods).values()) == 8152


def check_openb_all_node_list() -> None:
    nodes = load_nodes(SHARED / "alibaba-gpu-v2023" / "openb_node_list_all_node.csv")
    assert len(nodes) == 1523 and sum(n.gpus == 0 for n in nodes) == 310
    assert len(build_cluster(nodes, "fgd").nodes) == 1213


CHECKS: list[Callable[[], None]] = [
    check_azure_llm_counts,
    check_sd_request_counts,
    check_dlrm_counts,
    check_pai_machines,
    check_philly_runtimes,
    check_openb_default_counts,
    check_openb_all_node_list,
]


def main() -> int:
    if not SHARED.is_dir():
        print(f"trace_counts: {SHARED} not found (the shared traces)", file=sys.stderr)
        return 1
    failed = 0
    for check in CHECKS:
        t0 = time.perf_counter()
        try:
            check()
            print(f"ok    {check.__name__} ({time.perf_counter() - t0:.1f} s)")
        except AssertionError as exc:
            failed += 1
            print(f"FAIL  {check.__name__}: {exc!r}")
    print(f"trace_checks_passed={len(CHECKS) - failed} of {len(CHECKS)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
