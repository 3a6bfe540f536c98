"""Booking: one-node requests go to the placement engine with the pool's policy; larger ones take whole
nodes; the snapshot hands the engine every grant with its own window and share."""
from datetime import datetime, timedelta, timezone

import pytest

from allocations.booking import (BookingRefused, Grant, NewGrant, PoolGpu, PoolSnapshot, choose_whole_gpus,
                                 first_clash, policy_name)

START = datetime(2026, 11, 23, 12, tzinfo=timezone.utc)
END = START + timedelta(hours=2)


def pool(layout: dict[int, tuple[int, set[int]]], unusable: set[int] = frozenset(), *,
         busy_from: datetime = START, busy_to: datetime = END, milli: int = 1000) -> PoolSnapshot:
    """layout: node -> (GPUs on it, indexes held by another reservation over [busy_from, busy_to)).
    GPU id = node * 100 + index."""
    gpus = tuple(PoolGpu(id=node * 100 + i, node_id=node, node_name=f"n{node}", index=i, model="A100",
                         memory_mib=40960, usable=node * 100 + i not in unusable)
                 for node, (size, _) in layout.items() for i in range(size))
    grants = tuple(Grant(gpu_id=node * 100 + i, reservation_id=9, starts_at=busy_from, ends_at=busy_to, milli=milli)
                   for node, (_, busy) in layout.items() for i in busy)
    return PoolSnapshot(start=START, end=END, gpus=gpus, grants=grants)


def choose(snapshot, count, policy):
    return choose_whole_gpus(snapshot, count, policy=policy)


def test_first_fit_takes_the_first_node_with_room():
    gpus = pool({1: (4, {0, 1, 2}), 2: (4, {1}), 3: (4, {0, 1})})
    assert choose(gpus, 2, "first_fit") == [200, 202]


@pytest.mark.parametrize("policy", ["best_fit", "portal", "fgd"])
def test_packing_policies_fill_the_fullest_node_that_fits(policy):
    # n3 has exactly 2 free: taking them leaves n2's three free GPUs whole for a later 3-GPU job.
    gpus = pool({1: (4, {0, 1, 2}), 2: (4, {1}), 3: (4, {0, 1})})
    assert sorted(choose(gpus, 2, policy)) == [302, 303]


def test_spread_takes_the_emptiest_node():
    gpus = pool({1: (4, {0, 1, 2}), 2: (4, set()), 3: (4, {0, 1})})
    assert sorted(choose(gpus, 2, "spread")) == [200, 201]


def test_unusable_gpus_are_never_chosen():
    gpus = pool({1: (2, set()), 2: (2, set())}, unusable={100})
    chosen = choose(gpus, 2, "portal")
    assert 100 not in chosen and sorted(chosen) == [200, 201]


def test_fragmented_pool_says_so():
    with pytest.raises(BookingRefused) as refused:
        choose(pool({1: (4, {0, 1}), 2: (4, {0, 1})}), 3, "portal")
    assert refused.value.code == "fragmented"
    assert refused.value.message == "4 GPUs are free in total but no node has 3 free (the most on one node is 2)."


def test_more_than_one_node_takes_whole_nodes_emptiest_first():
    chosen = choose(pool({1: (4, set()), 2: (4, set()), 3: (4, {0, 1})}), 6, "portal")
    assert sorted(chosen) == [100, 101, 102, 103, 200, 201]


def test_not_enough_free_in_total():
    with pytest.raises(BookingRefused) as refused:
        choose(pool({1: (2, {0})}), 2, "portal")
    assert refused.value.code == "insufficient_capacity"


def test_a_gpu_held_for_part_of_the_window_is_busy_for_the_whole_card_request():
    late = pool({1: (2, {0})}, busy_from=END - timedelta(minutes=1), busy_to=END + timedelta(hours=5))
    assert choose(late, 1, "first_fit") == [101]
    with pytest.raises(BookingRefused):
        choose(late, 2, "first_fit")


def test_a_grant_outside_the_window_leaves_the_gpu_free():
    before = pool({1: (1, {0})}, busy_from=START - timedelta(hours=3), busy_to=START)
    assert choose(before, 1, "first_fit") == [100]


def test_a_share_of_a_gpu_keeps_the_whole_card_from_being_booked():
    half = pool({1: (2, {0})}, milli=500)
    assert choose(half, 1, "first_fit") == [101]
    with pytest.raises(BookingRefused):
        choose(half, 2, "first_fit")


def test_the_first_clash_is_the_earliest_grant_on_the_gpus_asked_for():
    snapshot = pool({1: (2, {0, 1})})
    later = Grant(gpu_id=100, reservation_id=8, starts_at=START + timedelta(minutes=30), ends_at=END)
    snapshot = PoolSnapshot(start=START, end=END, gpus=snapshot.gpus, grants=snapshot.grants + (later,))
    assert first_clash(snapshot, [NewGrant(gpu_id=100, ge=1.0)]).starts_at == START
    assert first_clash(PoolSnapshot(START, END, snapshot.gpus, (later,)), [NewGrant(gpu_id=100, ge=1.0)]) == later
    assert first_clash(PoolSnapshot(START, END, snapshot.gpus, (later,)), [NewGrant(gpu_id=101, ge=1.0)]) is None


def test_unknown_policy_names_get_the_default():
    assert policy_name("first_fit") == "first_fit"
    assert policy_name("") == "portal"
    assert policy_name("no-such-policy") == "portal"


def test_staff_choose_a_pools_policy_by_name_and_typos_are_refused(world, api):
    staff = api(world.staff)
    created = staff.post("/api/v1/pools/", {"slug": "h100", "name": "H100"}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["placement_policy"] == "portal"
    changed = staff.patch("/api/v1/pools/h100/", {"placement_policy": "best_fit"}, format="json")
    assert changed.status_code == 200 and changed.json()["placement_policy"] == "best_fit"
    refused = staff.patch("/api/v1/pools/h100/", {"placement_policy": "bestfit"}, format="json")
    assert refused.status_code == 400
    assert refused.json()["errors"][0]["field"] == "placement_policy"
