"""The tokens page: make a token (its key shown once, never cached), list, revoke with a question
first (the no-JavaScript path asks on a page)."""
from __future__ import annotations

import pytest
from django.test import Client

from teams.models import ApiToken
from teams.services import api_token_create


@pytest.fixture
def member(world) -> Client:
    client = Client()
    client.force_login(world.member)
    return client


def test_a_token_made_on_the_page_is_shown_once_and_works_with_its_limits(world, member, api):
    page = member.post("/tokens/", {"name": "ci", "scope": "read", "teams": ["ml"], "days": "30"})
    assert page.status_code == 200
    assert "no-store" in page["Cache-Control"] or "no-cache" in page["Cache-Control"]
    key = page.context["new_key"]
    assert key and key in page.content.decode()
    token = ApiToken.objects.get()
    assert (token.name, token.scope, [t.slug for t in token.teams.all()]) == ("ci", "read", ["ml"])
    client = api()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get("/api/v1/reservations/").status_code == 200
    assert client.post("/api/v1/reservations/", {}, format="json").status_code == 403
    again = member.get("/tokens/").content.decode()
    assert key not in again and f"{token.prefix}…" in again  # listed by its prefix only


def test_the_form_offers_only_the_users_teams_and_refuses_others(world, member):
    page = member.get("/tokens/").content.decode()
    assert 'value="ml"' in page and 'value="infra"' not in page
    refused = member.post("/tokens/", {"scope": "write", "teams": ["infra"], "days": "30"})
    assert refused.status_code == 400 and not ApiToken.objects.exists()
    too_long = member.post("/tokens/", {"scope": "write", "days": "9999"})
    assert too_long.status_code == 400 and not ApiToken.objects.exists()


def test_revoke_asks_on_a_page_without_javascript_then_revokes(world, member):
    token, _ = api_token_create(user=world.member, name="laptop")
    asked = member.post("/tokens/revoke/", {"prefix": token.prefix})
    assert asked.status_code == 200 and "Revoke token" in asked.content.decode()
    assert ApiToken.objects.filter(pk=token.pk).exists()
    done = member.post("/tokens/revoke/", {"prefix": token.prefix, "confirm": "yes"})
    assert done.status_code == 302 and not ApiToken.objects.filter(pk=token.pk).exists()


def test_nobody_revokes_anothers_token(world):
    token, _ = api_token_create(user=world.outsider)
    client = Client()
    client.force_login(world.member)
    client.post("/tokens/revoke/", {"prefix": token.prefix, "confirm": "yes"})
    assert ApiToken.objects.filter(pk=token.pk).exists()
