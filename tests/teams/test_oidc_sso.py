"""Single sign-on through a real OpenID Connect provider (django-oauth-toolkit's, in its own process,
requiring PKCE), driven through the browser's login redirect in headless Chromium; teams follow the
provider's groups at each sign-in."""
from __future__ import annotations

import json
import os
import sqlite3
import sys

import httpx
import pytest

from teams.models import GroupMapping, Membership
from tests.conftest import free_port, start_server, stop_process_group

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CLIENT_ID, CLIENT_SECRET = "gpupool-portal", "test-client-secret-0123456789"
DANA = {"username": "dana", "password": "dana-Pass-2026!", "email": "dana@example.com", "first_name": "Dana",
        "groups": ["gpu-ml", "gpu-ml-leads", "unrelated"]}


@pytest.fixture
def idp(live_server, tmp_path, settings):
    port = free_port()
    issuer = f"http://127.0.0.1:{port}/o"

    def discovery_answers() -> bool:
        try:
            return httpx.get(f"{issuer}/.well-known/openid-configuration", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    process = start_server(
        [sys.executable, "-m", "tests.idp.serve", "--port", str(port), "--redirect-uri",
         f"{live_server.url}/oidc/callback/", "--client-id", CLIENT_ID, "--client-secret", CLIENT_SECRET,
         "--users", json.dumps([DANA]), "--state-dir", str(tmp_path)],
        env={**os.environ}, log_path=tmp_path / "idp.log", ready=discovery_answers, what="the identity provider")
    settings.OIDC_ISSUER = issuer
    settings.OIDC_RP_CLIENT_ID = CLIENT_ID
    settings.OIDC_RP_CLIENT_SECRET = CLIENT_SECRET
    settings.OIDC_PROVIDER_NAME = "Example SSO"
    process.database = tmp_path / "idp.sqlite3"
    yield process
    stop_process_group(process)


def _sign_in_through_the_provider(page, live_server, password=DANA["password"]):
    page.goto(f"{live_server.url}/login/")
    page.click("#sso")  # → the provider's login page (another host)
    page.wait_for_selector("#idp-sign-in")
    assert page.url.startswith("http://127.0.0.1:")
    page.fill("input[name=username]", "dana")
    page.fill("input[name=password]", password)
    page.click("#idp-sign-in")  # → authorize (no consent screen) → the portal's callback → the dashboard


def test_a_first_sign_in_makes_the_account_and_joins_the_mapped_teams(world, live_server, idp, page):
    GroupMapping.objects.create(group="gpu-ml", team=world.team, role="member")
    GroupMapping.objects.create(group="gpu-ml-leads", team=world.team, role="manager")
    GroupMapping.objects.create(group="platform-admins", staff=True)
    assert "Sign in with Example SSO" in page.goto(f"{live_server.url}/login/").text()
    _sign_in_through_the_provider(page, live_server)
    page.wait_for_url(f"{live_server.url}/")
    assert page.locator(".who").inner_text() == "dana"
    from django.contrib.auth import get_user_model

    dana = get_user_model().objects.get(username="dana")
    assert (dana.email, dana.first_name, dana.has_usable_password(), dana.is_staff) == (
        "dana@example.com", "Dana", False, False)
    assert Membership.objects.get(user=dana).role == "manager"  # the higher of the two mapped roles
    assert Membership.objects.get(user=dana).team == world.team


def test_a_user_removed_from_the_group_loses_the_team_at_the_next_sign_in(world, live_server, idp, page):
    GroupMapping.objects.create(group="gpu-ml", team=world.team, role="member")
    _sign_in_through_the_provider(page, live_server)
    page.wait_for_url(f"{live_server.url}/")
    assert Membership.objects.filter(user__username="dana", team=world.team).exists()
    # The provider's own store: dana leaves gpu-ml (and gpu-ml-leads, unmapped here).
    with sqlite3.connect(idp.database) as db:
        db.execute("DELETE FROM auth_user_groups WHERE group_id IN "
                   "(SELECT id FROM auth_group WHERE name LIKE 'gpu-ml%')")
    page.click("text=Sign out")
    page.context.clear_cookies()  # the provider's session too: a fresh sign-in there
    _sign_in_through_the_provider(page, live_server)
    page.wait_for_url(f"{live_server.url}/")
    assert not Membership.objects.filter(user__username="dana").exists()


def test_a_provider_that_cannot_be_reached_gives_a_message_not_an_error(world, live_server, page, settings):
    settings.OIDC_ISSUER = f"http://127.0.0.1:{free_port()}/o"  # nothing listens there
    settings.OIDC_RP_CLIENT_ID = CLIENT_ID
    page.goto(f"{live_server.url}/login/")
    page.click("#sso")
    page.wait_for_selector(".flash.error")
    assert "identity provider could not be reached" in page.locator(".flash.error").inner_text()
    assert page.url.startswith(f"{live_server.url}/login/")
