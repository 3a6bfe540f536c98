"""Refusals and a reservation's history read as written for people on the pages: names not slugs, times in
the viewer's zone ("Tue 24 Nov 18:30 CST"); the API keeps its field and rule codes and ISO instants."""
from __future__ import annotations

import re
import zoneinfo
from datetime import timedelta

import pytest
from django.utils import timezone

from allocations import services
from allocations.models import Reservation
from tests.conftest import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHANGHAI = zoneinfo.ZoneInfo("Asia/Shanghai")
ISO = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}")


def beijing(value) -> str:
    """How the pages write an instant for a viewer in Beijing."""
    local = value.astimezone(SHANGHAI)
    return f"{local:%a} {local.day} {local:%b} {local:%H:%M} CST"


@pytest.fixture
def shanghai_page(page):
    context = page.context.browser.new_context(timezone_id="Asia/Shanghai", viewport={"width": 1440, "height": 900})
    yield context.new_page()
    context.close()


def test_an_extend_refusal_and_the_history_speak_to_people(world, live_server, shanghai_page, api):
    world.pool.name = "A100 training"
    world.pool.save()
    world.member.first_name, world.member.last_name = "Mei", "Lin"
    world.member.save()
    ends_at = (timezone.now() + timedelta(hours=3)).replace(second=0, microsecond=0)
    reservation = services.reservation_create(actor=world.member, request=services.ReservationRequest(
        team="ml", pool="a100", gpus=1, ends_at=ends_at))
    longer = ends_at + timedelta(hours=2)
    services.reservation_extend(actor=world.member, reservation_id=reservation.pk, ends_at=longer)
    services.reservation_activate(reservation_id=reservation.pk)  # the window started: a change by the system

    # The API: field and rule as codes, the instant in ISO 8601.
    refused = api(world.member).post(f"/api/v1/reservations/{reservation.pk}/extend/",
                                     {"ends_at": ends_at.isoformat()}, format="json")
    assert refused.status_code == 400
    (error,) = refused.json()["errors"]
    assert (error["field"], error["rule"]) == ("ends_at", "after_current_end")
    assert ISO.search(error["message"])

    page = shanghai_page
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/reservations/{reservation.pk}/")
    page.fill("input[name=ends_at]", ends_at.astimezone(SHANGHAI).strftime("%Y-%m-%d %H:%M"))
    page.click("#reservation-body form:has(input[name=ends_at]) button")
    flash = page.locator(".flash.error").inner_text()
    assert flash == f"The new end must come after the current end, {beijing(longer)}."
    history = page.locator("#history").inner_text()
    assert f"Extended from {beijing(ends_at)} to {beijing(longer)}." in history
    assert not ISO.search(history) and "ends_at" not in flash
    assert "Mei Lin" in history and "system" in history  # who, by name


def test_an_over_quota_refusal_names_the_team_and_the_pool(world, live_server, shanghai_page):
    world.pool.name = "A100 training"
    world.pool.save()
    page = shanghai_page
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/reserve/?pool=a100")
    page.select_option("select[name=team]", "ml")
    page.fill("input[name=gpus]", "7")
    page.click("#reserve-form button[type=submit]")
    message = page.locator('[data-field="gpus"]').first.inner_text()
    assert message.startswith("Over quota: team ML would hold 7.00 GE in pool A100 training")
    assert not Reservation.objects.exists()
