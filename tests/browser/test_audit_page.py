"""The audit page in Chromium: its filters narrow the list, and on a phone each entry reads whole."""
from __future__ import annotations

import pytest

from allocations.models import Quota
from tests.conftest import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_staff_filter_the_audit_log_by_object_type(world, live_server, page, api):
    quota = Quota.objects.get(team=world.team, pool=world.pool)
    assert api(world.staff).patch(f"/api/v1/quotas/{quota.pk}/", {"max_ge": 7}, format="json").status_code == 200
    page.set_viewport_size({"width": 1440, "height": 900})
    sign_in(page, live_server.url, "staff")
    page.goto(f"{live_server.url}/audit/")
    assert page.locator("#audit-entries tbody tr").count() > 1
    page.select_option("select[name=object_type]", "allocations.quota")
    page.fill("input[name=actor]", "staff")
    page.click("#audit-filters button[type=submit]")
    page.wait_for_url("**object_type=allocations.quota**")
    rows = page.locator("#audit-entries tbody tr")
    assert rows.count() == 1
    assert "max_ge" in rows.first.inner_text() and "ml in a100" in rows.first.inner_text()


def test_on_a_phone_each_entry_fits_the_screen(world, live_server, page, api):
    quota = Quota.objects.get(team=world.team, pool=world.pool)
    api(world.staff).patch(f"/api/v1/quotas/{quota.pk}/", {"max_ge": 7}, format="json")
    page.set_viewport_size({"width": 390, "height": 844})
    sign_in(page, live_server.url, "staff")
    page.goto(f"{live_server.url}/audit/")
    page.wait_for_load_state("networkidle")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    # Not only the page: each entry's changes are on screen, not in a box scrolled sideways.
    boxes = page.locator("#audit-entries td[data-label=Changes]").evaluate_all(
        "cells => cells.map(c => c.getBoundingClientRect().right)")
    assert boxes and max(boxes) <= 390
