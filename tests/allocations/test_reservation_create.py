"""POST /api/v1/reservations/: placement, quota, and every kind of bad input."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from allocations.models import Allocation, Reservation, ReservationEvent
from allocations.quota_math import month_start
from tests.factories import QuotaFactory, window

URL = "/api/v1/reservations/"


def body(pool="a100", team="ml", gpus=1, hours_from_now=0.0, hours=2.0, **overrides):
    start, end = window(hours_from_now, hours)
    data = {"pool": pool, "team": team, "gpus": gpus, "ends_at": end.isoformat()}
    if hours_from_now:
        data["starts_at"] = start.isoformat()
    data.update(overrides)
    return data


def errors_of(response) -> list[tuple[str, str]]:
    return [(e["field"], e["rule"]) for e in response.json()["errors"]]


def test_it_reserves_whole_gpus_on_one_node(world, api):
    response = api(world.member).post(URL, body(gpus=3), format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["state"] == "scheduled"
    assert len(data["allocated_gpus"]) == 3
    assert len({g["node"] for g in data["allocated_gpus"]}) == 1
    assert all(g["uuid"].startswith("GPU-") for g in data["allocated_gpus"])
    assert data["starts_at"] and data["ends_at"]
    assert Allocation.objects.filter(reservation_id=data["id"]).count() == 3
    detail = api(world.member).get(f"{URL}{data['id']}/").json()
    assert detail["events"][0]["to_state"] == "scheduled" and detail["apply_jobs"] == []


def test_it_defaults_the_start_to_now(world, api):
    before = timezone.now()
    response = api(world.member).post(URL, body(), format="json")
    starts_at = Reservation.objects.get(pk=response.json()["id"]).starts_at
    assert before <= starts_at <= timezone.now()


def test_it_takes_the_first_node_with_enough_free_gpus(world, api):
    client = api(world.member)
    first = client.post(URL, body(gpus=3), format="json").json()
    second = client.post(URL, body(gpus=2), format="json").json()
    assert first["allocated_gpus"][0]["node"] == "node-a"
    # node-a has one GPU left, so two GPUs go to node-b together rather than split.
    assert {g["node"] for g in second["allocated_gpus"]} == {"node-b"}


def test_it_refuses_a_fragmented_pool_with_the_reason(world, api):
    client = api(world.outsider)  # team infra: quota 8 in a100
    assert client.post(URL, body(team="infra", gpus=3), format="json").status_code == 201
    assert client.post(URL, body(team="infra", gpus=3), format="json").status_code == 201
    response = client.post(URL, body(team="infra", gpus=2), format="json")
    assert response.status_code == 409
    assert errors_of(response) == [("gpus", "fragmented")]
    assert "2 GPUs are free in total but no node has 2 free" in response.json()["detail"]


def test_it_refuses_when_not_enough_gpus_are_free(world, api):
    assert api(world.outsider).post(URL, body(team="infra", gpus=4), format="json").status_code == 201
    assert api(world.member).post(URL, body(gpus=4), format="json").status_code == 201
    response = api(world.member).post(URL, body(gpus=1), format="json")
    assert response.status_code == 409
    assert errors_of(response) == [("gpus", "insufficient_capacity")]


def test_it_places_a_later_window_on_gpus_busy_now(world, api):
    assert api(world.outsider).post(URL, body(team="infra", gpus=8, hours=2), format="json").status_code == 201
    later = api(world.member).post(URL, body(gpus=4, hours_from_now=3, hours=1), format="json")
    assert later.status_code == 201, later.content


def test_back_to_back_windows_do_not_overlap(world, api):
    start = timezone.now() + timedelta(hours=1)
    middle, end = start + timedelta(hours=1), start + timedelta(hours=2)
    client = api(world.outsider)
    first = client.post(URL, {"pool": "a100", "team": "infra", "gpus": 8, "starts_at": start.isoformat(),
                               "ends_at": middle.isoformat()}, format="json")
    second = client.post(URL, {"pool": "a100", "team": "infra", "gpus": 8, "starts_at": middle.isoformat(),
                                "ends_at": end.isoformat()}, format="json")
    assert (first.status_code, second.status_code) == (201, 201)


def test_it_skips_unhealthy_gpus_and_nodes(world, api):
    world.pool.gpus.filter(node__name="node-a").update(healthy=False)
    node_b = world.pool.gpus.filter(node__name="node-b").first().node
    node_b.schedulable = False
    node_b.save()
    response = api(world.member).post(URL, body(gpus=1), format="json")
    assert response.status_code == 409
    assert errors_of(response) == [("gpus", "insufficient_capacity")]


def test_it_refuses_over_quota_and_says_by_how_much(world, api):
    client = api(world.member)
    assert client.post(URL, body(gpus=4), format="json").status_code == 201
    response = client.post(URL, body(gpus=3), format="json")
    assert response.status_code == 409
    assert errors_of(response) == [("gpus", "quota_exceeded")]
    assert "would hold 7.00 GE in pool A100" in response.json()["detail"]
    assert "(quota 6.00, 1.00 over): 3 GPUs is 3.00 GE" in response.json()["detail"]


def test_quota_counts_only_reservations_that_overlap(world, api):
    client = api(world.member)
    assert client.post(URL, body(gpus=4, hours=1), format="json").status_code == 201
    later = client.post(URL, body(gpus=4, hours_from_now=2, hours=1), format="json")
    assert later.status_code == 201, later.content


def test_it_refuses_more_gpu_hours_than_the_month_allows(world, api):
    quota = world.team.quotas.get(pool=world.pool)
    quota.ge_hours_per_month = 10
    quota.save()
    # Book inside next month, so the test does not depend on today's date.
    next_month = month_start(timezone.now() + timedelta(days=32))
    start = next_month + timedelta(days=1)

    def book(offset_hours: int):
        s = start + timedelta(hours=offset_hours)
        return api(world.member).post(URL, body(gpus=2, starts_at=s.isoformat(),
                                                ends_at=(s + timedelta(hours=4)).isoformat()), format="json")

    assert book(0).status_code == 201  # 8 GPU-hours
    response = book(10)  # 8 more, not overlapping: only the monthly limit can refuse it
    assert response.status_code == 409
    assert errors_of(response) == [("ends_at", "ge_hours_exceeded")]
    assert "8.0 booked + 8.0 asked (2 GPUs) > 10 (6.0 over)" in response.json()["detail"]


def test_a_staff_quota_change_binds_the_next_reservation(world, api):
    quota = world.team.quotas.get(pool=world.pool)
    response = api(world.staff).patch(f"/api/v1/quotas/{quota.pk}/", {"max_ge": 1}, format="json")
    assert response.status_code == 200, response.content
    refused = api(world.member).post(URL, body(gpus=2), format="json")
    assert refused.status_code == 409
    assert errors_of(refused) == [("gpus", "quota_exceeded")]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"gpus": 0}, ("gpus", "min_value")),
        ({"gpus": -2}, ("gpus", "min_value")),
        ({"gpus": 1.5}, ("gpus", "invalid")),
        ({"gpus": "two"}, ("gpus", "invalid")),
        ({"gpus": None}, ("gpus", "null")),
        ({"gpus": [1]}, ("gpus", "invalid")),
        ({"pool": "nope"}, ("pool", "does_not_exist")),
        ({"pool": 7}, ("pool", "does_not_exist")),
        ({"team": "nope"}, ("team", "does_not_exist")),
        ({"ends_at": "tomorrow"}, ("ends_at", "invalid")),
        ({"ends_at": 12}, ("ends_at", "invalid")),
        ({"starts_at": "2026-13-45T99:00"}, ("starts_at", "invalid")),
    ],
)
def test_it_rejects_malformed_fields_naming_field_and_rule(world, api, overrides, expected):
    response = api(world.member).post(URL, body(**overrides), format="json")
    assert response.status_code == 400
    assert expected in errors_of(response)
    assert not Reservation.objects.exists()


def test_it_rejects_missing_fields(world, api):
    response = api(world.member).post(URL, {}, format="json")
    assert response.status_code == 400
    assert {("pool", "required"), ("team", "required"), ("ends_at", "required")} <= set(errors_of(response))


def test_a_whole_gpu_pool_needs_gpus(world, api):
    # Which amount a pool takes depends on its sharing mode, so the service asks for it, not the form.
    payload = body()
    del payload["gpus"]
    response = api(world.member).post(URL, payload, format="json")
    assert response.status_code == 400
    assert errors_of(response) == [("gpus", "required")]


def test_it_rejects_malformed_json(world, api):
    response = api(world.member).post(URL, '{"pool": "a100", "gpus": ', content_type="application/json")
    assert response.status_code == 400
    assert errors_of(response) == [("body", "malformed")]


def test_it_rejects_a_json_body_that_is_not_an_object(world, api):
    response = api(world.member).post(URL, "[1, 2]", content_type="application/json")
    assert response.status_code == 400
    assert errors_of(response)[0][1] == "invalid"


def test_it_rejects_an_end_before_the_start(world, api):
    start = timezone.now() + timedelta(hours=2)
    response = api(world.member).post(URL, body(starts_at=start.isoformat(),
                                                ends_at=(start - timedelta(hours=1)).isoformat()), format="json")
    assert response.status_code == 400
    assert errors_of(response) == [("ends_at", "after_starts_at")]


def test_it_rejects_a_window_in_the_past(world, api):
    start = timezone.now() - timedelta(days=2)
    response = api(world.member).post(URL, body(starts_at=start.isoformat(),
                                                ends_at=(start + timedelta(hours=1)).isoformat()), format="json")
    assert response.status_code == 400
    assert errors_of(response) == [("ends_at", "in_past")]


def test_it_rejects_a_start_long_past_even_when_the_end_is_ahead(world, api):
    start = timezone.now() - timedelta(hours=3)
    response = api(world.member).post(URL, body(starts_at=start.isoformat()), format="json")
    assert response.status_code == 400
    assert errors_of(response) == [("starts_at", "in_past")]


def test_it_rejects_a_window_longer_than_allowed(world, api):
    response = api(world.member).post(URL, body(hours=24 * 120), format="json")
    assert response.status_code == 400
    assert errors_of(response) == [("ends_at", "max_duration")]


def test_it_rejects_more_gpus_than_the_pool_has(world, api):
    response = api(world.member).post(URL, body(gpus=9), format="json")
    assert response.status_code == 400
    assert errors_of(response) == [("gpus", "exceeds_pool_size")]
    assert "has 8 GPUs; 9 requested" in response.json()["detail"]


def test_it_rejects_a_team_the_user_is_not_in(world, api):
    response = api(world.member).post(URL, body(team="infra"), format="json")
    assert response.status_code == 403
    assert errors_of(response) == [("team", "not_a_member")]
    assert not Reservation.objects.exists()


def test_it_rejects_a_pool_the_team_has_no_quota_in(world, api):
    response = api(world.member).post(URL, body(pool="l4"), format="json")
    assert response.status_code == 403
    assert errors_of(response) == [("pool", "no_quota")]


def test_it_needs_authentication(world, api):
    response = api().post(URL, body(), format="json")
    assert response.status_code in (401, 403)
    assert response.json()["errors"][0]["rule"] == "not_authenticated"


def test_a_refusal_writes_nothing(world, api):
    api(world.member).post(URL, body(gpus=4), format="json")
    counts = (Reservation.objects.count(), Allocation.objects.count(), ReservationEvent.objects.count())
    api(world.member).post(URL, body(gpus=4), format="json")  # over quota
    assert (Reservation.objects.count(), Allocation.objects.count(), ReservationEvent.objects.count()) == counts


def test_staff_may_reserve_for_any_team(world, api):
    response = api(world.staff).post(URL, body(team="ml"), format="json")
    assert response.status_code == 201


def test_quota_set_by_staff_through_the_api_is_created_once(world, api):
    staff = api(world.staff)
    created = staff.post("/api/v1/quotas/", {"team": "ml", "pool": "l4", "max_ge": 1}, format="json")
    assert created.status_code == 201, created.content
    again = staff.post("/api/v1/quotas/", {"team": "ml", "pool": "l4", "max_ge": 2}, format="json")
    assert again.status_code == 201
    assert QuotaFactory._meta.model.objects.filter(team=world.team, pool=world.other_pool).get().max_ge == 2


def test_an_extension_counts_the_hours_already_booked_by_the_same_reservation(world, api):
    quota = world.team.quotas.get(pool=world.pool)
    quota.ge_hours_per_month = 10
    quota.save()
    start = month_start(timezone.now() + timedelta(days=32)) + timedelta(days=1)
    client = api(world.member)
    booked = client.post(URL, body(gpus=2, starts_at=start.isoformat(),
                                   ends_at=(start + timedelta(hours=4)).isoformat()), format="json")
    assert booked.status_code == 201  # 8 of the 10 GPU-hours
    extend = f"{URL}{booked.json()['id']}/extend/"
    refused = client.post(extend, {"ends_at": (start + timedelta(hours=6)).isoformat()}, format="json")
    assert refused.status_code == 409  # 8 + 4 = 12 > 10
    assert errors_of(refused) == [("ends_at", "ge_hours_exceeded")]
    assert "8.0 booked + 4.0 asked (the extension) > 10 (2.0 over)" in refused.json()["detail"]
    assert client.post(extend, {"ends_at": (start + timedelta(hours=5)).isoformat()}, format="json").status_code == 200
