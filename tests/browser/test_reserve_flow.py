"""A member signs in, reserves a GPU from the form, sees it, and releases it — in a real browser."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from allocations.models import Reservation
from tests.conftest import wait_for
from tests.factories import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_member_reserves_and_releases_a_gpu_in_the_browser(world, live_server, celery_worker_process, page):
    page.goto(f"{live_server.url}/login/")
    page.fill("input[name=username]", "member")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    assert page.locator("h1").inner_text() == "Dashboard"

    page.click("nav >> text=Reserve")
    assert page.locator("#availability .slot").count() == 24
    page.select_option("select[name=team]", "ml")
    page.select_option("select[name=pool]", "a100")
    page.wait_for_load_state("networkidle")  # choosing a pool swaps in its amount fields (HTMX)
    page.fill("input[name=gpus]", "2")
    ends_at = timezone.localtime(timezone.now() + timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M")
    page.fill("input[name=ends_at]", ends_at)
    page.click("#reserve-form button[type=submit]")

    page.wait_for_url(f"{live_server.url}/reservations/")
    assert "Reserved 2 GPUs of A100" in page.locator(".flash").inner_text()
    reservation = Reservation.objects.get()
    row = page.locator(f"#reservation-{reservation.pk}")
    assert "A100" in row.inner_text() and "node-a:0" in row.inner_text()

    # The worker activates it; the page shows it after a reload.
    wait_for(lambda: Reservation.objects.get().state == "active", message="activation by the worker")
    page.reload()
    assert page.locator(f"#reservation-{reservation.pk} .state").inner_text() == "active"

    # Release asks first: dismissed, nothing happens; accepted, it posts with confirm=yes and releases.
    asked = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.dismiss()))
    page.click(f"#reservation-{reservation.pk} button.danger")
    assert asked == [f"Release reservation #{reservation.pk} of team ML, 2 GPUs of A100, now?"]
    assert Reservation.objects.get().state == "active" and page.url == f"{live_server.url}/reservations/"
    page.once("dialog", lambda dialog: dialog.accept())
    page.click(f"#reservation-{reservation.pk} button.danger")
    assert f"Reservation #{reservation.pk} released." in page.locator(".flash").inner_text()
    wait_for(lambda: Reservation.objects.get().state == "released", message="release finished by the worker")
    page.reload()
    assert page.locator(f"#ended-reservations #reservation-{reservation.pk} .state").inner_text() == "released"


def test_a_refused_reservation_shows_the_reason_in_the_browser(world, live_server, page):
    page.goto(f"{live_server.url}/login/")
    page.fill("input[name=username]", "member")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    page.goto(f"{live_server.url}/reserve/")
    page.fill("input[name=gpus]", "7")
    page.fill("input[name=ends_at]", timezone.localtime(timezone.now() + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M"))
    page.click("#reserve-form button[type=submit]")
    assert "Over quota" in page.locator('[data-field="gpus"]').inner_text()
    assert not Reservation.objects.exists()
