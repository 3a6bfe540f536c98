"""Reserving a share of a GPU in each sharing mode through the API: what is granted, what it is charged in
GPU-equivalents, and every bad input refused with the field and the rule, nothing written."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from allocations.models import Allocation, Reservation
from inventory.models import GpuModel
from tests.factories import (
    A100,
    MembershipFactory,
    TeamFactory,
    UserFactory,
    add_shared_pool,
    window,
)

URL = "/api/v1/reservations/"


@pytest.fixture
def member(db):
    user = UserFactory(username="sam")
    MembershipFactory(user=user, team=TeamFactory(slug="vision"))
    return user


shared_pool = add_shared_pool


def reserve(api, user, pool, **amount):
    start, end = window(0, 2)
    return api(user).post(URL, {"pool": pool, "team": "vision", "ends_at": end.isoformat(), **amount}, format="json")


def errors_of(response) -> list[tuple[str, str]]:
    return [(e["field"], e["rule"]) for e in response.json()["errors"]]


def nothing_written() -> bool:
    return not Reservation.objects.exists() and not Allocation.objects.exists()


# --- time-slicing and MPS ------------------------------------------------------------------

def test_time_slicing_grants_shares_of_one_gpu_worth_k_of_n(api, member):
    shared_pool("ts", "time_slicing", {"replicas": 4})
    response = reserve(api, member, "ts", shares=3)
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["mode"], body["shares"], body["gpus"]) == ("time_slicing", 3, 1)
    [grant] = body["grants"]
    assert (grant["shares"], grant["replicas"], grant["mig_instance"]) == (3, 4, None)
    assert grant["ge"] == pytest.approx(0.75) and body["ge"] == pytest.approx(0.75)
    # One row for the run of three adjacent slots.
    rows = list(Allocation.objects.order_by("share_from").values_list("share_from", "share_to", "milli", "mode"))
    assert rows == [(0, 750, 750, "time_slicing")]


def test_shares_around_a_held_slot_are_two_runs_of_one_grant(api, member):
    shared_pool("ts", "time_slicing", {"replicas": 4}, gpus=1)
    first = reserve(api, member, "ts", shares=1).json()["id"]
    middle = reserve(api, member, "ts", shares=1).json()["id"]
    assert api(member).post(f"{URL}{first}/release/").status_code == 200  # frees slot 0; slot 1 stays held
    body = reserve(api, member, "ts", shares=3).json()  # slots 0, 2 and 3
    assert [(g["shares"], g["replicas"]) for g in body["grants"]] == [(3, 4)] and body["ge"] == pytest.approx(0.75)
    rows = list(Allocation.objects.filter(reservation_id=body["id"]).order_by("share_from")
                .values_list("share_from", "share_to", "milli"))
    assert rows == [(0, 250, 250), (500, 1000, 500)]
    assert Reservation.objects.get(pk=middle).allocations.get().share_from == 250


def test_shares_that_fit_on_no_single_gpu_are_refused_as_fragmented(api, member):
    shared_pool("ts", "time_slicing", {"replicas": 4})
    assert reserve(api, member, "ts", shares=3).status_code == 201
    assert reserve(api, member, "ts", shares=3).status_code == 201  # the other GPU
    response = reserve(api, member, "ts", shares=2)  # one share free on each GPU
    assert response.status_code == 409
    assert errors_of(response) == [("shares", "fragmented")]
    assert "2 shares are free for that window, but no GPU has 2" in response.json()["detail"]


def test_a_new_share_goes_where_the_gpu_is_already_shared(api, member):
    shared_pool("ts", "time_slicing", {"replicas": 4})
    first = reserve(api, member, "ts", shares=1).json()["grants"][0]["uuid"]
    second = reserve(api, member, "ts", shares=2).json()["grants"][0]["uuid"]
    assert first == second  # packed, so the other GPU stays whole for a request of 4


def test_an_uneven_replica_count_leaves_the_rest_of_the_card_ungranted(api, member):
    shared_pool("ts3", "time_slicing", {"replicas": 3}, gpus=1)
    for _ in range(3):
        assert reserve(api, member, "ts3", shares=1).status_code == 201
    assert reserve(api, member, "ts3", shares=1).status_code == 409
    assert sorted(Allocation.objects.values_list("share_from", "share_to")) == [(0, 333), (333, 666), (666, 999)]
    assert sum(Reservation.objects.values_list("ge", flat=True)) == pytest.approx(1.0)


def test_mps_shares_carry_a_memory_and_a_compute_cap(api, member):
    shared_pool("mps", "mps", {"replicas": 4})
    body = reserve(api, member, "mps", shares=2).json()
    [grant] = body["grants"]
    assert (grant["gpu_memory_mib"], grant["gpu_cores_pct"]) == (2 * (81920 // 4), 50)


@pytest.mark.parametrize("amount, field, rule", [
    ({"shares": 5}, "shares", "max_value"),
    ({"gpus": 1}, "gpus", "not_for_mode"),
    ({"shares": 1, "gpus": 1}, "gpus", "not_for_mode"),
    ({"shares": 1, "mig_profile": "1g.10gb"}, "mig_profile", "not_for_mode"),
    ({}, "shares", "required"),
    ({"shares": 0}, "shares", "min_value"),
    ({"shares": 1, "priority": 3}, "priority", "unknown_field"),
])
def test_bad_share_requests_name_the_field_and_the_rule(api, member, amount, field, rule):
    shared_pool("ts", "time_slicing", {"replicas": 4})
    response = reserve(api, member, "ts", **amount)
    assert response.status_code == 400, response.content
    assert (field, rule) in errors_of(response)
    assert nothing_written()


# --- MIG -----------------------------------------------------------------------------------

def test_mig_instances_come_from_the_layout_with_stable_names(api, member):
    pool = shared_pool("mig", "mig", {"mig_layout": "all-1g.10gb"})
    gpu = pool.gpus.order_by("index").first()
    gpu.mig_devices = [{"uuid": "MIG-aaaa", "profile": "1g.10gb", "start": 6, "memory_mib": 9728}]
    gpu.save()
    response = reserve(api, member, "mig", mig_profile="1g.10gb", count=3)
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["mig_profile"], body["count"], body["ge"]) == ("1g.10gb", 3, pytest.approx(3 / 7))
    instances = [grant["mig_instance"] for grant in body["grants"]]
    assert len(set(instances)) == 3 and all(grant["uuid"] == body["grants"][0]["uuid"] for grant in body["grants"])
    assert "MIG-aaaa" in instances or all(i.startswith(body["grants"][0]["uuid"] + "/") for i in instances)


def test_a_dynamic_pool_carves_what_its_static_layout_would_not_offer(api, member):
    shared_pool("dmig", "mig", {"dynamic": True, "mig_layout": "all-balanced"}, gpus=1)
    response = reserve(api, member, "dmig", mig_profile="3g.40gb", count=2)  # all-balanced has one 3g
    assert response.status_code == 201, response.content
    assert sorted(grant["mig_instance"].rsplit("/", 1)[1] for grant in response.json()["grants"]) == ["0", "4"]
    assert sorted(Allocation.objects.values_list("mig_start", "share_from", "share_to")) == [(0, 0, 500),
                                                                                              (4, 500, 1000)]
    refused = reserve(api, member, "dmig", mig_profile="1g.10gb")
    assert refused.status_code == 409 and errors_of(refused)[0][1] == "insufficient_capacity"
    assert errors_of(reserve(api, member, "dmig", mig_profile="1g.10gb+me"))[0] == ("mig_profile", "not_in_layout")


def test_a_dynamic_pools_queue_carves_the_waiting_instance_when_the_slices_free_up(api, member):
    from allocations import queue

    shared_pool("dmig", "mig", {"dynamic": True}, gpus=1)
    whole = reserve(api, member, "dmig", mig_profile="7g.80gb")
    assert whole.status_code == 201
    waiting = api(member).post(URL, {"pool": "dmig", "team": "vision", "mig_profile": "3g.40gb", "count": 2,
                                     "duration": "1h"}, format="json")
    assert waiting.status_code == 201 and waiting.json()["state"] == "pending", waiting.content
    assert api(member).post(f"{URL}{whole.json()['id']}/release/").status_code == 200
    queue.queue_pass(pool_id=Reservation.objects.get(pk=waiting.json()["id"]).pool_id)
    started = Reservation.objects.get(pk=waiting.json()["id"])
    assert started.state == "scheduled"
    assert sorted(Allocation.objects.filter(reservation=started).values_list("mig_start", flat=True)) == [0, 4]


def test_mig_count_beyond_the_free_instances_is_refused_with_the_count(api, member):
    shared_pool("mig", "mig", {"profiles": ["3g.40gb", "3g.40gb"]}, gpus=1)
    assert reserve(api, member, "mig", mig_profile="3g.40gb", count=2).status_code == 201
    response = reserve(api, member, "mig", mig_profile="3g.40gb")
    assert response.status_code == 409
    assert errors_of(response) == [("count", "insufficient_capacity")]
    assert "1 × 3g.40gb requested but only 0 are free" in response.json()["detail"]


def test_a_balanced_layout_offers_each_of_its_profiles(api, member):
    shared_pool("mig", "mig", {"mig_layout": "all-balanced"}, gpus=1)
    for profile, count in (("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)):
        assert reserve(api, member, "mig", mig_profile=profile, count=count).status_code == 201, profile
    starts = sorted(Allocation.objects.values_list("share_from", "share_to"))
    assert all(a[1] <= b[0] for a, b in zip(starts, starts[1:]))  # disjoint slices
    assert sum(Reservation.objects.values_list("ge", flat=True)) == pytest.approx(7 / 7)


@pytest.mark.parametrize("amount, field, rule", [
    ({"mig_profile": "2g.20gb"}, "mig_profile", "not_in_layout"),
    ({"mig_profile": "5g.50gb"}, "mig_profile", "unknown_profile"),
    ({"mig_profile": "1g.10gb", "count": 0}, "count", "min_value"),
    ({"count": 2}, "mig_profile", "required"),
    ({"mig_profile": "1g.10gb", "shares": 1}, "shares", "not_for_mode"),
    ({"gpus": 1}, "gpus", "not_for_mode"),
])
def test_bad_mig_requests_name_the_field_and_the_rule(api, member, amount, field, rule):
    shared_pool("mig", "mig", {"mig_layout": "all-1g.10gb"})
    response = reserve(api, member, "mig", **amount)
    assert response.status_code == 400, response.content
    assert (field, rule) in errors_of(response)
    assert nothing_written()


def test_the_mig_refusal_says_what_is_over_in_ge_and_in_instances(api, member):
    GpuModel.objects.create(name=A100, weight=2)
    shared_pool("a100-mig", "mig", {"mig_layout": "all-3g.40gb"}, gpus=4, max_ge=3)
    response = reserve(api, member, "a100-mig", mig_profile="3g.40gb", count=4)
    assert response.status_code == 409
    assert errors_of(response) == [("count", "quota_exceeded")]
    detail = response.json()["detail"]
    assert "team Vision would hold 3.43 GE in pool A100-MIG" in detail
    assert "(quota 3.00, 0.43 over): 4 × 3g.40gb is 3.43 GE" in detail


# --- vGPU ----------------------------------------------------------------------------------

def test_vgpu_grants_memory_and_cores_charged_by_the_larger_share(api, member):
    shared_pool("hami", "vgpu", {"default_cores_pct": 30})
    body = reserve(api, member, "hami", gpu_memory_mib=40960).json()
    [grant] = body["grants"]
    assert (grant["gpu_memory_mib"], grant["gpu_cores_pct"]) == (40960, 30)
    assert grant["ge"] == pytest.approx(0.5)
    body = reserve(api, member, "hami", gpu_memory_pct=25, gpu_cores_pct=60, gpus=2).json()
    assert [g["gpu_memory_mib"] for g in body["grants"]] == [20480, 20480]
    assert body["ge"] == pytest.approx(1.2)


def test_vgpu_packs_by_memory_and_cores_and_refuses_when_no_gpu_has_both(api, member):
    shared_pool("hami", "vgpu", {}, gpus=1)
    assert reserve(api, member, "hami", gpu_memory_mib=60000, gpu_cores_pct=20).status_code == 201
    too_much_memory = reserve(api, member, "hami", gpu_memory_mib=30000, gpu_cores_pct=10)
    assert too_much_memory.status_code == 409
    assert "the most memory free on one GPU is 21920 MiB" in too_much_memory.json()["detail"]
    assert reserve(api, member, "hami", gpu_memory_mib=20000, gpu_cores_pct=80).status_code == 201
    assert reserve(api, member, "hami", gpu_memory_mib=100, gpu_cores_pct=1).status_code == 409  # cores all taken


@pytest.mark.parametrize("amount, field, rule", [
    ({"gpu_memory_mib": 90000}, "gpu_memory_mib", "exceeds_gpu_memory"),
    ({"gpu_memory_mib": 1000, "gpu_cores_pct": 0}, "gpu_cores_pct", "min_value"),
    ({"gpu_memory_mib": 1000, "gpu_cores_pct": 101}, "gpu_cores_pct", "max_value"),
    ({"gpu_memory_mib": 1000, "gpu_memory_pct": 10}, "gpu_memory_pct", "exclusive_with"),
    ({"gpu_cores_pct": 10}, "gpu_memory_mib or gpu_memory_pct", "required"),
    ({"shares": 1}, "shares", "not_for_mode"),
])
def test_bad_vgpu_requests_name_the_field_and_the_rule(api, member, amount, field, rule):
    shared_pool("hami", "vgpu", {})
    response = reserve(api, member, "hami", **amount)
    assert response.status_code == 400, response.content
    assert (field, rule) in errors_of(response)
    assert nothing_written()


# --- GE: weights and the team-wide cap --------------------------------------------------------

def test_a_whole_gpu_counts_its_models_weight(api, member):
    GpuModel.objects.create(name=A100, weight="0.6")
    shared_pool("x", "exclusive", {}, max_ge=1)
    body = reserve(api, member, "x", gpus=1).json()
    assert body["ge"] == pytest.approx(0.6) and body["grants"][0]["ge"] == pytest.approx(0.6)
    response = reserve(api, member, "x", gpus=1)  # 1.2 GE > 1.0
    assert response.status_code == 409 and errors_of(response) == [("gpus", "quota_exceeded")]


def test_a_weight_change_leaves_what_was_charged_alone(api, member):
    shared_pool("x", "exclusive", {}, gpus=3, max_ge=2)
    assert reserve(api, member, "x", gpus=1).json()["ge"] == pytest.approx(1.0)
    GpuModel.objects.create(name=A100, weight="0.5")
    assert reserve(api, member, "x", gpus=2).json()["ge"] == pytest.approx(1.0)  # 1.0 + 1.0 = 2.0 GE held
    assert sorted(Allocation.objects.values_list("ge", flat=True)) == [0.5, 0.5, 1.0]


def test_the_team_wide_cap_counts_every_pool(api, member):
    shared_pool("x", "exclusive", {}, max_ge=4)
    shared_pool("ts", "time_slicing", {"replicas": 2}, max_ge=4)
    TeamFactory(slug="vision").__class__.objects.filter(slug="vision").update(max_ge=2)
    assert reserve(api, member, "x", gpus=1).status_code == 201
    assert reserve(api, member, "ts", shares=1).status_code == 201  # 1.5 GE in all
    response = reserve(api, member, "ts", shares=2)  # 2.5 > 2
    assert response.status_code == 409
    assert errors_of(response) == [("shares", "team_cap_exceeded")]
    assert "would hold 2.50 GE across all pools" in response.json()["detail"]


# --- the database's own guards ---------------------------------------------------------------

def _insert(reservation, gpu, **columns):
    start, end = reservation.starts_at, reservation.ends_at
    return Allocation.objects.create(reservation=reservation, gpu=gpu, starts_at=start, ends_at=end, **columns)


@pytest.mark.django_db(transaction=True)
def test_postgresql_refuses_overlapping_share_slots_and_vgpu_overcommit_whatever_the_code_does(api, member):
    if connection.vendor != "postgresql":
        pytest.skip("the guards are PostgreSQL's")
    pool = shared_pool("hami", "vgpu", {}, gpus=1, memory_mib=1000)
    gpu = pool.gpus.get()
    start = timezone.now() + timedelta(hours=1)
    reservation = Reservation.objects.create(team=TeamFactory(slug="vision"), pool=pool, gpus=1, starts_at=start,
                                             ends_at=start + timedelta(hours=2))
    _insert(reservation, gpu, mode="vgpu", memory_mib=600, cores_pct=50, milli=600)
    with pytest.raises(IntegrityError), transaction.atomic():
        _insert(reservation, gpu, mode="vgpu", memory_mib=500, cores_pct=10, milli=500)  # 1100 MiB > 1000
    with pytest.raises(IntegrityError), transaction.atomic():
        _insert(reservation, gpu, mode="vgpu", memory_mib=100, cores_pct=60, milli=600)  # 110 % of the cores
    with pytest.raises(IntegrityError), transaction.atomic():
        _insert(reservation, gpu, mode="time_slicing", share_from=0, share_to=250, milli=250)  # mixed modes
    _insert(reservation, gpu, mode="vgpu", memory_mib=400, cores_pct=50, milli=500)  # exactly full: allowed
    later = Reservation.objects.create(team=reservation.team, pool=pool, gpus=1, starts_at=reservation.ends_at,
                                       ends_at=reservation.ends_at + timedelta(hours=1))
    _insert(later, gpu, mode="vgpu", memory_mib=1000, cores_pct=100, milli=1000)  # after: free again
    slots = Reservation.objects.create(team=reservation.team, pool=pool, gpus=1, starts_at=later.ends_at,
                                       ends_at=later.ends_at + timedelta(hours=1))
    _insert(slots, gpu, mode="time_slicing", share_from=0, share_to=250, milli=250)
    with pytest.raises(IntegrityError), transaction.atomic():
        _insert(slots, gpu, mode="time_slicing", share_from=200, share_to=450, milli=250)
    _insert(slots, gpu, mode="time_slicing", share_from=250, share_to=500, milli=250)


# --- pools' MIG layouts --------------------------------------------------------------------------

@pytest.mark.parametrize("config, ok", [
    ({"mig_layout": "all-1g.10gb"}, True),
    ({"mig_layout": "all-balanced"}, True),
    ({"profiles": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]}, True),
    ({"profiles": {"1g.10gb": 7}}, True),
    ({"profiles": ["4g.40gb", "4g.40gb"]}, False),  # both need slice 0
    ({"profiles": ["3g.40gb", "3g.40gb", "1g.10gb"]}, False),  # 7 compute slices used, no memory left
    ({"profiles": ["1g.5gb"]}, False),  # an A100-40GB profile on 80 GB cards
    ({"mig_layout": "all-9g.90gb"}, False),
    ({"dynamic": True}, True),
    ({"dynamic": True, "mig_layout": "all-balanced"}, True),  # the layout an idle GPU is set to
    ({"dynamic": "yes"}, False),
    ({"dynamic": False}, False),  # neither a layout nor dynamic
])
def test_a_mig_layout_must_fit_the_pools_gpus(api, db, config, ok):
    staff = UserFactory(username="root", is_staff=True)
    pool = shared_pool("mig", "mig", {"mig_layout": "all-1g.10gb"})
    response = api(staff).patch(f"/api/v1/pools/{pool.slug}/", {"sharing_config": config}, format="json")
    if ok:
        assert response.status_code == 200, response.content
    else:
        assert response.status_code == 400, response.content
        assert errors_of(response)[0][0] == "sharing_config"
        pool.refresh_from_db()
        assert pool.sharing_config == {"mig_layout": "all-1g.10gb"}
