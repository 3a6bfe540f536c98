"""At a phone's width (390 px) no page is wider than the screen: wide tables scroll in their own box."""
from __future__ import annotations

import pytest

from allocations.models import Reservation
from tests.factories import PASSWORD, window

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_no_page_is_wider_than_a_phone(world, live_server, page, api):
    for hours in (1, 2, 3):  # rows with long windows, as a busy team's pages have
        api(world.member).post("/api/v1/reservations/", {"pool": "a100", "team": "ml", "gpus": 1,
                                                         "ends_at": window(0, hours)[1].isoformat()}, format="json")
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{live_server.url}/login/")
    page.fill("input[name=username]", "owner")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    first = Reservation.objects.order_by("pk").first()
    for path in ("/", "/reserve/", "/reservations/", "/teams/ml/", "/pools/a100/", f"/reservations/{first.pk}/"):
        page.goto(f"{live_server.url}{path}")
        page.wait_for_load_state("networkidle")
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"{path} is {width} px wide at 390"
