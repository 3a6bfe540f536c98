"""The README's first five minutes, in a browser on the demo fleet: sign in as bob, reserve an H100, watch the
booking go active on a simulated host, see the GPU busy on the pool page, release it. With SCREENSHOTS=<dir>
it saves the README's pictures there (docs/screenshots/ holds the committed ones)."""
from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from allocations.models import Reservation
from config.demo import load_demo
from config.demo_agents import start_demo_agents
from tests.config.test_demo_agents import _stop
from tests.conftest import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def fast_agents(monkeypatch):
    """The server tells the demo's agents to report every second (set before the server starts)."""
    monkeypatch.setenv("AGENT_HEARTBEAT_SECONDS", "1")


def _shot(page, name: str) -> None:
    folder = os.environ.get("SCREENSHOTS")
    if folder:
        page.screenshot(path=str(Path(folder) / f"{name}.png"))


def test_bob_reserves_watches_it_go_active_and_releases(fast_agents, asgi_server, celery_worker_process, page):
    load_demo(admin_password="demo-admin-password")
    agents = start_demo_agents(asgi_server)
    try:
        page.set_viewport_size({"width": 1200, "height": 760})
        page.goto(f"{asgi_server}/login/")
        page.fill("input[name=username]", "bob")
        # The server process hashes passwords its own way (the suite uses a fast hasher): sign in by cookie.
        client = Client()
        client.force_login(get_user_model().objects.get(username="bob"))
        page.context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value,
                                   "url": asgi_server}])

        page.goto(f"{asgi_server}/reserve/")
        page.select_option("select[name=team]", "vision")
        page.select_option("select[name=pool]", "h100")
        page.wait_for_load_state("networkidle")  # the pool's amount fields are swapped in (HTMX)
        page.fill("input[name=gpus]", "2")
        page.fill("input[name=ends_at]",
                  timezone.localtime(timezone.now() + timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M"))
        _shot(page, "first-reserve")
        page.click("#reserve-form button[type=submit]")
        page.wait_for_url(f"{asgi_server}/reservations/")
        reservation = Reservation.objects.get(requested_by__username="bob", pool__slug="h100")

        wait_for(lambda: Reservation.objects.get(pk=reservation.pk).state == "active", timeout=60,
                 message="the simulated host to take the lease")
        page.reload()
        row = page.locator(f"#reservation-{reservation.pk}")
        assert row.locator(".state").inner_text() == "active"
        _shot(page, "first-active")

        # On the pool page bob's GPUs run his job (the simulated host follows its leases).
        page.goto(f"{asgi_server}/pools/h100/")
        page.wait_for_function("document.getElementById('live-status').textContent === 'connected'")
        page.wait_for_timeout(4000)  # a few seconds of samples on the charts
        _shot(page, "first-pool")

        page.goto(f"{asgi_server}/reservations/")
        page.once("dialog", lambda dialog: dialog.accept())
        page.click(f"#reservation-{reservation.pk} button.danger")
        wait_for(lambda: Reservation.objects.get(pk=reservation.pk).state == "released", timeout=60,
                 message="the release")
    finally:
        _stop(agents)
