"""The API docs page draws Swagger UI with every other host unreachable; the 404 page fits a phone."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.factories import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _shot(page, name: str) -> None:
    if os.environ.get("SCREENSHOTS"):
        page.screenshot(path=str(Path(os.environ["SCREENSHOTS"]) / f"{name}.png"), full_page=False)


def test_docs_and_404_render_offline_at_desktop_and_phone_widths(world, live_server, page):
    # As without internet: any request to another host fails.
    outside: list[str] = []

    def only_ours(route):
        if route.request.url.startswith(live_server.url):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", only_ours)
    page.goto(f"{live_server.url}/login/")
    page.fill("input[name=username]", "owner")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    for width, height in ((1440, 900), (390, 844)):
        page.set_viewport_size({"width": width, "height": height})
        page.goto(f"{live_server.url}/api/v1/docs/")
        page.wait_for_selector(".swagger-ui .opblock", timeout=20000)  # the operations are drawn
        _shot(page, f"docs-{width}")
        response = page.goto(f"{live_server.url}/no/such/page/")
        assert response.status == 404
        page.wait_for_load_state("networkidle")
        assert page.locator("header.topbar nav a", has_text="Reserve").count() == 1
        assert page.locator("a", has_text="Back to the dashboard").is_visible()
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        _shot(page, f"404-{width}")
    assert outside == []
