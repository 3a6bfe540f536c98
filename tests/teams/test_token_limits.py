"""Personal access tokens people can trust: an expiry and a maximum age, a read-only scope, a limit
to some teams, listed and revoked by API; none of it lost to the cached lookup."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from allocations.models import Reservation
from teams.models import ApiToken, Membership
from teams.services import api_token_create
from tests.factories import PASSWORD, MembershipFactory, window

TOKENS = "/api/v1/tokens/"


def _client(api, key):
    client = api()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def _book(client, team="ml"):
    return client.post("/api/v1/reservations/", {"pool": "a100", "team": team, "gpus": 1,
                                                 "ends_at": window(0, 2)[1].isoformat()}, format="json")


def test_a_read_only_token_reads_and_is_refused_every_write_with_nothing_written(world, api):
    _, key = api_token_create(user=world.member, scope=ApiToken.Scope.READ)
    client = _client(api, key)
    assert client.get("/api/v1/reservations/").status_code == 200
    refused = _book(client)
    assert refused.status_code == 403
    assert refused.json()["errors"][0] == {"field": "token", "rule": "token_read_only",
                                           "message": "This API token is read-only: it cannot change anything."}
    assert not Reservation.objects.exists()
    assert client.post(TOKENS, {"name": "more"}, format="json").status_code == 403  # nor make a wider one


def test_a_token_stops_at_its_expiry_even_while_its_lookup_is_cached(world, api, monkeypatch):
    token, key = api_token_create(user=world.member, expires_at=timezone.now() + timedelta(minutes=5))
    client = _client(api, key)
    assert client.get("/api/v1/reservations/").status_code == 200  # cached now
    later = (timezone.now() + timedelta(minutes=6)).timestamp()
    monkeypatch.setattr("teams.tokens.time.time", lambda: later)
    assert client.get("/api/v1/reservations/").status_code == 401


def test_the_staff_set_maximum_age_ends_old_tokens_that_had_no_expiry(world, api, settings):
    token, key = api_token_create(user=world.member)
    # As made before expiries existed: no expiry of its own, 200 days old.
    ApiToken.objects.filter(pk=token.pk).update(expires_at=None, created_at=timezone.now() - timedelta(days=200))
    client = _client(api, key)
    settings.API_TOKEN_MAX_AGE_DAYS = 365
    assert client.get("/api/v1/reservations/").status_code == 200
    settings.API_TOKEN_MAX_AGE_DAYS = 180
    ApiToken.objects.get(pk=token.pk).save()  # any save drops the cached lookup, as a setting's restart does
    assert client.get("/api/v1/reservations/").status_code == 401


def test_a_team_limited_token_sees_and_books_for_its_teams_only(world, api):
    MembershipFactory(user=world.member, team=world.other_team)
    _book(api(world.outsider), team="infra")  # one of infra's
    _, key = api_token_create(user=world.member, team_slugs=["ml"])
    client = _client(api, key)
    assert _book(client).status_code == 201
    assert {row["team"] for row in client.get("/api/v1/reservations/").json()["results"]} == {"ml"}
    assert [team["slug"] for team in client.get("/api/v1/teams/").json()["results"]] == ["ml"]
    assert _book(client, team="infra").status_code in (403, 404)
    assert Reservation.objects.filter(team=world.other_team).count() == 1
    # The same user's unlimited token sees both teams.
    _, wide = api_token_create(user=world.member)
    assert {row["team"] for row in _client(api, wide).get("/api/v1/reservations/").json()["results"]} == {"ml", "infra"}


def test_a_team_limited_token_of_staff_carries_no_staff_power_and_its_user_is_never_saved(world, api):
    MembershipFactory(user=world.staff, team=world.team, role=Membership.Role.MANAGER)
    _, key = api_token_create(user=world.staff, team_slugs=["ml"])
    client = _client(api, key)
    assert client.get("/api/v1/apply-jobs/").status_code == 403
    _, full = api_token_create(user=world.staff)
    assert _client(api, full).get("/api/v1/apply-jobs/").status_code == 200
    from teams.tokens import user_for_token
    limited_user = user_for_token(key)
    assert limited_user.is_staff is False
    with pytest.raises(RuntimeError):
        limited_user.save()
    world.staff.refresh_from_db()
    assert world.staff.is_staff


def test_a_token_made_with_a_token_does_no_more_and_lives_no_longer(world, api):
    MembershipFactory(user=world.member, team=world.other_team)
    ends = timezone.now() + timedelta(days=2)
    _, key = api_token_create(user=world.member, team_slugs=["ml"], expires_at=ends)
    client = _client(api, key)
    wider = client.post(TOKENS, {"name": "wider"}, format="json")
    assert wider.status_code == 403 and wider.json()["errors"][0]["rule"] == "beyond_token_teams"
    other = client.post(TOKENS, {"teams": ["infra"]}, format="json")  # a team this key cannot see
    assert other.status_code == 400 and other.json()["errors"][0]["rule"] == "not_your_team"
    made = client.post(TOKENS, {"teams": ["ml"], "expires_at": (ends + timedelta(days=30)).isoformat()},
                       format="json")
    assert made.status_code == 201
    assert abs(ApiToken.objects.get(prefix=made.json()["prefix"]).ends_at() - ends) < timedelta(seconds=1)


def test_tokens_are_listed_without_keys_made_and_revoked_by_api(world, api):
    client = api(world.member)
    made = client.post(TOKENS, {"name": "ci", "scope": "read", "teams": ["ml"]}, format="json")
    assert made.status_code == 201
    body = made.json()
    assert body["scope"] == "read" and body["teams"] == ["ml"] and body["name"] == "ci"
    key = body["token"]
    assert key.startswith(body["prefix"])
    listed = client.get(TOKENS).json()["results"]
    assert [row["prefix"] for row in listed] == [body["prefix"]]
    assert set(listed[0]) == {"prefix", "name", "scope", "teams", "created_at", "expires_at", "last_used_at"}
    assert api(world.outsider).delete(f"{TOKENS}{body['prefix']}/").status_code == 404  # not theirs
    assert _client(api, key).get("/api/v1/reservations/").status_code == 200
    assert client.delete(f"{TOKENS}{body['prefix']}/").status_code == 204
    assert _client(api, key).get("/api/v1/reservations/").status_code == 401


def test_the_sign_in_endpoint_takes_the_same_limits(world, api):
    answer = api().post("/api/v1/auth/token/", {"username": "member", "password": PASSWORD, "scope": "read",
                                               "teams": ["ml"], "name": "laptop"}, format="json")
    assert answer.status_code == 200
    token = ApiToken.objects.get(prefix=answer.json()["prefix"])
    assert token.scope == "read" and [t.slug for t in token.teams.all()] == ["ml"]
    default_end = timezone.now() + timedelta(days=90)
    assert abs(token.ends_at() - default_end) < timedelta(minutes=1)


@pytest.mark.parametrize(("body", "field", "rule"), [
    ({"expires_at": "2001-01-01T00:00:00Z"}, "expires_at", "in_past"),
    ({"expires_at": "2999-01-01T00:00:00Z"}, "expires_at", "too_long"),
    ({"teams": ["infra"]}, "teams", "not_your_team"),
    ({"teams": ["no-such-team"]}, "teams", "not_your_team"),
    ({"scope": "admin"}, "scope", "invalid_choice"),
    ({"bogus": 1}, "bogus", "unknown_field"),
])
def test_bad_token_requests_name_the_field_and_the_rule(world, api, body, field, rule):
    answer = api(world.member).post(TOKENS, body, format="json")
    assert answer.status_code == 400
    assert (answer.json()["errors"][0]["field"], answer.json()["errors"][0]["rule"]) == (field, rule)
    assert not ApiToken.objects.exists()


def test_me_says_who_which_teams_and_what_the_token_allows(world, api):
    MembershipFactory(user=world.member, team=world.other_team)
    _, key = api_token_create(user=world.member, team_slugs=["ml"], scope=ApiToken.Scope.READ)
    me = _client(api, key).get("/api/v1/me/").json()
    assert me["username"] == "member" and me["is_staff"] is False
    assert me["teams"] == [{"slug": "ml", "name": "ML", "role": "member"}]
    assert me["token"]["scope"] == "read" and me["token"]["teams"] == ["ml"]
    by_session = api(world.member).get("/api/v1/me/").json()
    assert [t["slug"] for t in by_session["teams"]] == ["infra", "ml"] and by_session["token"] is None
    assert api().get("/api/v1/me/").status_code in (401, 403)


def test_the_admin_shows_a_tokens_limits_but_never_its_digest(world):
    from django.test import Client
    token, key = api_token_create(user=world.member, team_slugs=["ml"], scope=ApiToken.Scope.READ)
    client = Client()
    client.force_login(world.staff)
    page = client.get(f"/admin/teams/apitoken/{token.pk}/change/")
    assert page.status_code == 200
    body = page.content.decode()
    assert "Read only" in body and token.digest not in body and key not in body
    assert client.get("/admin/teams/apitoken/").status_code == 200
