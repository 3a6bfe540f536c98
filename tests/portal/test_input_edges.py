"""Inputs at the edges of teams, members and quotas are refused with a 4xx naming the field and the rule.

Each of these once reached PostgreSQL raw and came back as a 500 (found by probing the review).
"""
from __future__ import annotations

import pytest
from django.test import Client

from allocations.models import Quota
from teams.models import Membership


def _rules(response) -> list[tuple[str, str]]:
    return [(e["field"], e["rule"]) for e in response.json()["errors"]]


def test_a_monthly_gpu_hour_limit_beyond_the_column_is_a_400_and_writes_nothing(world, api):
    # ge_hours_per_month is DECIMAL(10, 1): 2**31 has more whole digits than its nine.
    response = api(world.staff).post("/api/v1/quotas/", {"team": "ml", "pool": "l4", "max_ge": 1,
                                                         "ge_hours_per_month": 2**31}, format="json")
    assert response.status_code == 400
    assert ("ge_hours_per_month", "max_whole_digits") in _rules(response)
    assert not Quota.objects.filter(team=world.team, pool=world.other_pool).exists()


def test_the_quota_service_checks_values_before_it_writes(world):
    from django.core.exceptions import ValidationError

    from allocations import services

    with pytest.raises(ValidationError) as refused:
        services.quota_set(actor=world.staff, team=world.team, pool=world.other_pool, max_ge=1,
                           ge_hours_per_month=2**31)
    assert "ge_hours_per_month" in refused.value.message_dict
    assert not Quota.objects.filter(team=world.team, pool=world.other_pool).exists()


@pytest.mark.parametrize("field", ["team", "pool"])
def test_a_nul_byte_in_a_quotas_team_or_pool_is_a_400(world, api, field):
    body = {"team": "ml", "pool": "l4", "max_ge": 1, field: "l\x004"}
    response = api(world.staff).post("/api/v1/quotas/", body, format="json")
    assert response.status_code == 400
    assert (field, "invalid") in _rules(response)


@pytest.mark.parametrize("path", ["/api/v1/teams/a%00b/", "/api/v1/teams/a%00b/members/", "/api/v1/pools/a%00b/"])
def test_a_nul_byte_in_a_team_or_pool_url_is_a_json_404(world, api, path):
    response = api(world.staff).get(path)
    assert response.status_code == 404
    assert response.json()["errors"][0]["rule"] == "not_found"


def test_an_unknown_api_url_is_a_json_404(world, api):
    response = api(world.staff).get("/api/v1/no-such-thing/")
    assert response.status_code == 404
    assert response.json()["errors"] == [{"field": "", "rule": "not_found", "message": response.json()["detail"]}]
    assert Client().get("/no-such-page/")["Content-Type"].startswith("text/html")


def test_removing_a_malformed_username_on_the_team_page_is_a_400(world):
    client = Client()
    client.force_login(world.owner)
    for username in ("a\x00b", "x" * 151):
        response = client.post("/teams/ml/", {"remove": username})
        assert response.status_code == 400
    assert Membership.objects.filter(team=world.team).count() == 2


def test_members_cannot_learn_which_team_slugs_exist_by_creating_teams(world, api):
    client = api(world.member)
    taken = client.post("/api/v1/teams/", {"slug": "infra", "name": "Guess"}, format="json")
    free = client.post("/api/v1/teams/", {"slug": "no-such-team", "name": "Guess"}, format="json")
    assert taken.status_code == free.status_code == 403  # was 400 "already exists" for infra
    assert taken.json() == free.json()


@pytest.mark.parametrize("method, url, body, field", [
    ("post", "/api/v1/nodes/", {"cluster": "lab\x00", "name": "node-z"}, "cluster"),
    ("post", "/api/v1/host-tokens/", {"cluster": "lab\x00", "host_name": "node-z"}, "cluster"),
    ("patch", "gpu", {"pool": "a100\x00"}, "pool"),
    ("post", "/api/v1/alert-rules/", {"name": "hot", "metric": "temperature", "threshold": 80,
                                      "pool": "a100\x00"}, "pool"),
    ("post", "/api/v1/silences/", {"pool": "a100\x00", "ends_at": "2099-01-01T00:00:00Z"}, "pool"),
])
def test_a_nul_byte_in_a_slug_of_the_fleet_api_is_a_400(world, api, method, url, body, field):
    from inventory.models import Gpu

    if url == "gpu":
        url = f"/api/v1/gpus/{Gpu.objects.order_by('pk').first().pk}/"
    response = getattr(api(world.staff), method)(url, body, format="json")
    assert response.status_code == 400, response.content
    assert (field, "invalid") in _rules(response)


def test_quotas_take_and_answer_ge_as_json_numbers(world, api):
    staff = api(world.staff)
    response = staff.post("/api/v1/quotas/", {"team": "ml", "pool": "l4", "max_ge": 2.5,
                                              "ge_hours_per_month": "120.5"}, format="json")
    assert response.status_code == 201, response.content
    assert (response.json()["max_ge"], response.json()["ge_hours_per_month"]) == (2.5, 120.5)
    quota = Quota.objects.get(team=world.team, pool=world.other_pool)
    assert (str(quota.max_ge), str(quota.ge_hours_per_month)) == ("2.50", "120.5")
    listed = staff.get(f"/api/v1/quotas/{quota.pk}/").json()
    assert listed["max_ge"] == 2.5 and listed["ge_hours_per_month"] == 120.5
    assert staff.patch(f"/api/v1/quotas/{quota.pk}/", {"ge_hours_per_month": None},
                       format="json").json()["ge_hours_per_month"] is None


@pytest.mark.parametrize(("body", "field", "rule"), [
    ({"max_ge": -0.5}, "max_ge", "min_value"),
    ({"max_ge": 1.125}, "max_ge", "max_decimal_places"),
    ({"max_ge": 10**7}, "max_ge", "max_whole_digits"),
    ({"max_ge": "lots"}, "max_ge", "invalid"),
    ({"max_ge": 1, "ge_hours_per_month": -1}, "ge_hours_per_month", "min_value"),
    ({"max_ge": 1, "ge_hours_per_month": 1.25}, "ge_hours_per_month", "max_decimal_places"),
    ({"max_ge": 1, "max_gpus": 4}, "max_gpus", "unknown_field"),
])
def test_bad_quota_numbers_are_a_400_naming_the_field_and_the_rule(world, api, body, field, rule):
    response = api(world.staff).post("/api/v1/quotas/", {"team": "ml", "pool": "l4", **body}, format="json")
    assert response.status_code == 400, response.content
    assert (field, rule) in _rules(response)
    assert not Quota.objects.filter(team=world.team, pool=world.other_pool).exists()
