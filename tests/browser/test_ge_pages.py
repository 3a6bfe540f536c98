"""The team page and the dashboard with use in GPU-equivalents, in a real browser at a desktop's and a
phone's width: the GE figures show, and no page is wider than the screen. SCREENSHOTS=<dir> keeps a
full-page screenshot of each."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.allocations.grants import mixed_grants
from tests.factories import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize(("width", "height"), [(1440, 900), (390, 844)])
def test_the_team_page_and_dashboard_show_ge_at_desktop_and_phone_width(world, live_server, page, width, height):
    mixed_grants(world)
    world.team.max_ge = 10
    world.team.save()
    page.set_viewport_size({"width": width, "height": height})
    page.goto(f"{live_server.url}/login/")
    page.fill("input[name=username]", "owner")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    for path, name, shown in (("/teams/ml/", "team", "#quota-breakdown"), ("/", "dashboard", "#teams-ge")):
        page.goto(f"{live_server.url}{path}")
        page.wait_for_load_state("networkidle")
        assert page.locator(shown).is_visible()
        if name == "team":
            assert "of a team-wide cap of 10.00 GE" in page.locator("#team-ge").inner_text()
        width_now = page.evaluate("document.documentElement.scrollWidth")
        assert width_now <= width, f"{path} is {width_now} px wide at {width}"
        if os.environ.get("SCREENSHOTS"):
            page.screenshot(path=str(Path(os.environ["SCREENSHOTS"]) / f"{name}-{width}.png"), full_page=True)
