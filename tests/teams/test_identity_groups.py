"""Memberships follow the provider's groups (teams/identity.py), and LOCAL_LOGIN=staff keeps passwords
for the break-glass accounts only."""
from __future__ import annotations

from django.contrib.auth import authenticate
from django.test import RequestFactory

from teams.identity import memberships_follow_groups
from teams.models import GroupMapping, Membership
from tests.factories import PASSWORD, MembershipFactory, TeamFactory


def _teams(user) -> dict:
    return dict(Membership.objects.filter(user=user).values_list("team__slug", "role"))


def test_mapped_teams_follow_the_groups_and_unmapped_teams_keep_what_managers_set(world):
    hand_made = TeamFactory(slug="hand-made")
    MembershipFactory(user=world.member, team=hand_made)  # no mapping names it: left alone
    GroupMapping.objects.create(group="ml", team=world.team, role="member")
    GroupMapping.objects.create(group="ml-leads", team=world.team, role="manager")
    GroupMapping.objects.create(group="infra", team=world.other_team, role="member")

    sync = memberships_follow_groups(user=world.member, groups=["ml-leads", "ml", "other"], source="oidc")
    assert _teams(world.member) == {"ml": "manager", "hand-made": "member"}
    assert sync.changed == [("ml", "manager")] and not sync.left

    sync = memberships_follow_groups(user=world.member, groups=["infra"], source="oidc")
    assert _teams(world.member) == {"infra": "member", "hand-made": "member"}
    assert sync.joined == [("infra", "member")] and sync.left == ["ml"]

    assert not memberships_follow_groups(user=world.member, groups=["infra"], source="oidc")  # nothing changes


def test_staff_follows_the_groups_once_a_mapping_grants_it_but_superusers_keep_theirs(world):
    memberships_follow_groups(user=world.member, groups=["admins"], source="oidc")
    assert not world.member.is_staff  # no staff mapping yet: staff is set by hand only
    GroupMapping.objects.create(group="admins", staff=True)
    assert memberships_follow_groups(user=world.member, groups=["admins"], source="oidc").staff is True
    world.member.refresh_from_db()
    assert world.member.is_staff
    memberships_follow_groups(user=world.member, groups=[], source="oidc")
    world.member.refresh_from_db()
    assert not world.member.is_staff
    memberships_follow_groups(user=world.staff, groups=[], source="oidc")  # a superuser: the break-glass
    world.staff.refresh_from_db()
    assert world.staff.is_staff


def test_local_login_staff_lets_only_staff_sign_in_with_a_password(world, settings, api):
    request = RequestFactory().post("/login/")
    settings.LOCAL_LOGIN = "staff"
    assert authenticate(request, username="member", password=PASSWORD) is None
    assert authenticate(request, username="staff", password=PASSWORD) == world.staff
    refused = api().post("/api/v1/auth/token/", {"username": "member", "password": PASSWORD}, format="json")
    assert refused.status_code == 400
    settings.LOCAL_LOGIN = "all"
    assert authenticate(request, username="member", password=PASSWORD) == world.member


def test_without_configuration_single_sign_on_is_off(world, client):
    assert client.get("/oidc/authenticate/").status_code == 404
    assert "Sign in with" not in client.get("/login/").content.decode()


def test_staff_manage_group_mappings_by_api_and_others_cannot(world, api):
    made = api(world.staff).post("/api/v1/group-mappings/", {"group": "cn=ml,ou=groups,dc=example,dc=com",
                                                             "team": "ml", "role": "manager"}, format="json")
    assert made.status_code == 201 and made.json()["team"] == "ml"
    refused = api(world.staff).post("/api/v1/group-mappings/", {"group": "x"}, format="json")
    assert refused.status_code == 400 and refused.json()["errors"][0]["rule"] == "gives_nothing"
    assert api(world.owner).get("/api/v1/group-mappings/").status_code == 403
    assert api(world.staff).get("/api/v1/group-mappings/").json()["count"] == 1
