"""Token auth for scripts, session login for pages, and throttling of both."""
from __future__ import annotations

import pickle

from django.contrib.sessions.models import Session
from django.core.cache import cache
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from common.secrets import key_digest
from teams.models import ApiToken
from teams.services import api_token_create
from teams.tokens import _cache_key
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
    token, key = api_token_create(user=user)
    client = api()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
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
    assert not [q for q in queries.captured_queries if "apitoken" in q["sql"] or "auth_user" in q["sql"]]
    with CaptureQueriesContext(connection) as signed_in:  # the same call with the user given outright
        assert api(world.member).get("/api/v1/pools/").status_code == 200
    assert len(queries.captured_queries) == len(signed_in.captured_queries)


def test_the_database_keeps_no_token_only_its_prefix_and_digest(world, api):
    key = api().post(TOKEN_URL, {"username": "member", "password": PASSWORD}, format="json").json()["token"]
    token = ApiToken.objects.get(user=world.member)
    assert token.digest == key_digest(key) and token.prefix == key[:12]
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM teams_apitoken")
        assert not [row for row in cursor.fetchall() if any(key in str(value) for value in row)]
    assert "authtoken_token" not in connection.introspection.table_names()


def test_the_cached_lookup_holds_no_password_hash(world, api):
    client, token = _token_client(api, world.member)
    assert client.get("/api/v1/reservations/").status_code == 200
    cached = cache.get(_cache_key(token.digest))
    assert cached is not None
    dumped = pickle.dumps(cached)
    assert world.member.password.encode() not in dumped and b"password" not in dumped
    assert b"django.contrib.auth" not in dumped  # plain values, not a User


def test_each_sign_in_makes_a_new_token_shown_once_and_all_of_them_work(world, api):
    keys = [api().post(TOKEN_URL, {"username": "member", "password": PASSWORD, "name": f"ci-{i}"},
                       format="json").json()["token"] for i in range(2)]
    assert keys[0] != keys[1]
    assert sorted(ApiToken.objects.filter(user=world.member).values_list("name", flat=True)) == ["ci-0", "ci-1"]
    for key in keys:
        client = api()
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
        assert client.get("/api/v1/reservations/").status_code == 200


def test_a_user_keeps_only_the_newest_tokens(world, api, settings):
    settings.API_TOKENS_PER_USER = 2
    oldest, _ = api_token_create(user=world.member, name="oldest")
    api_token_create(user=world.member, name="older")
    api_token_create(user=world.member, name="new")
    assert sorted(ApiToken.objects.filter(user=world.member).values_list("name", flat=True)) == ["new", "older"]


def test_deleting_through_the_token_endpoint_signs_that_token_out(world, api):
    client, token = _token_client(api, world.member)
    other, _ = _token_client(api, world.member)
    assert client.delete(TOKEN_URL).status_code == 204
    assert client.get("/api/v1/reservations/").status_code == 401
    assert other.get("/api/v1/reservations/").status_code == 200
    assert api().delete(TOKEN_URL).status_code == 401


def test_a_password_change_deletes_the_users_tokens_at_once(world, api):
    client, _ = _token_client(api, world.member)
    other, _ = _token_client(api, world.outsider)
    assert client.get("/api/v1/reservations/").status_code == 200  # now cached
    world.member.set_password("a-new-and-long-password")
    world.member.save()
    assert client.get("/api/v1/reservations/").status_code == 401
    assert not ApiToken.objects.filter(user=world.member).exists()
    assert other.get("/api/v1/reservations/").status_code == 200


def test_a_deactivation_deletes_the_users_tokens_so_reactivating_does_not_revive_them(world, api):
    client, _ = _token_client(api, world.member)
    assert client.get("/api/v1/reservations/").status_code == 200
    world.member.is_active = False
    world.member.save()
    assert not ApiToken.objects.filter(user=world.member).exists()
    world.member.is_active = True
    world.member.save()
    assert client.get("/api/v1/reservations/").status_code == 401


def test_other_saves_of_the_user_keep_the_tokens(world, api):
    client, _ = _token_client(api, world.member)
    world.member.email = "member@example.org"
    world.member.save()
    world.member.save(update_fields=["last_login"])
    assert client.get("/api/v1/reservations/").status_code == 200


def _signed_in_page(user):
    client = Client()
    assert client.post("/login/", {"username": user.username, "password": PASSWORD}).status_code == 302
    assert client.get("/").status_code == 200
    return client


def _sessions_of(user) -> int:
    return sum(session.get_decoded().get("_auth_user_id") == str(user.pk) for session in Session.objects.all())


def test_a_password_change_ends_the_users_sessions(world):
    client, bystander = _signed_in_page(world.member), _signed_in_page(world.owner)
    world.member.set_password("a-new-and-long-password")
    world.member.save()
    assert _sessions_of(world.member) == 0
    assert client.get("/").status_code == 302
    assert bystander.get("/").status_code == 200


def test_a_deactivation_ends_the_users_sessions(world):
    client = _signed_in_page(world.member)
    world.member.is_active = False
    world.member.save()
    assert _sessions_of(world.member) == 0
    world.member.is_active = True
    world.member.save()
    assert client.get("/").status_code == 302


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


def test_changing_ones_own_password_in_the_admin_keeps_that_session_and_ends_the_others(world):
    here, elsewhere = _signed_in_page(world.staff), _signed_in_page(world.staff)
    response = here.post(f"/admin/auth/user/{world.staff.pk}/password/",
                         {"password1": "a-new-and-long-password", "password2": "a-new-and-long-password"})
    assert response.status_code == 302
    assert here.get("/").status_code == 200
    assert elsewhere.get("/").status_code == 302
    assert _sessions_of(world.staff) == 1


def test_a_token_user_has_its_own_columns_not_shifted_ones(world, api):
    # Model.from_db takes values in the model's field order: given another order, the username landed
    # in is_superuser (a truthy string: every has_perm said yes) and the first name in username.
    world.member.first_name, world.member.email = "Mia", "mia@example.com"
    world.member.save()
    _, key = api_token_create(user=world.member)
    from teams.tokens import user_for_token
    for _ in range(2):  # from the database, then from the cache
        user = user_for_token(key)
        assert (user.username, user.first_name, user.email) == ("member", "Mia", "mia@example.com")
        assert user.is_active is True and user.is_staff is False and user.is_superuser is False
        assert not user.has_perm("teams.delete_team")
