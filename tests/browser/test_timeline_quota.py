"""The reserve page's availability timeline counts what the selected team may still book: a slot with free
GPUs that the team's quota does not allow says so (it counted the pool's free GPUs only)."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from allocations import services
from tests.factories import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_slots_over_the_teams_quota_say_so(world, live_server, page, tmp_path):
    # ml's quota in a100 is 6 GE: with 4 GPUs held for the next 5 hours it may add 2 then, 6 after.
    now = timezone.now()
    services.reservation_create(actor=world.member, request=services.ReservationRequest(
        team="ml", pool="a100", gpus=4, ends_at=now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=5)))
    page.goto(f"{live_server.url}/login/")
    page.fill("input[name=username]", "member")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")

    page.goto(f"{live_server.url}/reserve/?pool=a100")
    assert "Counted for team ML" in page.locator("#quota-note").inner_text()
    slots = page.locator(".timeline .slot")
    first, later = slots.nth(0), slots.nth(8)
    assert first.get_attribute("data-free") == "4" and first.get_attribute("data-quota-left") == "2"
    assert first.locator(".free").inner_text() == "2"  # what ml may still book, not the pool's 4
    assert later.locator(".free").inner_text() == "6" and later.get_attribute("data-fits") == "true"

    # Three GPUs: the pool has room for them in the first hours, ml's quota does not.
    page.fill("input[name=gpus]", "3")
    page.locator("input[name=gpus]").dispatch_event("change")
    expect(first).to_have_attribute("data-over-quota", "true")
    first = page.locator(".timeline .slot").nth(0)
    assert first.get_attribute("data-fits") == "false"
    assert "over its quota" in first.get_attribute("title")
    assert "quota" in first.locator(".bar").get_attribute("class")
    later = page.locator(".timeline .slot").nth(8)
    assert later.get_attribute("data-over-quota") == "false" and later.get_attribute("data-fits") == "true"
    assert page.locator(".legend .swatch.quota").count() == 1
    for width, height in ((1440, 900), (390, 844)):
        page.set_viewport_size({"width": width, "height": height})
        page.screenshot(path=f"/tmp/live-shots/timeline-quota-{width}.png", full_page=True)
