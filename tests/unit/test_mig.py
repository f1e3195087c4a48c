"""Unit and property tests for the MIG catalogue and placement rules (gpufence.model.mig)."""

from __future__ import annotations

import operator
import re
from collections import Counter
from collections.abc import Mapping
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufence.model.mig import (
    COMPUTE_SLICES,
    MAX_INSTANCES,
    MEM_SLICES,
    MIG_CATALOGUE,
    MigError,
    MigInstance,
    MigProfile,
    best_start,
    can_place,
    compute_fraction,
    feasible_starts,
    future_options,
    mig_models,
    occupied_mask,
    plan_layout,
    profile,
    profiles_for,
    span_mask,
    validate_layout,
)

A80 = profiles_for("A100-80GB")
A40 = profiles_for("A100-40GB")
MODELS = ("A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB")


def inst(spec: str) -> MigInstance:
    name, _, start = spec.rpartition("@")
    return MigInstance(name, int(start))


def layout(*specs: str) -> tuple[MigInstance, ...]:
    return tuple(inst(s) for s in specs)


# --- catalogue ----------------------------------------------------------------------------------


def test_models_exact_and_sorted() -> None:
    assert set(MIG_CATALOGUE) == set(MODELS)
    assert mig_models() == tuple(sorted(MODELS))


@pytest.mark.parametrize(
    ("model", "one", "dbl", "half", "full"),
    [  # names follow "<compute>g.<memory>gb"; memory suffixes per MIG guide (§1.3)
        ("A100-40GB", "5gb", "10gb", "20gb", "40gb"),
        ("A100-80GB", "10gb", "20gb", "40gb", "80gb"),
        ("H100-80GB", "10gb", "20gb", "40gb", "80gb"),
        ("H200-141GB", "18gb", "35gb", "71gb", "141gb"),
    ],
)
def test_profile_names_ids_and_full_gpu(
    model: str, one: str, dbl: str, half: str, full: str
) -> None:
    names = [f"1g.{one}", f"1g.{one}+me", f"1g.{dbl}", f"2g.{dbl}", f"3g.{half}", f"4g.{half}"]
    names.append(f"7g.{full}")
    profs = profiles_for(model)
    assert list(profs) == names  # 7 profiles per model, smallest first
    assert [p.gi_profile_id for p in profs.values()] == [19, 20, 15, 14, 9, 5, 0]
    whole = profs[names[-1]]
    assert (whole.compute_slices, whole.mem_slices, whole.starts) == (7, 8, (0,))
    assert span_mask(0, whole.mem_slices) == (1 << MEM_SLICES) - 1  # 7g uses all 8 memory slices
    assert [p.name for p in profs.values() if p.media_ext] == [names[1]]
    assert all(p.name == n for n, p in profs.items())


@pytest.mark.parametrize(
    ("gi_id", "compute", "mem", "starts", "cap"),
    [  # nvidia-smi mig -lgipp; research/contention.md §1.2
        (19, 1, 1, (0, 1, 2, 3, 4, 5, 6), 7),
        (20, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
        (15, 1, 2, (0, 2, 4, 6), 4),
        (14, 2, 2, (0, 2, 4), 3),
        (9, 3, 4, (0, 4), 2),
        (5, 4, 4, (0,), 1),
        (0, 7, 8, (0,), 1),
    ],
)
@pytest.mark.parametrize("model", MODELS)
def test_placement_table(
    model: str, gi_id: int, compute: int, mem: int, starts: tuple[int, ...], cap: int
) -> None:
    (p,) = [p for p in profiles_for(model).values() if p.gi_profile_id == gi_id]
    assert (p.compute_slices, p.mem_slices, p.starts, p.max_count) == (compute, mem, starts, cap)
    assert p.media_ext is (gi_id == 20)


def test_sm_counts_and_memory() -> None:
    assert profile("A100-40GB", "7g.40gb").sm_count == 98
    assert profile("H100-80GB", "7g.80gb").sm_count == 132
    assert profile("H100-80GB", "3g.40gb").sm_count == 60  # non-linear, not 3/7 of 132
    assert profile("H100-80GB", "1g.20gb").sm_count == 26
    assert profile("A100-80GB", "1g.20gb").sm_count == 14
    assert profile("H200-141GB", "1g.35gb").sm_count is None  # not verified in any source
    assert profile("A100-80GB", "7g.80gb").memory_gib == pytest.approx(78.75)
    assert profile("H200-141GB", "3g.71gb").memory_gib == pytest.approx(71.0)


def test_name_collision_trap_1g_10gb() -> None:
    a40, a80, h100 = (profile(m, "1g.10gb") for m in ("A100-40GB", "A100-80GB", "H100-80GB"))
    assert (a40.gi_profile_id, a40.mem_slices, a40.max_count) == (15, 2, 4)
    assert a40.starts == (0, 2, 4, 6)
    for p in (a80, h100):
        assert (p.gi_profile_id, p.mem_slices, p.max_count) == (19, 1, 7)
    # Same request, different outcome: 7 fit on an 80GB part, only 4 on a 40GB one.
    assert len(plan_layout(A80, ["1g.10gb"] * 7)) == 7
    assert len(plan_layout(A40, ["1g.10gb"] * 4)) == 4
    with pytest.raises(MigError, match=r"cannot place 1g\.10gb"):
        plan_layout(A40, ["1g.10gb"] * 5)


def test_catalogue_is_read_only() -> None:
    assert isinstance(MIG_CATALOGUE, MappingProxyType)
    with pytest.raises(TypeError):
        operator.setitem(MIG_CATALOGUE["A100-80GB"], "x", profile("A100-80GB", "7g.80gb"))


def test_unknown_model_and_profile_errors() -> None:
    with pytest.raises(MigError, match=r"'V100-32GB' has no MIG profiles .*A100-40GB, A100-80GB"):
        profiles_for("V100-32GB")
    with pytest.raises(MigError) as err:
        profile("A100-40GB", "1g.20gb")
    msg = str(err.value)
    assert "A100-40GB" in msg and "'1g.20gb'" in msg and "1g.5gb, 1g.5gb+me, 1g.10gb" in msg
    with pytest.raises(MigError, match="unknown MIG profile"):
        can_place(A80, (), "1g.5gb", 0)


@pytest.mark.parametrize(("slices", "milli"), [(1, 143), (2, 286), (3, 429), (4, 571), (7, 1000)])
def test_compute_fraction(slices: int, milli: int) -> None:
    (p,) = [p for p in A80.values() if p.compute_slices == slices and not p.media_ext][:1]
    assert compute_fraction(p) == milli
    assert COMPUTE_SLICES == 7


# --- masks and can_place ------------------------------------------------------------------------


def test_span_and_occupied_masks() -> None:
    assert span_mask(0, 1) == 0b1
    assert span_mask(4, 4) == 0b1111_0000
    assert span_mask(6, 2) == 0b1100_0000
    with pytest.raises(MigError):
        span_mask(7, 2)
    assert occupied_mask(A80, layout("3g.40gb@4", "1g.10gb@1")) == 0b1111_0010
    assert occupied_mask(A80, ()) == 0


@pytest.mark.parametrize(
    ("existing", "name", "start", "ok"),
    [
        ((), "7g.80gb", 0, True),
        ((), "1g.10gb", 7, False),  # slice 7 is never a 1g start
        ((), "2g.20gb", 6, False),
        ((), "3g.40gb", 2, False),
        ((), "4g.40gb", 4, False),  # 4g only at 0
        ((), "1g.20gb", 1, False),  # doubled 1g only at even slices
        (("3g.40gb@4",), "4g.40gb", 0, True),  # 4g+3g legal since R510
        (("3g.40gb@4",), "1g.20gb", 6, False),  # overlap
        (("3g.40gb@4",), "3g.40gb", 0, True),
        (("1g.10gb@1",), "2g.20gb", 0, False),  # overlap on slice 1
        (("1g.10gb@1",), "3g.40gb", 0, False),
        (("1g.10gb+me@0",), "1g.10gb+me", 3, False),  # +me capped at 1
        (("1g.10gb+me@0",), "1g.10gb", 3, True),
        (("7g.80gb@0",), "1g.10gb", 3, False),
    ],
)
def test_can_place_real_geometry(
    existing: tuple[str, ...], name: str, start: int, ok: bool
) -> None:
    assert can_place(A80, layout(*existing), name, start) is ok


# A synthetic catalogue where caps are tighter than geometry: on real profiles the per-profile
# caps and the 7-instance limit are already implied by the start tables, so they never bind.
SYNTH: Mapping[str, MigProfile] = {
    "tiny": MigProfile("tiny", 1, 1, 1, tuple(range(8)), 8, 1.0, None),
    "pair": MigProfile("pair", 2, 1, 1, tuple(range(8)), 2, 1.0, None),
    "me-a": MigProfile("me-a", 3, 1, 1, tuple(range(8)), 1, 1.0, None, media_ext=True),
    "me-b": MigProfile("me-b", 4, 1, 1, tuple(range(8)), 1, 1.0, None, media_ext=True),
}


def test_can_place_per_profile_cap() -> None:
    assert can_place(SYNTH, layout("pair@0"), "pair", 1)
    assert not can_place(SYNTH, layout("pair@0", "pair@1"), "pair", 2)


def test_can_place_one_media_ext_across_profiles() -> None:
    assert not can_place(SYNTH, layout("me-a@0"), "me-b", 1)


def test_can_place_rejects_eighth_instance() -> None:
    seven = tuple(MigInstance("tiny", s) for s in range(MAX_INSTANCES))
    assert not can_place(SYNTH, seven, "tiny", 7)  # slice 7 free, but 7 GIs is the limit
    assert feasible_starts(SYNTH, seven, "tiny") == ()


def test_real_geometry_cannot_reach_seven_plus_one() -> None:
    seven = layout(*(f"1g.10gb@{s}" for s in range(7)))
    assert occupied_mask(A80, seven) == 0b0111_1111  # slice 7 stranded
    assert future_options(A80, seven) == 0


# --- options and best_start ---------------------------------------------------------------------


def test_future_options_empty() -> None:
    # 7 (1g) + 7 (1g+me) + 4 (1g dbl) + 3 (2g) + 2 (3g) + 1 (4g) + 1 (7g)
    assert future_options(A80, ()) == 25


def test_best_start_prefers_the_edge_for_1g() -> None:
    # 1g@0 leaves 18 options: slices 1..7 are free, but 2g@0, 3g@0, 4g@0 all die.
    # 1g@6 leaves 20: the left half stays whole (3g@0, 4g@0, 2g at 0/2/4), only slice 7
    # (usable by nothing that fits next to it) and the right-half 3g/dbl@6 are lost.
    options = {s: future_options(A80, (MigInstance("1g.10gb", s),)) for s in range(7)}
    assert options[0] == 18 and options[6] == 20
    assert max(options.values()) == 20 and [s for s, v in options.items() if v == 20] == [6]
    assert best_start(A80, (), "1g.10gb") == 6


@pytest.mark.parametrize(
    ("existing", "name", "expected"),
    [
        ((), "3g.40gb", 4),  # keeps 4g@0 and 3g@0 alive
        ((), "1g.20gb", 6),  # the doubled 1g soaks up slice 7, which little else can use
        ((), "2g.20gb", 4),
        ((), "4g.40gb", 0),
        (("7g.80gb@0",), "1g.10gb", None),
        (("3g.40gb@4",), "2g.20gb", 0),  # tie between 0 and 2 -> lowest
    ],
)
def test_best_start_table(existing: tuple[str, ...], name: str, expected: int | None) -> None:
    assert best_start(A80, layout(*existing), name) == expected


# --- plan_layout --------------------------------------------------------------------------------

ZERO_WASTE_A80 = [  # research/contention.md §1.2, all use 7/7 compute and 8/8 memory
    ["7g.80gb"],
    ["4g.40gb", "3g.40gb"],
    ["3g.40gb", "2g.20gb", "2g.20gb"],
    ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
    ["3g.40gb"] + ["1g.10gb"] * 4,
    ["4g.40gb", "2g.20gb", "1g.20gb"],
    ["4g.40gb", "1g.20gb", "1g.10gb", "1g.10gb"],
    ["2g.20gb"] * 3 + ["1g.20gb"],
    ["2g.20gb"] * 2 + ["1g.20gb", "1g.10gb", "1g.10gb"],
    ["2g.20gb", "1g.20gb"] + ["1g.10gb"] * 4,
    ["1g.20gb"] + ["1g.10gb"] * 6,
    ["1g.20gb"] + ["1g.10gb+me"] + ["1g.10gb"] * 5,
]


@pytest.mark.parametrize("requested", ZERO_WASTE_A80, ids=lambda r: "+".join(r))
def test_zero_waste_geometries_plan(requested: list[str]) -> None:
    planned = plan_layout(A80, list(reversed(requested)))  # request order must not matter
    assert validate_layout(A80, planned) == []
    assert Counter(i.profile for i in planned) == Counter(requested)
    assert occupied_mask(A80, planned) == 0xFF
    assert sum(A80[i.profile].compute_slices for i in planned) == COMPUTE_SLICES


@pytest.mark.parametrize(
    ("requested", "culprit"),
    [
        (["4g.40gb", "4g.40gb"], "4g.40gb"),
        (["3g.40gb"] * 3, "3g.40gb"),
        (["7g.80gb", "1g.10gb"], "1g.10gb"),
        (["1g.10gb"] * 8, "1g.10gb"),
        (["2g.20gb"] * 4, "2g.20gb"),
        (["1g.20gb"] * 5, "1g.20gb"),
        (["1g.10gb+me"] * 2, "1g.10gb+me"),
        (["4g.40gb", "3g.40gb", "1g.10gb"], "1g.10gb"),
        (["3g.40gb", "3g.40gb", "1g.10gb"], "1g.10gb"),
    ],
)
def test_impossible_geometries_raise(requested: list[str], culprit: str) -> None:
    with pytest.raises(MigError, match=rf"cannot place {re.escape(culprit)}:.*occupied slices \{{"):
        plan_layout(A80, requested)


def test_plan_error_lists_occupied_slices() -> None:
    with pytest.raises(MigError, match=r"cannot place 4g\.40gb.*occupied slices \{0,1,2,3\}"):
        plan_layout(A80, ["4g.40gb", "4g.40gb"])
    with pytest.raises(MigError, match=r"1 of max 1 already placed.*occupied slices \{6\}"):
        plan_layout(A80, ["1g.10gb+me", "1g.10gb+me"])


def test_plan_largest_first_and_pins() -> None:
    # 3g goes first; then 1g@0 and 1g@3 both leave 8 options (mirror images) -> lowest start.
    assert plan_layout(A80, ["1g.10gb", "3g.40gb"]) == layout("3g.40gb@4", "1g.10gb@0")
    # Pinned entries go first and keep their start even when it is a poor choice.
    pinned = plan_layout(A80, ["3g.40gb", "1g.10gb@0"])
    assert pinned == layout("1g.10gb@0", "3g.40gb@4")
    assert plan_layout(A80, ["1g.10gb+me@6", "4g.40gb@0"])[0] == inst("1g.10gb+me@6")
    with pytest.raises(MigError, match=r"cannot place 4g\.40gb"):
        plan_layout(A80, ["4g.40gb", "1g.10gb@2"])


@pytest.mark.parametrize(
    ("requested", "pattern"),
    [
        (["3g.40gb@2"], r"pinned 3g\.40gb@2: legal starts \(0, 4\)"),
        (["3g.40gb@4", "1g.20gb@6"], r"pinned 1g\.20gb@6.*occupied slices \{4,5,6,7\}"),
        (["1g.10gb@x"], r"bad pinned start in '1g\.10gb@x'"),
        (["5g.50gb"], r"unknown MIG profile '5g\.50gb'"),
        (["5g.50gb@0"], r"unknown MIG profile '5g\.50gb'"),
    ],
)
def test_plan_bad_requests(requested: list[str], pattern: str) -> None:
    with pytest.raises(MigError, match=pattern):
        plan_layout(A80, requested)


def _all_layouts(profs: Mapping[str, MigProfile]) -> set[tuple[MigInstance, ...]]:
    pairs = [MigInstance(n, s) for n, p in profs.items() for s in p.starts]
    found: set[tuple[MigInstance, ...]] = set()

    def grow(first: int, cur: tuple[MigInstance, ...]) -> None:
        for j in range(first, len(pairs)):
            if can_place(profs, cur, pairs[j].profile, pairs[j].start):
                nxt = (*cur, pairs[j])
                found.add(nxt)
                grow(j + 1, nxt)

    grow(0, ())
    return found


@pytest.mark.parametrize("model", MODELS)
def test_greedy_plans_every_feasible_multiset(model: str) -> None:
    profs = profiles_for(model)
    layouts = _all_layouts(profs)
    plain = {n: p for n, p in profs.items() if not p.media_ext}
    no_me = [lay for lay in layouts if all(i.profile in plain for i in lay)]
    # Cross-check of the enumeration in research/contention.md §1.2 (+me treated as a 1g):
    # 722 valid non-empty placement sets, 78 maximal ones.
    assert len(no_me) == 722
    assert sum(1 for lay in no_me if future_options(plain, lay) == 0) == 78
    # Largest-first + most-options is complete here: any multiset that fits somewhere is planned.
    multisets = {tuple(sorted(i.profile for i in lay)) for lay in layouts}
    for ms in multisets:
        planned = plan_layout(profs, list(ms))
        assert validate_layout(profs, planned) == []


# --- validate_layout ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("specs", "expected"),
    [
        ((), []),
        (("4g.40gb@0", "3g.40gb@4"), []),
        (("3g.40gb@2",), ["3g.40gb@2 has an illegal start; valid starts are (0, 4)."]),
        (
            ("1g.10gb@7",),
            ["1g.10gb@7 has an illegal start; valid starts are (0, 1, 2, 3, 4, 5, 6)."],
        ),
        (("4g.40gb@0", "2g.20gb@2"), ["2g.20gb@2 overlaps 4g.40gb@0 on memory slice 2."]),
        (("1g.10gb@0", "1g.10gb@0"), ["1g.10gb@0 overlaps 1g.10gb@0 on memory slice 0."]),
        (
            ("1g.10gb+me@0", "1g.10gb+me@1"),
            ["2 x 1g.10gb+me exceed its per-GPU cap of 1."],
        ),
        (
            ("9g.90gb@0",),
            [
                "Unknown profile '9g.90gb' (valid profiles: 1g.10gb, 1g.10gb+me, 1g.20gb, "
                "2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb)."
            ],
        ),
    ],
)
def test_validate_layout_messages(specs: tuple[str, ...], expected: list[str]) -> None:
    assert validate_layout(A80, layout(*specs)) == expected


def test_validate_layout_caps_and_instance_limit() -> None:
    eight = tuple(MigInstance("tiny", s) for s in range(8))
    assert validate_layout(SYNTH, eight) == ["8 GPU instances exceed the maximum of 7."]
    assert validate_layout(SYNTH, layout("pair@0", "pair@1", "pair@2")) == [
        "3 x pair exceed its per-GPU cap of 2."
    ]
    assert validate_layout(SYNTH, layout("me-a@0", "me-b@1")) == [
        "2 media-extension (+me) instances; at most 1 is allowed."
    ]
    errors = validate_layout(A80, layout(*(["2g.20gb@0"] * 4)))
    assert "4 x 2g.20gb exceed its per-GPU cap of 3." in errors
    assert sum("overlaps" in e for e in errors) == 3


# --- property -----------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(data=st.data(), model=st.sampled_from(MODELS))
def test_random_feasible_placements_stay_valid(data: st.DataObject, model: str) -> None:
    profs = profiles_for(model)
    placed: list[MigInstance] = []
    for _ in range(data.draw(st.integers(0, 12), label="steps")):
        name = data.draw(st.sampled_from(sorted(profs)), label="profile")
        starts = feasible_starts(profs, placed, name)
        if not starts:
            assert best_start(profs, placed, name) is None
            continue
        start = data.draw(st.sampled_from(starts), label="start")
        before = occupied_mask(profs, placed)
        assert before & span_mask(start, profs[name].mem_slices) == 0
        placed.append(MigInstance(name, start))
        assert occupied_mask(profs, placed) == before | span_mask(start, profs[name].mem_slices)
        assert len(placed) <= MAX_INSTANCES
        assert validate_layout(profs, placed) == []
    assert sum(profs[i.profile].compute_slices for i in placed) <= COMPUTE_SLICES
    assert bin(occupied_mask(profs, placed)).count("1") == sum(
        profs[i.profile].mem_slices for i in placed
    )
