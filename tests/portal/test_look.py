"""The portal's own favicon and its 404 / 403 / 500 pages, in the portal's look; /api/ keeps answering JSON."""
from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied
from django.test import Client
from django.urls import path

from config import urls as portal_urls


def boom(request):
    raise RuntimeError("a bug")


def forbidden(request):
    raise PermissionDenied


# This module is the URLconf of the tests marked below: the portal's routes and handlers, plus views that fail.
urlpatterns = [path("boom/", boom), path("forbidden/", forbidden), path("api/v1/boom/", boom),
               *portal_urls.urlpatterns]
handler404, handler400, handler500 = portal_urls.handler404, portal_urls.handler400, portal_urls.handler500


def test_favicon_ico_answers_with_the_svg_icon_the_pages_link(world):
    client = Client()
    client.force_login(world.member)
    page = client.get("/").content.decode()
    assert '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">' in page
    response = client.get("/favicon.ico")
    assert response.status_code in (301, 302) and response["Location"] == "/static/favicon.svg"
    # Last: closing a streamed static response ends the request, which closes the test's connection.
    icon = client.get(response["Location"])
    assert icon.status_code == 200 and icon["Content-Type"].startswith("image/svg+xml")
    svg = b"".join(icon.streaming_content).decode()
    icon.close()
    assert svg.lstrip().startswith("<svg") and "#2f6fde" in svg


def test_a_missing_page_is_a_404_in_the_portals_layout(world):
    client = Client()
    client.force_login(world.member)
    response = client.get("/no/such/page/")
    assert response.status_code == 404
    page = response.content.decode()
    assert "Page not found" in page and 'class="topbar"' in page
    assert '<a href="/reserve/">Reserve</a>' in page  # the signed-in nav
    assert '<a class="button primary" href="/">Back to the dashboard</a>' in page
    assert "/no/such/page/" in page


def test_a_missing_page_signed_out_is_still_the_portals_404(db):
    response = Client().get("/no/such/page/")
    assert response.status_code == 404 and 'class="topbar"' in response.content.decode()
    assert "Back to the dashboard" in response.content.decode()


def test_a_missing_route_under_api_stays_json(world, api):
    response = api(world.member).get("/api/v1/no-such-thing/")
    assert response.status_code == 404 and response["Content-Type"] == "application/json"
    assert response.json()["errors"][0]["rule"] == "not_found"


@pytest.mark.urls(__name__)
def test_a_refused_page_is_a_403_in_the_portals_layout(world):
    client = Client()
    client.force_login(world.member)
    response = client.get("/forbidden/")
    assert response.status_code == 403
    page = response.content.decode()
    assert "Not allowed" in page and '<a href="/reserve/">Reserve</a>' in page


@pytest.mark.urls(__name__)
def test_a_failing_page_is_a_standalone_500_that_needs_no_database(settings):
    # No `db` fixture: the page must render with the database out of reach (pytest-django refuses any query).
    settings.DEBUG = False
    response = Client(raise_request_exception=False).get("/boom/")
    assert response.status_code == 500
    page = response.content.decode()
    assert "Something went wrong" in page and 'class="topbar"' in page
    # As the portal names them: plain, or fingerprinted once some earlier test's subprocess (the embedded
    # demo) collected static files into the suite's STATIC_ROOT.
    from django.templatetags.static import static

    assert static("css/portal.css") in page and static("favicon.svg") in page


@pytest.mark.urls(__name__)
def test_a_failing_api_call_stays_json(settings):
    settings.DEBUG = False
    response = Client(raise_request_exception=False).get("/api/v1/boom/")
    assert response.status_code == 500 and response.json()["errors"][0]["rule"] == "server_error"
