"""Loaders for public serving traces: request-rate curves and replica-count curves.

Every loader reads plain or gzip files (detected by content) and raises ``ValueError`` naming
the file, the line and the column of a bad cell or a missing column.

``load_azure_llm`` — Azure LLM inference trace 2023 (Splitwise, ISCA'24), one row per request.
    Source: github.com/Azure/AzurePublicDataset ``data/AzureLLMInferenceTrace_{code,conv}.csv``,
    CC BY 4.0; cite Patel et al., "Splitwise", ISCA 2024.
    Columns used: ``TIMESTAMP`` (``2023-11-16 18:17:03.9799600``, naive, 100 ns digits),
    ``ContextTokens``, ``GeneratedTokens``.
    Assumptions: times are made relative to the first request (the trace is one hour); the
    service time of a request on one serving slot is the linear Llumnix/DistServe form
    ``overhead + prefill_s_per_token * context + decode_s_per_token * generated`` (research
    contention.md §3.2 / §4.4) with defaults for one H100 replica of a ~7–13B model (below).

``load_sd_requests`` — Alibaba cluster-trace-v2026-GenAI (SoCC'25 "Understanding Diffusion Model
    Serving in Production", FlexPipe EuroSys'26) ``lora_request_trace.csv(.gz)``.
    Source: github.com/alibaba/clusterdata ``cluster-trace-v2026-GenAI/``; no licence stated
    (Alibaba: research/study use); cite the SoCC'25 paper.
    Columns used: ``gmt_create`` (request time, second resolution), ``exec_time_seconds``,
    ``predict_status`` (SUCCEED / FAILED / PENDING / PROCESSING).
    Assumptions: with ``only_succeeded`` only SUCCEED rows count as demand; the service time
    is ``exec_time_seconds`` (model-switch costs are inside it); rows whose exec time is 0
    (PENDING: never executed) count as arrivals but not in the service-time moments.

``load_dlrm_replicas`` — Alibaba cluster-trace-gpu-v2025 (NSDI'25 "GPU-Disaggregated Serving for
    Deep Learning Recommendation Models at Scale") ``disaggregated_DLRM_trace.csv(.gz)``.
    Source: github.com/alibaba/clusterdata ``cluster-trace-gpu-v2025/``; no licence stated
    (research/study use); cite the paper.
    Columns used: ``instance_sn``, ``role`` (CN = CPU-node instance, HN = GPU-node instance),
    ``app_name``, ``gpu_request``, ``creation_time``, ``deletion_time`` (s from trace start).
    Assumptions: only GPU replicas (``gpu_request > 0``, i.e. role HN) are demand; an empty
    ``creation_time`` means created before the window (t = 0), an empty ``deletion_time`` means
    alive past its end (the replica never leaves); a replica is wanted from creation (not from
    ``scheduled_time``) to deletion; ``gpu_request`` is whole GPUs per replica.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpufence.sim.workloads.demand import (
    ReplicaDemand,
    RequestDemand,
    parse_count,
    parse_datetime_s,
    parse_float,
    read_csv,
)

# Service-time defaults for one H100-80GB replica serving a ~7–13B dense model in FP16/BF16 with
# continuous batching (vLLM-style). These are ASSUMPTIONS derived from hardware limits, not
# measurements [I]; override them with profiled values when available:
# * prefill: a 13B model costs ~2 * 13e9 = 26 GFLOP per prompt token; at ~26% of the H100's
#   989 TFLOP/s dense BF16 (~260 TFLOP/s effective) that is ~1e-4 s/token (~10k tokens/s).
# * decode: each step streams the 26 GB of weights from 3.35 TB/s HBM3 (~7.8 ms lower bound);
#   with KV-cache reads and kernel/scheduling overheads a time per output token of ~15 ms.
# * overhead: tokenisation, scheduling and network per request, ~20 ms.
# Linear form as in Llumnix (prefill(L) = a*L + b, decode per step) and DistServe's M/D/1 prefill
# analysis (Zhong et al., DistServe, OSDI'24, arXiv 2401.09670 §3.1).
PREFILL_S_PER_TOKEN = 1.0e-4
DECODE_S_PER_TOKEN = 0.015
OVERHEAD_S = 0.02

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
SD_COLUMNS = ("gmt_create", "exec_time_seconds", "predict_status")
DLRM_COLUMNS = ("instance_sn", "role", "app_name", "gpu_request", "creation_time", "deletion_time")


def _stem(path: str | Path) -> str:
    name = Path(path).name
    for suffix in (".gz", ".csv"):
        name = name.removesuffix(suffix)
    return name


def load_azure_llm(
    path: str | Path,
    bin_s: float = 60.0,
    prefill_s_per_token: float = PREFILL_S_PER_TOKEN,
    decode_s_per_token: float = DECODE_S_PER_TOKEN,
    overhead_s: float = OVERHEAD_S,
    name: str | None = None,
) -> RequestDemand:
    """Request-rate curve of an Azure LLM inference trace (code or conv)."""
    for label, v in (
        ("prefill_s_per_token", prefill_s_per_token),
        ("decode_s_per_token", decode_s_per_token),
        ("overhead_s", overhead_s),
    ):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{label} must be finite and >= 0, got {v}")
    arrivals: list[float] = []
    service: list[float] = []
    for line, row in read_csv(path, AZURE_COLUMNS):
        arrivals.append(parse_datetime_s(path, line, row, "TIMESTAMP"))
        context = parse_count(path, line, row, "ContextTokens")
        generated = parse_count(path, line, row, "GeneratedTokens")
        service.append(overhead_s + prefill_s_per_token * context + decode_s_per_token * generated)
    if not arrivals:
        raise ValueError(f"{path}: no requests")
    return RequestDemand.from_arrivals(
        name or _stem(path), arrivals, service, bin_s, source=f"azure-llm-2023:{Path(path).name}"
    )


def load_sd_requests(
    path: str | Path, bin_s: float = 60.0, only_succeeded: bool = True, name: str | None = None
) -> RequestDemand:
    """Request-rate curve of the Alibaba v2026 Stable-Diffusion (LoRA) request trace."""
    arrivals: list[float] = []
    service: list[float] = []
    for line, row in read_csv(path, SD_COLUMNS):
        status = row["predict_status"]
        if only_succeeded and status != "SUCCEED":
            continue
        arrivals.append(parse_datetime_s(path, line, row, "gmt_create"))
        if row["exec_time_seconds"] == "" and status != "SUCCEED":
            continue
        exec_s = parse_float(path, line, row, "exec_time_seconds")
        if exec_s < 0:
            raise ValueError(f"{path}:{line}: column exec_time_seconds: negative {exec_s}")
        if exec_s > 0:
            service.append(exec_s)
    if not arrivals:
        raise ValueError(
            f"{path}: no requests" + (" with status SUCCEED" if only_succeeded else "")
        )
    return RequestDemand.from_arrivals(
        name or _stem(path),
        arrivals,
        service,
        bin_s,
        source=f"alibaba-v2026-genai:{Path(path).name}",
    )


@dataclass(frozen=True, slots=True)
class DlrmInstance:
    """One row of the v2025 DLRM trace (times in s from the trace start)."""

    instance_sn: str
    role: str
    app_name: str
    gpu_request: int
    creation_s: float  # 0.0 when created before the window
    deletion_s: float  # inf when still alive at its end


def read_dlrm_instances(path: str | Path) -> list[DlrmInstance]:
    """Every instance (CN and HN) of the v2025 DLRM trace, in file order."""
    out: list[DlrmInstance] = []
    for line, row in read_csv(path, DLRM_COLUMNS):
        created = parse_float(path, line, row, "creation_time", empty=0.0)
        deleted = parse_float(path, line, row, "deletion_time", empty=math.inf)
        if deleted < created:
            raise ValueError(
                f"{path}:{line}: column deletion_time: {deleted} is before creation_time {created}"
            )
        if not row["app_name"]:
            raise ValueError(f"{path}:{line}: column app_name: empty")
        out.append(
            DlrmInstance(
                row["instance_sn"],
                row["role"],
                row["app_name"],
                parse_count(path, line, row, "gpu_request"),
                max(created, 0.0),
                deleted,
            )
        )
    return out


def _natural_key(text: str) -> tuple[tuple[int, str], ...]:
    return tuple((int(p), "") if p.isdigit() else (-1, p) for p in re.split(r"(\d+)", text) if p)


def load_dlrm_replicas(
    path: str | Path, app: str | None = None, aggregate: bool = False
) -> list[ReplicaDemand]:
    """GPU replicas alive over time, one curve per app (``app_0``, ``app_1``, ... order).

    ``app`` keeps one app (``ValueError`` if it has no GPU replicas); ``aggregate`` returns a
    single curve summed over the selected apps, named ``"all"`` (or the app's name).
    """
    by_app: dict[str, list[DlrmInstance]] = {}
    for inst in read_dlrm_instances(path):
        if inst.gpu_request > 0 and (app is None or inst.app_name == app):
            by_app.setdefault(inst.app_name, []).append(inst)
    if not by_app:
        raise ValueError(f"{path}: no GPU replicas" + (f" for app {app!r}" if app else ""))
    source = f"alibaba-v2025-dlrm:{Path(path).name}"
    curves: list[ReplicaDemand] = []
    for app_name in sorted(by_app, key=_natural_key):
        insts = by_app[app_name]
        gpus = {i.gpu_request for i in insts}
        if len(gpus) != 1:
            raise ValueError(
                f"{path}: app {app_name} mixes gpu_request values {sorted(gpus)} across replicas"
            )
        curves.append(
            ReplicaDemand.from_intervals(
                app_name,
                np.array([i.creation_s for i in insts]),
                np.array([i.deletion_s for i in insts]),
                gpus.pop(),
                source,
            )
        )
    if aggregate:
        return [ReplicaDemand.combined(curves, app if app is not None else "all")]
    return curves
