"""A member switches the portal to Simplified Chinese with the header's switcher, books GPUs from the reserve
form and reads the reservation's page in Chinese — in a real browser; screenshots at desktop and phone width
go to $SCREENSHOTS_ZH when it is set (the lead looks at them for overflow and wrapping)."""
from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from allocations.models import Reservation
from tests.conftest import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def shoot(page, name: str) -> None:
    folder = os.environ.get("SCREENSHOTS_ZH")
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 900})
        page.screenshot(path=str(Path(folder) / f"{name}-{width}.png"), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 900})


def test_a_member_books_in_chinese(world, live_server, page):
    sign_in(page, live_server.url)
    assert page.locator("html").get_attribute("lang") == "en"
    page.select_option("header select[name=language]", "zh-hans")  # posts by itself (confirm.js)
    page.wait_for_function("document.documentElement.lang === 'zh-hans'")
    assert page.locator("h1").inner_text() == "总览"
    shoot(page, "dashboard")

    page.click("nav >> text=预约")
    page.wait_for_url(f"{live_server.url}/reserve/")
    assert page.locator("h1").inner_text() == "预约 GPU"
    page.select_option("select[name=team]", "ml")
    page.select_option("select[name=pool]", "a100")
    page.wait_for_load_state("networkidle")  # choosing a pool swaps in its amount fields (HTMX)
    assert "何时有空闲 GPU" in page.locator("#availability h2").inner_text()
    page.fill("input[name=gpus]", "2")
    ends_at = timezone.localtime(timezone.now() + timedelta(hours=3)).strftime("%Y-%m-%d %H:%M")
    page.fill("input[name=ends_at]", ends_at)
    shoot(page, "reserve")
    page.click("#reserve-form button[type=submit]")

    page.wait_for_url(f"{live_server.url}/reservations/")
    reservation = Reservation.objects.get()
    assert page.locator(".flash").inner_text() == (
        f"已预约 A100 的 2 个 GPU（预约 #{reservation.pk}，{reservation.ge:.0f} GE）。")
    assert page.locator("h1").inner_text() == "我的预约"
    page.click(f"#reservation-{reservation.pk} a")
    page.wait_for_url(f"{live_server.url}/reservations/{reservation.pk}/")
    assert page.locator("html").get_attribute("lang") == "zh-hans"
    assert page.locator("h1").inner_text().startswith(f"预约 #{reservation.pk}")
    facts = page.locator("dl.facts").inner_text()
    assert "团队" in facts and "资源池" in facts and "2 个 GPU" in facts and "时间窗口" in facts
    assert page.locator("#history th").first.inner_text() == "时间"
    shoot(page, "reservation")
