"""A team's team-wide cap in GPU-equivalents (Team.max_ge): staff set it (API and admin), null is no
cap, everyone in the team reads it, bad numbers are a 400 naming max_ge."""
from __future__ import annotations

from decimal import Decimal

import pytest

from teams.models import Team


def test_staff_set_and_clear_a_teams_ge_cap_and_members_read_it(world, api):
    staff = api(world.staff)
    response = staff.patch("/api/v1/teams/ml/", {"max_ge": 12.5}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["max_ge"] == 12.5
    assert Team.objects.get(slug="ml").max_ge == Decimal("12.50")
    assert api(world.member).get("/api/v1/teams/ml/").json()["max_ge"] == 12.5
    assert staff.patch("/api/v1/teams/ml/", {"max_ge": None}, format="json").json()["max_ge"] is None
    assert Team.objects.get(slug="ml").max_ge is None
    created = staff.post("/api/v1/teams/", {"slug": "capped", "name": "Capped", "max_ge": 4}, format="json")
    assert created.status_code == 201 and created.json()["max_ge"] == 4
    assert api(world.member).get("/api/v1/teams/").json()["results"][0]["max_ge"] is None


@pytest.mark.parametrize("who", ["owner", "member", "outsider"])
def test_only_staff_change_the_cap(world, api, who):
    response = api(getattr(world, who)).patch("/api/v1/teams/ml/", {"max_ge": 100}, format="json")
    assert response.status_code == 403
    assert Team.objects.get(slug="ml").max_ge is None


@pytest.mark.parametrize(("value", "rule"), [(-1, "min_value"), (0.125, "max_decimal_places"),
                                             (10**7, "max_whole_digits"), ("many", "invalid")])
def test_bad_caps_are_a_400_naming_max_ge(world, api, value, rule):
    response = api(world.staff).patch("/api/v1/teams/ml/", {"max_ge": value}, format="json")
    assert response.status_code == 400
    assert ("max_ge", rule) in [(e["field"], e["rule"]) for e in response.json()["errors"]]
    assert Team.objects.get(slug="ml").max_ge is None


def test_unknown_team_fields_are_refused(world, api):
    response = api(world.staff).patch("/api/v1/teams/ml/", {"max_gpus": 3}, format="json")
    assert response.status_code == 400
    assert response.json()["errors"][0] == {"field": "max_gpus", "rule": "unknown_field",
                                            "message": "Unknown field 'max_gpus': this endpoint takes max_ge, name, slug."}


def test_the_admin_sets_the_cap_and_refuses_a_negative_one(world, client):
    client.force_login(world.staff)
    url = f"/admin/teams/team/{world.team.pk}/change/"
    form = {"slug": "ml", "name": "ML", "max_ge": "-1", "memberships-TOTAL_FORMS": "0",
            "memberships-INITIAL_FORMS": "0", "memberships-MIN_NUM_FORMS": "0", "memberships-MAX_NUM_FORMS": "1000"}
    response = client.post(url, form)
    assert response.status_code == 200 and "max_ge must be at least 0" in response.content.decode()
    response = client.post(url, {**form, "max_ge": "7.5"})
    assert response.status_code == 302
    assert Team.objects.get(slug="ml").max_ge == Decimal("7.50")
