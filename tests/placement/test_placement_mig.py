"""MIG geometry: profiles per model, legal start slices, overlap, and the start-slice choice."""

from __future__ import annotations

import pytest

from allocations.placement.mig import (
    FULL_MASK,
    MIG_GEOMETRY,
    best_start,
    canonical_model,
    free_starts,
    mig_compute_milli,
    profile_for,
    profiles_for,
)


@pytest.mark.parametrize(
    ("model", "names"),
    [
        ("A100-SXM4-40GB", {"1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}),
        ("NVIDIA A100 80GB PCIe", {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}),
        ("H100 80GB HBM3", {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}),
        ("H200", {"1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"}),
    ],
)
def test_profiles_per_model(model: str, names: set[str]) -> None:
    assert set(profiles_for(model)) == names


def test_models_without_mig_have_no_profiles() -> None:
    assert profiles_for("T4") == {}
    assert canonical_model("V100M32") is None


@pytest.mark.parametrize(
    ("profile", "size", "starts"),
    [
        ("1g.10gb", 1, (0, 1, 2, 3, 4, 5, 6)),
        ("1g.20gb", 2, (0, 2, 4, 6)),
        ("2g.20gb", 2, (0, 2, 4)),
        ("3g.40gb", 4, (0, 4)),
        ("4g.40gb", 4, (0,)),
        ("7g.80gb", 8, (0,)),
    ],
)
def test_placement_geometry_h100(profile: str, size: int, starts: tuple[int, ...]) -> None:
    p = profile_for("H100-80GB", profile)
    assert p is not None
    assert (p.size, p.starts) == (size, starts)
    for s in starts:
        assert p.mask(s) >> s == (1 << size) - 1
        assert p.mask(s) & ~FULL_MASK == 0  # never beyond slice 7


def test_every_family_shares_one_layout() -> None:
    layouts = {
        tuple(sorted((p.compute_slices, p.size, p.starts) for p in prof.values())) for prof in MIG_GEOMETRY.values()
    }
    assert len(layouts) == 1


def test_free_starts_respect_occupied_slices() -> None:
    four = profile_for("A100-80GB", "4g.40gb")
    three = profile_for("A100-80GB", "3g.40gb")
    seven = profile_for("A100-80GB", "7g.80gb")
    one = profile_for("A100-80GB", "1g.10gb")
    assert four and three and seven and one
    used = four.mask(0)  # slices 0-3
    assert free_starts(three, used) == [4]
    assert free_starts(seven, used) == []
    assert free_starts(four, used) == []
    assert free_starts(one, used) == [4, 5, 6]
    used |= three.mask(4)
    assert free_starts(one, used) == []


def test_media_extension_profile_is_one_per_gpu() -> None:
    me = profile_for("H100-80GB", "1g.10gb+me")
    assert me is not None
    assert free_starts(me, 0, has_media_instance=True) == []
    assert free_starts(me, 0) == list(range(7))


def test_best_start_fills_small_instances_from_the_top() -> None:
    # Slice 0 is the only start of 4g and 7g: a 1g instance belongs at the top end.
    assert best_start("A100-SXM4-40GB", "1g.5gb", 0) == 6
    # With 4g at 0 taken, 3g fits only at 4.
    assert best_start("A100-SXM4-40GB", "3g.20gb", profile_for("A100-40GB", "4g.20gb").mask(0)) == 4  # type: ignore[union-attr]
    assert best_start("A100-SXM4-40GB", "7g.40gb", 1) is None
    assert best_start("T4", "1g.5gb", 0) is None


def test_compute_share() -> None:
    assert mig_compute_milli("3g.40gb") == 429
    assert mig_compute_milli("7g.141gb") == 1000
    assert mig_compute_milli("nonsense") == 0
