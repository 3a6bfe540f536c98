"""Racing writes about teams and their members: the second of two racing requests gets a 4xx, never a 500."""
from __future__ import annotations

import pytest

from teams import services
from teams.models import Membership, Team
from tests.factories import UserFactory
from tests.races import race_past_the_check

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_the_same_user_added_twice_at_once_is_one_membership_and_one_409(world, monkeypatch):
    UserFactory(username="newcomer")
    outcomes = race_past_the_check(monkeypatch, Membership, lambda: services.membership_add(
        actor=world.owner, team=world.team, username="newcomer"))
    assert outcomes == ["Conflict", "written"]  # was ["IntegrityError", "written"]: a 500
    assert Membership.objects.filter(team=world.team, user__username="newcomer").count() == 1


def test_the_same_team_slug_created_twice_at_once_is_one_team_and_one_409(world, monkeypatch):
    outcomes = race_past_the_check(monkeypatch, Team, lambda: services.team_create(
        actor=world.staff, slug="vision", name="Vision"))
    assert outcomes == ["Conflict", "written"]
    assert Team.objects.filter(slug="vision").count() == 1
