"""Pages show times 24-hour in the browser's zone, name the zone, and the reserve form books that zone's times."""
from __future__ import annotations

import re
import zoneinfo
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from allocations.models import Reservation
from tests.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.factories import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHANGHAI = zoneinfo.ZoneInfo("Asia/Shanghai")
TWELVE_HOUR = re.compile(r"\b\d{1,2}:\d{2}\s?[AP]M\b", re.IGNORECASE)


@pytest.fixture
def shanghai_page(page):
    """A Chromium page whose browser lives in Beijing time (UTC+8, no daylight saving)."""
    context = page.context.browser.new_context(timezone_id="Asia/Shanghai", viewport={"width": 1440, "height": 900})
    yield context.new_page()
    context.close()


def test_a_form_in_beijing_time_books_beijing_time(world, live_server, shanghai_page, tmp_path):
    page = shanghai_page
    page.goto(f"{live_server.url}/login/")
    page.fill("input[name=username]", "member")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    assert page.locator("#page-zone").inner_text() == "Asia/Shanghai (CST)"

    page.goto(f"{live_server.url}/reserve/?pool=a100")
    assert "Asia/Shanghai (CST)" in page.locator("label[for=id_starts_at]").inner_text()
    assert page.get_attribute("input[name=starts_at]", "type") == "text"  # not the browser's 12-hour picker
    # The initial end is four hours from now, on Beijing's clock.
    shown_end = datetime.strptime(page.input_value("input[name=ends_at]"), "%Y-%m-%d %H:%M")
    beijing_now = timezone.now().astimezone(SHANGHAI).replace(tzinfo=None)
    assert abs(shown_end - beijing_now - timedelta(hours=4)) < timedelta(minutes=2)

    tomorrow = (timezone.now().astimezone(SHANGHAI) + timedelta(days=1)).date()
    page.select_option("select[name=team]", "ml")
    page.fill("input[name=gpus]", "1")
    page.fill("input[name=starts_at]", f"{tomorrow:%Y-%m-%d} 09:00")
    page.fill("input[name=ends_at]", f"{tomorrow:%Y-%m-%d} 21:30")
    page.click("#reserve-form button[type=submit]")
    page.wait_for_url(f"{live_server.url}/reservations/")

    reservation = Reservation.objects.get()
    assert reservation.starts_at == datetime(tomorrow.year, tomorrow.month, tomorrow.day, 9, 0, tzinfo=SHANGHAI)
    assert reservation.ends_at == datetime(tomorrow.year, tomorrow.month, tomorrow.day, 21, 30, tzinfo=SHANGHAI)
    window = page.locator(f"#reservation-{reservation.pk} .window").inner_text()
    assert window == f"{tomorrow:%a} {tomorrow.day} {tomorrow:%b} 09:00 → 21:30 CST"
    page.goto(f"{live_server.url}/reservations/{reservation.pk}/")
    body = page.locator("main").inner_text()
    assert "21:30 CST" in body and not TWELVE_HOUR.search(body)
    page.screenshot(path=str(tmp_path / "detail-shanghai.png"), full_page=True)


def test_an_unknown_zone_falls_back_to_the_portals(world, live_server, page):
    page.context.add_cookies([{"name": "tz", "value": "Mars/Olympus_Mons", "url": live_server.url}])
    page.goto(f"{live_server.url}/login/")
    page.fill("input[name=username]", "member")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    # timezone.js replaces the cookie with the browser's zone (Chromium's here), the page then uses it.
    zone = page.evaluate("Intl.DateTimeFormat().resolvedOptions().timeZone")
    page.reload()
    assert page.locator("#page-zone").inner_text().startswith(zone)
