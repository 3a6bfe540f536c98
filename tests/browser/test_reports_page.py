"""The Reports page in Chromium: the charts render, a filter redraws them, a chart's CSV downloads its
figures, and neither a wide screen nor a phone scrolls sideways."""
from __future__ import annotations

import csv
import io
import os
from pathlib import Path

import pytest

from allocations.models import Quota
from tests.accounting.test_chargeback import priced  # noqa: F401 (the fixture)
from tests.conftest import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _shot(page, name: str) -> None:
    if os.environ.get("SCREENSHOTS"):
        page.screenshot(path=str(Path(os.environ["SCREENSHOTS"]) / name), full_page=True)


def test_reports_charts_filters_and_csv(priced, live_server, page):  # noqa: F811
    Quota.objects.filter(team=priced.team, pool=priced.pool).update(ge_hours_per_month=100)
    page.set_viewport_size({"width": 1440, "height": 900})
    sign_in(page, live_server.url, "staff")
    page.click("header nav >> text=Reports")
    page.goto(f"{live_server.url}/reports/?start=2025-03&end=2025-04")
    page.wait_for_function("document.querySelectorAll('[data-chart] svg.main-svg').length >= 5")
    teams = "document.querySelector('[data-chart=efficiency]').data[0].x"
    assert sorted(page.evaluate(teams)) == ["infra", "ml"]
    assert page.evaluate("document.documentElement.scrollWidth") <= 1440
    _shot(page, "reports-1440.png")
    # Picking a pool redraws: only the team that booked in l4 is left.
    page.select_option("select[name=pool]", "l4")
    page.wait_for_url("**pool=l4**")
    page.wait_for_function("document.querySelectorAll('[data-chart] svg.main-svg').length >= 4")
    assert page.evaluate(teams) == ["infra"]
    with page.expect_download() as download:
        page.click("#chart-efficiency h2 a")
    rows = list(csv.reader(io.StringIO(Path(download.value.path()).read_text())))
    assert rows == [["team", "booked_ge_hours", "used_ge_hours", "efficiency"], ["infra", "1.0", "0.0", "0.0"]]
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{live_server.url}/reports/?start=2025-03&end=2025-04")
    page.wait_for_function("document.querySelectorAll('[data-chart] svg.main-svg').length >= 5")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    _shot(page, "reports-390.png")
