"""The reservations list and a reservation's page follow its state live, and every row keeps its cells."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from allocations import queue, services
from allocations.models import Reservation
from tests.conftest import sign_in, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def book(world, gpus: int = 1) -> Reservation:
    return services.reservation_create(actor=world.member, request=services.ReservationRequest(
        team="ml", pool="a100", gpus=gpus, ends_at=timezone.now() + timedelta(hours=2)))


def test_a_releasing_row_keeps_its_actions_cell_and_borders(world, live_server, page, tmp_path):
    active, releasing = book(world), book(world)
    Reservation.objects.filter(pk=releasing.pk).update(state=Reservation.State.RELEASING)
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/reservations/")
    page.screenshot(path="/tmp/live-shots/releasing.png", full_page=True)
    for reservation in (active, releasing):
        cells = page.locator(f"#reservation-{reservation.pk} > td")
        assert cells.count() == 9
        # Every cell spans its whole row (same top, same height), so the row's bottom border runs unbroken.
        first, actions = cells.first.bounding_box(), cells.last.bounding_box()
        assert (round(actions["y"]), round(actions["height"])) == (round(first["y"]), round(first["height"]))
        assert cells.last.evaluate("td => getComputedStyle(td).borderBottomStyle") == "solid"


def activate(request, reservation: Reservation) -> None:
    """Start the Celery worker only now (the page has shown the reservation scheduled): its sweep activates it."""
    request.getfixturevalue("celery_worker_process")
    wait_for(lambda: Reservation.objects.get(pk=reservation.pk).state == "active", timeout=40, message="activation")


def test_the_reservations_list_turns_active_without_a_reload(world, live_server, page, request):
    sign_in(page, live_server.url)
    reservation = book(world, gpus=2)  # no worker runs yet: it stays scheduled
    page.goto(f"{live_server.url}/reservations/")
    state = page.locator(f"#reservation-{reservation.pk} .state")
    assert state.inner_text() == "scheduled"
    page.evaluate("window.notReloaded = true")
    activate(request, reservation)
    expect(state).to_have_text("active", timeout=5000)
    assert page.evaluate("window.notReloaded") is True
    # Settled: the row asks no more.
    assert page.locator(f"#reservation-{reservation.pk}").get_attribute("hx-trigger") is None


def test_a_reservation_page_turns_active_without_a_reload(world, live_server, page, request):
    sign_in(page, live_server.url)
    reservation = book(world)
    page.goto(f"{live_server.url}/reservations/{reservation.pk}/")
    assert page.locator("h1 .state").inner_text() == "scheduled"
    page.evaluate("window.notReloaded = true")
    activate(request, reservation)
    expect(page.locator("h1 .state")).to_have_text("active", timeout=5000)
    expect(page.locator("#history")).to_contain_text("active")
    assert page.evaluate("window.notReloaded") is True
    assert page.locator("#reservation-body").get_attribute("hx-trigger") is None


def test_a_waiting_request_moves_to_the_live_list_when_placed(world, live_server, page):
    busy = services.reservation_create(actor=world.staff, request=services.ReservationRequest(
        team="infra", pool="a100", gpus=8, ends_at=timezone.now() + timedelta(hours=2)))
    waiting = services.reservation_create(actor=world.member, request=services.ReservationRequest(
        team="ml", pool="a100", gpus=2, duration=timedelta(hours=1)))
    assert waiting.state == "pending"
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/reservations/")
    assert f"#{waiting.pk}" in page.locator("#waiting-reservations").inner_text()
    page.evaluate("window.notReloaded = true")
    services.reservation_release(actor=world.staff, reservation_id=busy.pk)
    queue.queue_pass(pool_id=world.pool.pk)  # what the worker's queue task does after a release
    assert Reservation.objects.get(pk=waiting.pk).state != "pending"
    expect(page.locator(f"#live-reservations #reservation-{waiting.pk}")).to_be_visible(timeout=15000)
    expect(page.locator("#waiting-reservations")).to_have_count(0)
    assert page.evaluate("window.notReloaded") is True
