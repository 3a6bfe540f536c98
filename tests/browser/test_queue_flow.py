"""A member asks for GPUs "as soon as it fits", sees the request wait with its position and start times,
books an alternative to a refused window in one click, and withdraws the waiting request — in a browser."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from allocations import services
from allocations.models import QueueEntry, Reservation
from portal import timezones
from tests.conftest import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def open_reserve(page, live_server):
    page.goto(f"{live_server.url}/reserve/?pool=a100")
    page.select_option("select[name=team]", "ml")
    page.fill("input[name=gpus]", "2")


def test_a_member_waits_in_the_queue_takes_an_alternative_and_withdraws(world, live_server, page, tmp_path):
    busy = services.reservation_create(actor=world.staff, request=services.ReservationRequest(
        team="infra", pool="a100", gpus=8, ends_at=timezone.now() + timedelta(hours=2)))
    sign_in(page, live_server.url)

    # As soon as it fits: the window's fields give way to the duration's.
    open_reserve(page, live_server)
    assert page.locator("input[name=duration]").is_hidden()
    page.check("input[name=when][value=asap]")
    assert page.locator("input[name=ends_at]").is_hidden() and page.locator("input[name=duration]").is_visible()
    page.fill("input[name=duration]", "1h")
    page.click("#reserve-form button[type=submit]")
    waiting = Reservation.objects.get(team=world.team)
    page.wait_for_url(f"{live_server.url}/reservations/{waiting.pk}/")
    assert "waits in the queue of A100: position 1" in page.locator(".flash").inner_text()
    assert page.locator("#queue-position").inner_text().startswith("1")
    entry = QueueEntry.objects.get(pk=waiting.pk)
    promised = timezones.when(entry.start_by)
    assert promised == timezones.when(busy.ends_at)
    assert promised in page.locator("#start-by").inner_text()
    assert page.locator("#likely-start").inner_text().startswith(promised)  # no early releases learned yet
    page.set_viewport_size({"width": 390, "height": 844})
    page.screenshot(path=str(tmp_path / "queued-phone.png"), full_page=True)
    page.set_viewport_size({"width": 1440, "height": 900})

    # The pool's queue page lists it, the member's own in full.
    page.goto(f"{live_server.url}/pools/a100/queue/")
    assert f"ML #{waiting.pk}" in page.locator("#queue-table").inner_text()

    # A fixed window now is refused; the earliest window that fits books in one click.
    open_reserve(page, live_server)
    page.fill("input[name=ends_at]", timezone.localtime(timezone.now() + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M"))
    page.click("#reserve-form button[type=submit]")
    assert page.locator("#alternatives").is_visible()
    page.screenshot(path=str(tmp_path / "alternatives.png"), full_page=True)
    page.click("#alternatives button[data-kind=earliest_window]")
    page.wait_for_url(f"{live_server.url}/reservations/")
    assert "Reserved 2 GPUs of A100" in page.locator(".flash").inner_text()
    booked = Reservation.objects.filter(team=world.team, state="scheduled").get()
    assert booked.starts_at >= busy.ends_at

    # The waiting request is withdrawn from the reservations page, after a confirmation.
    assert f"#{waiting.pk}" in page.locator("#waiting-reservations").inner_text()
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#waiting-reservations button.danger")
    page.wait_for_url(f"{live_server.url}/reservations/")
    waiting.refresh_from_db()
    assert waiting.state == "released" and "Withdrawn" in waiting.reason
    assert not page.locator("#waiting-reservations").count()
