"""Dynamic MIG layout: where a request's instance is carved, on hand-made GPUs whose answer is known from the
A100's start-slice geometry (a 3g takes slices 0-3 or 4-7, a 2g starts at 0, 2 or 4, a 7g only at 0)."""
from datetime import datetime, timedelta, timezone

import pytest

from allocations import booking
from allocations.booking import BookingRefused, Grant, PoolGpu, PoolSnapshot, Shape
from allocations.placement import mig

START = datetime(2026, 11, 23, 12, tzinfo=timezone.utc)
END = START + timedelta(hours=2)
A100 = "NVIDIA A100-SXM4-80GB"


def held(gpu_id: int, profile: str, start: int, *, starts_at=START, ends_at=END, reservation: int = 9) -> Grant:
    lo, hi = booking.mig_part(mig.profile_for(A100, profile), start)
    return Grant(gpu_id=gpu_id, reservation_id=reservation, starts_at=starts_at, ends_at=ends_at,
                 mig_profile=profile, mig_start=start, mode="mig", share_from=lo, share_to=hi)


def snapshot(gpus: int, *grants: Grant, devices: dict[int, tuple] | None = None) -> PoolSnapshot:
    """`gpus` A100-80GB on one node, ids 1..gpus, with `grants` and, per id, the MIG devices a host reports."""
    return PoolSnapshot(start=START, end=END, grants=grants, gpus=tuple(
        PoolGpu(id=i, node_id=1, node_name="n1", index=i - 1, uuid=f"GPU-{i}", model=A100, memory_mib=81920,
                mig_devices=(devices or {}).get(i, ())) for i in range(1, gpus + 1)))


def carve(snap: PoolSnapshot, profile: str, count: int = 1) -> list[tuple[int, int]]:
    grants = booking.choose(snap, Shape(mode="mig", mig_profile=profile, mig_count=count, mig_dynamic=True))
    for grant in grants:  # what the database guard keeps: the grant's part is exactly its slices
        assert (grant.share_from, grant.share_to) == booking.mig_part(mig.profile_for(A100, profile), grant.mig_start)
    return [(grant.gpu_id, grant.mig_start) for grant in grants]


def test_a_3g_on_an_empty_gpu_starts_at_4_then_at_0():
    # Both are legal; slice 4 leaves 0-3 able to take a 4g or a second 3g.
    assert carve(snapshot(1), "3g.40gb", 2) == [(1, 4), (1, 0)]


def test_the_used_gpu_is_carved_around_its_instances_before_a_free_gpu():
    assert carve(snapshot(2, held(2, "3g.40gb", 4)), "3g.40gb") == [(2, 0)]


def test_a_1g_held_at_slice_0_leaves_a_3g_only_start_4():
    assert carve(snapshot(1, held(1, "1g.10gb", 0)), "3g.40gb") == [(1, 4)]


def test_a_gpu_whose_free_slices_have_no_legal_start_is_passed_over_for_a_free_one():
    # Slices 1-3 and 5-7 are free on GPU 1 (six of them), but a 3g needs 0-3 or 4-7 whole.
    assert carve(snapshot(2, held(1, "1g.10gb", 0), held(1, "1g.10gb", 4)), "3g.40gb") == [(2, 4)]


def test_a_2g_fills_the_gap_of_the_fullest_gpu():
    grants = (held(1, "3g.40gb", 4), held(1, "2g.20gb", 0), held(2, "3g.40gb", 4))
    assert carve(snapshot(2, *grants), "2g.20gb") == [(1, 2)]


def test_only_grants_of_overlapping_windows_shape_the_layout():
    later = held(1, "3g.40gb", 0, starts_at=END, ends_at=END + timedelta(hours=1))
    assert carve(snapshot(1, later), "7g.80gb") == [(1, 0)]
    overlapping = held(1, "1g.10gb", 6, starts_at=END - timedelta(minutes=1), ends_at=END + timedelta(hours=1))
    with pytest.raises(BookingRefused) as refused:
        carve(snapshot(1, overlapping), "7g.80gb")
    assert refused.value.code == "insufficient_capacity"


def test_an_instance_a_host_already_has_and_nobody_holds_is_taken_as_it_is():
    reported = {2: ({"uuid": "MIG-a", "profile": "1g.10gb", "start": 3, "memory_mib": 10240},)}
    assert carve(snapshot(2, held(1, "3g.40gb", 4), devices=reported), "1g.10gb") == [(2, 3)]
    taken = held(2, "1g.10gb", 3)  # held for the window: carved elsewhere, on the fuller GPU
    assert carve(snapshot(2, held(1, "3g.40gb", 4), taken, devices=reported), "1g.10gb") == [(1, 3)]


def test_too_many_is_refused_with_what_could_be_carved():
    with pytest.raises(BookingRefused) as refused:
        carve(snapshot(1, held(1, "3g.40gb", 0)), "1g.10gb", 4)
    assert refused.value.code == "insufficient_capacity"
    # Slices 4-7 are free, but a 1g.10gb has no start at 7.
    assert "4 × 1g.10gb requested but only 3 can be carved" in refused.value.msg.english()


def test_room_counts_what_the_free_slices_can_still_be_carved_into():
    snap = snapshot(2, held(1, "3g.40gb", 4), held(1, "1g.10gb", 0))
    room = booking.room(snap, Shape(mode="mig", mig_profile="1g.10gb", mig_dynamic=True))
    assert (room.free, room.most_together) == (3 + 7, 10)
    room = booking.room(snap, Shape(mode="mig", mig_profile="3g.40gb", mig_dynamic=True))
    assert room.free == 2  # none on GPU 1 (slice 0 is held), two on GPU 2


def test_a_dynamic_pool_offers_every_profile_but_the_media_ones():
    names = [p.name for p in booking.layout_profiles({A100}, (), dynamic=True)]
    assert names == ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
