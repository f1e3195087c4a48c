"""NVIDIA MIG profile catalogue and exact GPU-instance placement rules for one GPU."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

# Geometry of a MIG-mode GPU: 8 memory slices, 7 compute (SM) slices, at most 7 GPU instances.
# MIG user guide "Concepts" + "Supported GPUs"; see research/contention.md §1.1.
MAX_INSTANCES = 7
MEM_SLICES = 8
COMPUTE_SLICES = 7


class MigError(ValueError):
    """A MIG profile, model or layout that the hardware would refuse."""


@dataclass(frozen=True, slots=True)
class MigProfile:
    name: str  # nominal name on this GPU model, e.g. "3g.40gb"
    gi_profile_id: int  # GI profile ID as listed by `nvidia-smi mig -lgip`
    compute_slices: int  # 1..7
    mem_slices: int  # placement size on the 8-slice memory axis
    starts: tuple[int, ...]  # legal first memory slice
    max_count: int  # per-GPU cap for this profile
    memory_gib: float  # usable memory reported (nominal where unknown)
    sm_count: int | None
    media_ext: bool = False  # the "+me" profile, capped at 1 per GPU


class MigInstance(NamedTuple):
    """A GPU instance: its profile and first memory slice. A named tuple, not a dataclass: the
    scheduler hashes and compares instances by the hundred thousand (layout signatures, sets of
    running instances), and a tuple does both in C (same hash and equality as before)."""

    profile: str
    start: int


# Placement geometry per GI profile ID: (compute slices, memory slices, starts, max count, +me).
# Identical on A100-40GB/A100-80GB/H100-80GB (`nvidia-smi mig -lgipp`, MIG user guide);
# H200 inferred identical. See research/contention.md §1.2.
_GEOMETRY: dict[int, tuple[int, int, tuple[int, ...], int, bool]] = {
    19: (1, 1, (0, 1, 2, 3, 4, 5, 6), 7, False),  # 1g: slice 7 is NOT a legal start
    20: (1, 1, (0, 1, 2, 3, 4, 5, 6), 1, True),  # 1g+me
    15: (1, 2, (0, 2, 4, 6), 4, False),  # 1g memory-doubled: 2 slices despite the "1/8" doc row
    14: (2, 2, (0, 2, 4), 3, False),  # 2g
    9: (3, 4, (0, 4), 2, False),  # 3g occupies 4 memory slices, not 3
    5: (4, 4, (0,), 1, False),  # 4g
    0: (7, 8, (0,), 1, False),  # 7g
}

# Per-model rows: (name, GI profile ID, GiB reported, SMs). GiB/SMs from public `-lgip`
# transcripts, H200 GiB nominal; MIG guide "Supported MIG Profiles"; research/contention.md §1.3.
_MODEL_ROWS: dict[str, tuple[tuple[str, int, float, int | None], ...]] = {
    "A100-40GB": (
        ("1g.5gb", 19, 4.75, 14),
        ("1g.5gb+me", 20, 4.75, 14),
        ("1g.10gb", 15, 9.62, 14),  # trap: profile 15 here, profile 19 on 80GB parts
        ("2g.10gb", 14, 9.62, 28),
        ("3g.20gb", 9, 19.5, 42),
        ("4g.20gb", 5, 19.5, 56),
        ("7g.40gb", 0, 39.25, 98),  # A100 MIG exposes 98 of 108 SMs
    ),
    "A100-80GB": (
        ("1g.10gb", 19, 9.5, 14),
        ("1g.10gb+me", 20, 9.5, 14),
        ("1g.20gb", 15, 19.5, 14),
        ("2g.20gb", 14, 19.5, 28),
        ("3g.40gb", 9, 39.25, 42),
        ("4g.40gb", 5, 39.25, 56),
        ("7g.80gb", 0, 78.75, 98),
    ),
    "H100-80GB": (  # non-linear SM counts (1g.20gb=26, 3g=60) are what the driver reports
        ("1g.10gb", 19, 9.75, 16),
        ("1g.10gb+me", 20, 9.75, 16),
        ("1g.20gb", 15, 19.62, 26),
        ("2g.20gb", 14, 19.62, 32),
        ("3g.40gb", 9, 39.5, 60),
        ("4g.40gb", 5, 39.5, 64),
        ("7g.80gb", 0, 79.25, 132),
    ),
    "H200-141GB": (  # reported GiB unverified: nominal; 1g.35gb SM count unknown
        ("1g.18gb", 19, 18.0, 16),
        ("1g.18gb+me", 20, 18.0, 16),
        ("1g.35gb", 15, 35.0, None),
        ("2g.35gb", 14, 35.0, 32),
        ("3g.71gb", 9, 71.0, 60),
        ("4g.71gb", 5, 71.0, 64),
        ("7g.141gb", 0, 141.0, 132),
    ),
}


def _build_profile(name: str, gi_id: int, gib: float, sms: int | None) -> MigProfile:
    compute, mem, starts, cap, media = _GEOMETRY[gi_id]
    return MigProfile(name, gi_id, compute, mem, starts, cap, gib, sms, media)


# Keyed by (model, name), never by name alone: the same name means different geometry per model.
MIG_CATALOGUE: Mapping[str, Mapping[str, MigProfile]] = MappingProxyType(
    {
        model: MappingProxyType({row[0]: _build_profile(*row) for row in rows})
        for model, rows in _MODEL_ROWS.items()
    }
)


def mig_models() -> tuple[str, ...]:
    return tuple(sorted(MIG_CATALOGUE))


def profiles_for(gpu_model: str) -> Mapping[str, MigProfile]:
    try:
        return MIG_CATALOGUE[gpu_model]
    except KeyError:
        raise MigError(
            f"GPU model {gpu_model!r} has no MIG profiles "
            f"(MIG-capable models: {', '.join(mig_models())})"
        ) from None


def profile(gpu_model: str, name: str) -> MigProfile:
    profiles = profiles_for(gpu_model)
    try:
        return profiles[name]
    except KeyError:
        raise MigError(
            f"GPU model {gpu_model!r} has no MIG profile {name!r} "
            f"(valid profiles: {', '.join(profiles)})"
        ) from None


def _lookup(profiles: Mapping[str, MigProfile], name: str) -> MigProfile:
    try:
        return profiles[name]
    except KeyError:
        raise MigError(
            f"unknown MIG profile {name!r} (valid profiles: {', '.join(profiles)})"
        ) from None


def span_mask(start: int, mem_slices: int) -> int:
    if start < 0 or mem_slices < 1 or start + mem_slices > MEM_SLICES:
        raise MigError(
            f"memory span start={start} size={mem_slices} "
            f"does not fit in slices 0..{MEM_SLICES - 1}"
        )
    return ((1 << mem_slices) - 1) << start


def occupied_mask(profiles: Mapping[str, MigProfile], instances: Sequence[MigInstance]) -> int:
    mask = 0
    for inst in instances:
        mask |= span_mask(inst.start, _lookup(profiles, inst.profile).mem_slices)
    return mask


def can_place(
    profiles: Mapping[str, MigProfile], instances: Sequence[MigInstance], name: str, start: int
) -> bool:
    """Whether a new GI `name@start` could be created next to `instances` (unknown name raises)."""
    p = _lookup(profiles, name)
    if start not in p.starts or len(instances) >= MAX_INSTANCES:
        return False
    # Overlap on memory slices is the only inter-GI conflict rule (nvml.h, §1.1).
    if occupied_mask(profiles, instances) & span_mask(start, p.mem_slices):
        return False
    if sum(1 for i in instances if i.profile == name) >= p.max_count:
        return False
    return not (p.media_ext and any(profiles[i.profile].media_ext for i in instances))


def feasible_starts(
    profiles: Mapping[str, MigProfile], instances: Sequence[MigInstance], name: str
) -> tuple[int, ...]:
    return tuple(
        s for s in _lookup(profiles, name).starts if can_place(profiles, instances, name, s)
    )


def future_options(profiles: Mapping[str, MigProfile], instances: Sequence[MigInstance]) -> int:
    """Count of (profile, start) pairs still placeable next; higher means less fragmented."""
    return sum(len(feasible_starts(profiles, instances, name)) for name in profiles)


def best_start(
    profiles: Mapping[str, MigProfile], instances: Sequence[MigInstance], name: str
) -> int | None:
    best: int | None = None
    best_score = -1
    for s in feasible_starts(profiles, instances, name):  # ascending, so ties keep lowest start
        score = future_options(profiles, (*instances, MigInstance(name, s)))
        if score > best_score:
            best, best_score = s, score
    return best


def _slices_text(mask: int) -> str:
    used = [str(i) for i in range(MEM_SLICES) if mask >> i & 1]
    return "{" + ",".join(used) + "}"


def _parse_request(profiles: Mapping[str, MigProfile], entry: str) -> tuple[str, int | None]:
    name, sep, start_text = entry.rpartition("@")
    if not sep:
        _lookup(profiles, entry)
        return entry, None
    _lookup(profiles, name)
    try:
        return name, int(start_text)
    except ValueError:
        raise MigError(f"bad pinned start in {entry!r}: expected 'name@<int>'") from None


def plan_layout(
    profiles: Mapping[str, MigProfile], requested: Sequence[str]
) -> tuple[MigInstance, ...]:
    """Place `requested` ("name" or "name@start"): pinned first, then largest-first greedily."""
    parsed = [_parse_request(profiles, e) for e in requested]
    placed: list[MigInstance] = []
    for name, start in parsed:
        if start is None:
            continue
        if not can_place(profiles, placed, name, start):
            raise MigError(
                f"cannot place pinned {name}@{start}: legal starts {profiles[name].starts}, "
                f"feasible now {feasible_starts(profiles, placed, name)}, "
                f"occupied slices {_slices_text(occupied_mask(profiles, placed))}"
            )
        placed.append(MigInstance(name, start))
    # Largest first (memory, then compute): big profiles have the fewest legal starts, and
    # explicit large-first placement avoids the driver's order-dependent "Insufficient
    # Resources" failures (MIG user guide, Getting Started; research/contention.md §1.1).
    free = sorted(
        (n for n, s in parsed if s is None),
        key=lambda n: (profiles[n].mem_slices, profiles[n].compute_slices),
        reverse=True,
    )
    for name in free:
        start = best_start(profiles, placed, name)
        if start is None:
            same = sum(1 for i in placed if i.profile == name)
            raise MigError(
                f"cannot place {name}: no feasible start among {profiles[name].starts} "
                f"({same} of max {profiles[name].max_count} already placed, {len(placed)} "
                f"instance(s) in total), occupied slices "
                f"{_slices_text(occupied_mask(profiles, placed))}"
            )
        placed.append(MigInstance(name, start))
    return tuple(placed)


def validate_layout(
    profiles: Mapping[str, MigProfile], instances: Sequence[MigInstance]
) -> list[str]:
    """Every broken placement rule as a sentence; empty when the layout is valid."""
    errors: list[str] = []
    if len(instances) > MAX_INSTANCES:
        errors.append(f"{len(instances)} GPU instances exceed the maximum of {MAX_INSTANCES}.")
    owner: dict[int, int] = {}  # memory slice -> index of the instance that holds it
    for idx, inst in enumerate(instances):
        p = profiles.get(inst.profile)
        if p is None:
            errors.append(
                f"Unknown profile {inst.profile!r} (valid profiles: {', '.join(profiles)})."
            )
            continue
        if inst.start not in p.starts:
            errors.append(
                f"{inst.profile}@{inst.start} has an illegal start; valid starts are {p.starts}."
            )
            continue
        for s in range(inst.start, inst.start + p.mem_slices):
            holder = owner.setdefault(s, idx)
            if holder != idx:
                other = instances[holder]
                errors.append(
                    f"{inst.profile}@{inst.start} overlaps {other.profile}@{other.start} "
                    f"on memory slice {s}."
                )
                break
    counts = Counter(i.profile for i in instances)
    for name, n in counts.items():
        if name in profiles and n > profiles[name].max_count:
            errors.append(f"{n} x {name} exceed its per-GPU cap of {profiles[name].max_count}.")
    media = [
        i.profile for i in instances if i.profile in profiles and profiles[i.profile].media_ext
    ]
    # One +me name over its own cap is already reported above; don't say it twice.
    if len(media) > 1 and not (len(set(media)) == 1 and len(media) > profiles[media[0]].max_count):
        errors.append(f"{len(media)} media-extension (+me) instances; at most 1 is allowed.")
    return errors


def compute_fraction(p: MigProfile) -> int:
    """Milli-GPU quota charge: compute slices out of 7 (memory slices do not count)."""
    return round(1000 * p.compute_slices / COMPUTE_SLICES)
