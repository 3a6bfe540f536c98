"""Token auth for scripts, session login for pages, and throttling of both."""
from __future__ import annotations

from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token

from tests.factories import PASSWORD

TOKEN_URL = "/api/v1/auth/token/"


def test_a_token_from_username_and_password_authenticates_the_api(world, api):
    response = api().post(TOKEN_URL, {"username": "member", "password": PASSWORD}, format="json")
    assert response.status_code == 200
    token = response.json()["token"]
    client = api()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/v1/reservations/").status_code == 200


def test_a_wrong_password_gets_no_token(world, api):
    response = api().post(TOKEN_URL, {"username": "member", "password": "nope"}, format="json")
    assert response.status_code == 400
    assert response.json()["errors"][0]["rule"] == "invalid_credentials"


def test_a_wrong_token_is_401(world, api):
    client = api()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    assert client.get("/api/v1/reservations/").status_code == 401


def _token_client(api, user):
    token, _ = Token.objects.get_or_create(user=user)
    client = api()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client, token


def test_a_deleted_token_stops_working_at_once_although_lookups_are_cached(world, api):
    client, token = _token_client(api, world.member)
    assert client.get("/api/v1/reservations/").status_code == 200  # now cached
    token.delete()
    assert client.get("/api/v1/reservations/").status_code == 401


def test_a_deactivated_user_is_refused_at_once_and_a_new_staff_flag_holds_at_once(world, api):
    client, _ = _token_client(api, world.member)
    assert client.get("/api/v1/apply-jobs/").status_code == 403  # cached as a plain member
    world.member.is_staff = True
    world.member.save()
    assert client.get("/api/v1/apply-jobs/").status_code == 200
    world.member.is_active = False
    world.member.save()
    assert client.get("/api/v1/reservations/").status_code == 401


def test_cached_token_lookups_cost_no_query(world, api):
    client, _ = _token_client(api, world.member)
    client.get("/api/v1/pools/")
    with CaptureQueriesContext(connection) as queries:
        assert client.get("/api/v1/pools/").status_code == 200
    assert not [q for q in queries.captured_queries if "authtoken_token" in q["sql"]]


def test_repeated_failures_lock_the_username_out_of_the_token_endpoint(world, api, settings):
    client = api()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        client.post(TOKEN_URL, {"username": "member", "password": "nope"}, format="json")
    response = client.post(TOKEN_URL, {"username": "member", "password": PASSWORD}, format="json")
    assert response.status_code == 429
    assert response.json()["errors"][0]["rule"] == "locked_out"


def test_the_token_endpoint_is_rate_limited(world, api, settings):
    settings.AXES_FAILURE_LIMIT = 1000
    client = api()
    statuses = [client.post(TOKEN_URL, {"username": f"x{i}", "password": "p"}, format="json").status_code
                for i in range(25)]
    assert statuses[-1] == 429
    assert 400 in statuses


def test_pages_need_a_session_login(world):
    client = Client()
    assert client.get("/").status_code == 302
    assert client.post("/login/", {"username": "member", "password": PASSWORD}).status_code == 302
    assert client.get("/").status_code == 200


def test_repeated_failed_page_logins_lock_out(world, settings):
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert client.post("/login/", {"username": "member", "password": "nope"}).status_code == 200
    assert client.post("/login/", {"username": "member", "password": "nope"}).status_code == 429
    response = client.post("/login/", {"username": "member", "password": PASSWORD})
    assert response.status_code == 429
    assert b"Too many failed sign-ins" in response.content


def test_pages_enforce_csrf(world):
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.member)
    assert client.post("/reserve/", {"team": "ml"}).status_code == 403
