"""Staff manage teams, members and API tokens in the admin, under the teams app."""
from __future__ import annotations

import pytest
from django.test import Client

from teams.services import api_token_create


@pytest.mark.django_db
@pytest.mark.parametrize("model", ["team", "membership", "apitoken"])
def test_staff_see_the_teams_models_in_the_admin(world, model):
    api_token_create(user=world.member, name="laptop")
    client = Client()
    client.force_login(world.staff)
    changelist = client.get(f"/admin/teams/{model}/")
    assert changelist.status_code == 200
    assert client.get("/admin/").content.count(b'href="/admin/teams/') >= 3
    assert client.get(f"/admin/portal/{model}/").status_code == 404


@pytest.mark.django_db
def test_staff_edit_a_team_with_its_members_in_the_admin(world):
    client = Client()
    client.force_login(world.staff)
    page = client.get(f"/admin/teams/team/{world.team.pk}/change/")
    assert page.status_code == 200 and b"owner" in page.content
