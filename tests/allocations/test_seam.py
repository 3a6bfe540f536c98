"""The seam: one-node requests go to the placement engine with the pool's policy; larger ones take whole nodes."""
from datetime import datetime, timedelta, timezone

import pytest

from allocations.seam import PoolGpu, Unplaceable, choose_whole_gpus, policy_name

START = datetime(2026, 11, 23, 12, tzinfo=timezone.utc)
END = START + timedelta(hours=2)


def pool(layout: dict[int, tuple[int, set[int]]], unusable: set[int] = frozenset()) -> list[PoolGpu]:
    """layout: node -> (GPUs on it, indexes busy in the window). GPU id = node * 100 + index."""
    return [
        PoolGpu(id=node * 100 + i, node_id=node, node_name=f"n{node}", index=i, model="A100", memory_mib=40960,
                busy=i in busy, usable=node * 100 + i not in unusable)
        for node, (size, busy) in layout.items() for i in range(size)
    ]


def choose(gpus, count, policy):
    return choose_whole_gpus(gpus, count, start=START, end=END, policy=policy)


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
    with pytest.raises(Unplaceable) as refused:
        choose(pool({1: (4, {0, 1}), 2: (4, {0, 1})}), 3, "portal")
    assert refused.value.code == "fragmented"
    assert refused.value.message == "4 GPUs are free in total but no node has 3 free (the most on one node is 2)."


def test_more_than_one_node_takes_whole_nodes_emptiest_first():
    chosen = choose(pool({1: (4, set()), 2: (4, set()), 3: (4, {0, 1})}), 6, "portal")
    assert sorted(chosen) == [100, 101, 102, 103, 200, 201]


def test_not_enough_free_in_total():
    with pytest.raises(Unplaceable) as refused:
        choose(pool({1: (2, {0})}), 2, "portal")
    assert refused.value.code == "insufficient_capacity"


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
