"""The availability timeline in each pool's unit: MIG instances of a profile, shares, GPUs with vGPU memory and
cores free, whole GPUs; a bad shape is a 400 naming the field and the rule."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.factories import (
    MembershipFactory,
    TeamFactory,
    UserFactory,
    add_shared_pool,
)



@pytest.fixture
def member(db):
    user = UserFactory(username="sam")
    MembershipFactory(user=user, team=TeamFactory(slug="vision"))
    return user


shared_pool = add_shared_pool


def hour(n: int) -> str:
    base = timezone.now().replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    return (base + timedelta(hours=n)).isoformat()


def book(api, user, pool: str, start: int, end: int, **amount) -> dict:
    response = api(user).post("/api/v1/reservations/", {"pool": pool, "team": "vision", "starts_at": hour(start),
                                                        "ends_at": hour(end), **amount}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def slots(api, user, pool: str, query: str = "") -> list[dict]:
    response = api(user).get(f"/api/v1/pools/{pool}/availability/?start={hour(0)}&end={hour(3)}&{query}".replace(
        "+", "%2B"))
    assert response.status_code == 200, response.content
    return response.json()


def test_mig_availability_counts_instances_of_the_profile_per_slot(api, member):
    shared_pool("mig", "mig", {"mig_layout": "all-1g.10gb"})
    book(api, member, "mig", 1, 2, mig_profile="1g.10gb", count=3)
    answer = slots(api, member, "mig", "mig_profile=1g.10gb&count=13")
    assert [(s["free"], s["most_together"], s["unit"], s["fits"]) for s in answer] == [
        (14, 14, "instances", True), (11, 11, "instances", False), (14, 14, "instances", True)]
    # Without a profile: the layout's smallest.
    assert [s["free"] for s in slots(api, member, "mig")] == [14, 11, 14]


def test_share_availability_counts_shares_and_says_whether_k_fit_on_one_gpu(api, member):
    shared_pool("ts", "time_slicing", {"replicas": 4})
    book(api, member, "ts", 0, 1, shares=3)
    book(api, member, "ts", 0, 2, shares=3)
    first, second, third = slots(api, member, "ts", "shares=2")
    assert (first["free"], first["most_together"], first["unit"], first["fits"]) == (2, 1, "shares", False)
    assert (second["free"], second["most_together"], second["fits"]) == (5, 4, True)
    assert (third["free"], third["most_together"]) == (8, 4)
    assert [s["fits"] for s in slots(api, member, "ts")] == [True, True, True]  # one share


def test_vgpu_availability_counts_gpus_with_the_memory_and_cores_free(api, member):
    shared_pool("hami", "vgpu", {"default_memory_mib": 20480, "default_cores_pct": 25})
    book(api, member, "hami", 0, 3, gpu_memory_mib=71680, gpu_cores_pct=50)
    assert [s["free"] for s in slots(api, member, "hami", "gpu_memory_mib=10240&gpu_cores_pct=30")] == [2, 2, 2]
    assert [s["free"] for s in slots(api, member, "hami", "gpu_memory_mib=20480&gpu_cores_pct=30")] == [1, 1, 1]
    assert [s["free"] for s in slots(api, member, "hami", "gpu_memory_pct=50&gpus=2")] == [1, 1, 1]
    answer = slots(api, member, "hami")  # the pool's defaults: 20 GiB and 25 %
    assert [(s["free"], s["unit"], s["fits"]) for s in answer] == [(1, "GPUs", True)] * 3


def test_exclusive_availability_keeps_its_fields_and_adds_the_unit(world, api):
    answer = api(world.member).get(f"/api/v1/pools/a100/availability/?start={hour(0)}&end={hour(1)}&gpus=5".replace(
        "+", "%2B")).json()
    assert answer == [{"start": answer[0]["start"], "end": answer[0]["end"], "free": 8, "free_on_one_node": 4,
                       "unit": "GPUs", "most_together": 4, "fits": True}]  # more than a node: whole nodes


@pytest.mark.parametrize("pool, mode, config, query, field, rule", [
    ("mig", "mig", {"mig_layout": "all-1g.10gb"}, "mig_profile=3g.40gb", "mig_profile", "not_in_layout"),
    ("mig", "mig", {"mig_layout": "all-1g.10gb"}, "mig_profile=9g.99gb", "mig_profile", "unknown_profile"),
    ("mig", "mig", {"mig_layout": "all-1g.10gb"}, "shares=1", "shares", "not_for_mode"),
    ("mig", "mig", {"mig_layout": "all-1g.10gb"}, "count=0", "count", "min_value"),
    ("ts", "time_slicing", {"replicas": 4}, "shares=5", "shares", "max_value"),
    ("ts", "time_slicing", {"replicas": 4}, "shares=two", "shares", "invalid"),
    ("ts", "time_slicing", {"replicas": 4}, "gpus=1", "gpus", "not_for_mode"),
    ("hami", "vgpu", {}, "gpu_cores_pct=30", "gpu_memory_mib or gpu_memory_pct", "required"),
    ("hami", "vgpu", {}, "gpu_memory_mib=999999", "gpu_memory_mib", "exceeds_gpu_memory"),
    ("hami", "vgpu", {}, "gpu_memory_pct=101", "gpu_memory_pct", "max_value"),
    ("ex", "exclusive", {}, "gpus=3", "gpus", "exceeds_pool_size"),
])
def test_a_bad_shape_is_a_400_naming_the_field(api, member, pool, mode, config, query, field, rule):
    shared_pool(pool, mode, config)
    response = api(member).get(f"/api/v1/pools/{pool}/availability/?{query}&utm_source=mail")
    assert response.status_code == 400, response.content
    assert [(e["field"], e["rule"]) for e in response.json()["errors"]] == [(field, rule)]
