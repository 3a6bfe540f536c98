"""The reserve page's availability timeline: its labels never run into each other or off its left edge (the
first was cut to "ue 12h", a day and an hour ran together as "23hWed 00h"), at a desktop's and a phone's
width, in each range; a click on a slot starts the reservation then."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tests.conftest import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LABELS = """() => {
  const line = document.querySelector('.timeline').getBoundingClientRect();
  const boxes = (selector) => [...document.querySelectorAll(selector)].filter((e) => e.textContent.trim())
    .map((e) => { const r = e.getBoundingClientRect(); return {text: e.textContent.trim(), left: r.left, right: r.right}; });
  return {left: line.left, when: boxes('.timeline .when'), day: boxes('.timeline .day')};
}"""


@pytest.mark.parametrize("width", [1440, 390])
def test_timeline_labels_never_overlap_or_fall_off_the_edge(world, live_server, page, width):
    page.set_viewport_size({"width": width, "height": 900})
    sign_in(page, live_server.url, "owner")
    page.goto(f"{live_server.url}/reserve/")
    for range_ in ("24h", "3d", "7d"):
        page.click(f".ranges a:text-is('{range_}')")
        page.wait_for_selector(f".ranges a.current:text-is('{range_}')")
        labels = page.evaluate(LABELS)
        assert labels["day"], range_
        for row in ("when", "day"):
            boxes = labels[row]
            assert all(box["left"] >= labels["left"] - 0.5 for box in boxes), (range_, row, boxes)
            for a, b in zip(boxes, boxes[1:]):
                assert a["right"] <= b["left"], (range_, row, a, b)  # in order, apart
        assert page.evaluate("document.documentElement.scrollWidth") <= width


def test_a_click_on_a_slot_starts_the_reservation_then(world, live_server, page):
    sign_in(page, live_server.url, "owner")
    page.goto(f"{live_server.url}/reserve/")
    page.fill("#reserve-form [name=ends_at]", "")
    slot = page.locator(".timeline .slot").nth(3)
    start = slot.get_attribute("data-start")
    slot.click()
    assert page.input_value("#reserve-form [name=starts_at]") == start
    ends = datetime.fromisoformat(page.input_value("#reserve-form [name=ends_at]"))
    assert ends - datetime.fromisoformat(start) == timedelta(hours=2)
    # A later pick keeps the length chosen.
    page.fill("#reserve-form [name=ends_at]", (datetime.fromisoformat(start) + timedelta(hours=5)).strftime("%Y-%m-%dT%H:%M"))
    later = page.locator(".timeline .slot").nth(6)
    later.focus()
    page.keyboard.press("Enter")
    picked = later.get_attribute("data-start")
    new_start = datetime.fromisoformat(picked)
    assert page.input_value("#reserve-form [name=starts_at]") == picked
    assert datetime.fromisoformat(page.input_value("#reserve-form [name=ends_at]")) - new_start == timedelta(hours=5)
    page.click("#reserve-form button[type=submit]")
    page.wait_for_selector("text=Reserved")
    from allocations.models import Reservation

    reservation = Reservation.objects.get()  # booked for the slot picked (the page's zone: the browser's, UTC here)
    assert reservation.starts_at.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M") == picked
    assert reservation.ends_at - reservation.starts_at == timedelta(hours=5)
