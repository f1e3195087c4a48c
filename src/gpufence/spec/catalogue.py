"""GPU types a spec may name (built-ins + declared ones) and MIG layout checks against them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from gpufence.model.hardware import GpuType
from gpufence.model.mig import MIG_CATALOGUE, MigError, mig_models, plan_layout, profiles_for
from gpufence.model.mig import validate_layout as validate_mig_layout
from gpufence.spec.errors import SpecIssue, name_list, suggest
from gpufence.spec.schema import GpuTypeSchema

# nvlink_gbps is per-GPU aggregate NVLink bandwidth in Gbit/s (NVIDIA's GB/s figure x 8), so it is
# in the same unit as the fabric's node/rack uplinks (a "400G" NIC = 400 Gbit/s). 0 = PCIe only.
# Figures are the SXM parts' datasheet totals: V100 300 GB/s (NVLink 2), A100 600 GB/s (NVLink 3),
# H100/H200 900 GB/s (NVLink 4). Memory is the marketed size in GiB, matching the MIG catalogue's
# model names; mig_model is the key into gpufence.model.mig.MIG_CATALOGUE.
_BUILTIN: tuple[GpuType, ...] = (
    GpuType("A100-40GB", 40, mig_model="A100-40GB", nvlink_gbps=4800),
    GpuType("A100-80GB", 80, mig_model="A100-80GB", nvlink_gbps=4800),
    GpuType("H100-80GB", 80, mig_model="H100-80GB", nvlink_gbps=7200),
    GpuType("H200-141GB", 141, mig_model="H200-141GB", nvlink_gbps=7200),
    # Not MIG-capable: whole, fractional or time-sliced use only.
    GpuType("V100-32GB", 32, nvlink_gbps=2400),
    GpuType("L40S-48GB", 48),
    GpuType("A10-24GB", 24),
    GpuType("T4-16GB", 16),
)

CATALOGUE: Mapping[str, GpuType] = MappingProxyType({t.name: t for t in _BUILTIN})


def builtin_gpu_types() -> tuple[str, ...]:
    """Names of the built-in GPU types, in catalogue order (for error messages and docs)."""
    return tuple(CATALOGUE)


def declare_types(
    decls: Sequence[tuple[int, GpuTypeSchema]],
) -> tuple[dict[str, GpuType], list[SpecIssue]]:
    """All GPU types a spec may name: the built-ins, then its ``gpu_types`` declarations."""
    types = dict(CATALOGUE)
    issues: list[SpecIssue] = []
    for i, t in decls:
        if t.name in types:
            builtin = t.name in CATALOGUE
            what = "built in; use it without declaring it" if builtin else "declared twice"
            issues.append(SpecIssue(("gpu_types", i, "name"), f"{t.name!r} is {what}"))
            continue
        if t.mig_model is not None and t.mig_model not in MIG_CATALOGUE:
            # Kept on the type: the layout checks skip unknown models instead of piling on.
            msg = f"{t.mig_model!r} is not a MIG model (expected one of: "
            msg += f"{name_list(mig_models())}; omit mig_model for a non-MIG type)"
            issues.append(
                SpecIssue(("gpu_types", i, "mig_model"), msg + suggest(t.mig_model, mig_models()))
            )
        types[t.name] = GpuType(t.name, t.memory_gib, t.mig_model, t.nvlink_gbps)
    return types, issues


def mig_layout_problems(model: str, layout: Sequence[str]) -> list[tuple[int | None, str]]:
    """Problems of one GPU's ``layout`` on MIG ``model``: (entry index, or None for all, text)."""
    profiles = profiles_for(model)
    out: list[tuple[int | None, str]] = []
    for k, entry in enumerate(layout):
        name, sep, start = entry.partition("@")
        if name not in profiles:
            msg = f"{name!r} is not a MIG profile of {model} (valid: {name_list(profiles)})"
            out.append((k, msg + suggest(name, profiles)))
        elif sep and not start.isdigit():
            starts = list(profiles[name].starts)
            msg = f"{entry!r}: expected 'profile' or 'profile@start' (legal starts: {starts})"
            out.append((k, msg))
    if out or not layout:
        return out
    shown = "[" + ", ".join(layout) + "]"
    try:
        planned = plan_layout(profiles, layout)
    except MigError as exc:
        return [(None, f"{shown} does not fit on one {model} GPU: {exc}")]
    # plan_layout already honours the rules; this catches any disagreement between the two.
    return [(None, f"{shown} on {model}: {p}") for p in validate_mig_layout(profiles, planned)]
