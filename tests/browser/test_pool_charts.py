"""The pool page's charts in headless Chromium, at 8 GPUs and at 200: a heatmap of every GPU over time with the
booked ones marked and their holder on hover and in the table, lines for the selected GPUs only (a legend that
wraps, never clipped), a range picker that reads the rollups, and no overflow on a phone."""
from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone

from allocations.models import Allocation, Reservation
from inventory.models import Gpu
from monitoring.models import MinuteRollup, Sample
from teams.models import Team
from tests.factories import ClusterFactory, PoolFactory, QuotaFactory, add_node

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

HEATMAP = "document.getElementById('chart-heatmap')"


def _sign_in(page, url: str, user) -> None:
    # The server process hashes passwords its own way (the suite uses a fast hasher): sign in by session cookie.
    client = Client()
    client.force_login(user)
    page.context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": url}])


def _shot(page, name: str) -> None:
    """The charts' section (the page of a 200-GPU pool is too tall to look at whole)."""
    if os.environ.get("SCREENSHOTS"):
        box = page.locator("#live").bounding_box()
        scroll = page.evaluate("window.scrollY")
        page.screenshot(path=str(Path(os.environ["SCREENSHOTS"]) / f"{name}.png"), full_page=True,
                        clip={"x": 0, "y": box["y"] + scroll, "width": page.viewport_size["width"],
                              "height": box["height"]})


def _samples(gpu_ids: list[int], seconds: int, util) -> None:
    """Raw samples of the last `seconds` for each GPU, util(i, s) for GPU i at second s."""
    now = int(time.time())
    Sample.objects.bulk_create(
        [Sample(gpu_id=gpu_id, pool_id=None, ts=now - seconds + s, util=util(i, s), mem_util=10, mem_used=1000,
                mem_total=81559, temp=50, power=200.0)
         for i, gpu_id in enumerate(gpu_ids) for s in range(seconds)], batch_size=5000)


def _minute_rollups(gpu_ids: list[int], util_avg: float) -> None:
    """Ten minutes of rollups three hours ago: in the 24-hour range, not in the live window."""
    start = int(time.time()) - 3 * 3600
    start -= start % 60
    MinuteRollup.objects.bulk_create(
        [MinuteRollup(gpu_id=gpu_id, bucket=start + 60 * m, n=60, util_avg=util_avg, util_max=util_avg,
                      mem_util_avg=5, mem_util_max=5, mem_used_avg=500, mem_used_max=500, mem_total=81559,
                      temp_avg=40, temp_max=40, power_avg=100, power_max=100)
         for gpu_id in gpu_ids for m in range(10)], batch_size=5000)


def _hold(team, pool, gpu, user) -> Reservation:
    now = timezone.now()
    reservation = Reservation.objects.create(team=team, pool=pool, requested_by=user, gpus=1, state="active",
                                             starts_at=now - timedelta(hours=1), ends_at=now + timedelta(hours=2))
    Allocation.objects.create(reservation=reservation, gpu=gpu, starts_at=reservation.starts_at,
                              ends_at=reservation.ends_at)
    return reservation


def _check_the_charts(page, url: str, gpus: int, booked_label: str, holder: str, rollup_util: float,
                      name: str) -> None:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    for width, height in ((1440, 900), (390, 844)):
        page.set_viewport_size({"width": width, "height": height})
        page.goto(url)
        page.wait_for_function("document.getElementById('live-status').textContent === 'connected'")
        page.wait_for_function(f"{HEATMAP}.data && {HEATMAP}.data.length === 2")
        # Every GPU is a row of the heatmap, with the recent samples in it.
        rows = page.evaluate(f"{HEATMAP}.data[1].z.length")
        assert rows == gpus
        assert page.evaluate(f"{HEATMAP}.data[1].z.flat().filter((v) => v !== null).length") >= gpus * 30
        # The booked strip marks exactly the held GPU, and hover names its holder.
        booked = page.evaluate(f"{HEATMAP}.data[0].z.map((r, i) => r[0] ? i : -1).filter((i) => i >= 0)")
        labels = page.evaluate(f"{HEATMAP}.data[0].y")
        assert [labels[i].split(" · ")[0] for i in booked] == [booked_label]
        assert holder in page.evaluate(f"{HEATMAP}.data[0].text[{booked[0]}][0]")
        assert holder in page.evaluate(f"{HEATMAP}.data[1].text[{booked[0]}][0]")
        # Lines only for the selected GPUs (the first 8), each in its own colour, named in a legend that wraps.
        colours = page.evaluate("document.getElementById('chart-util').data.map((t) => t.line.color)")
        assert len(colours) == min(gpus, 8) and len(set(colours)) == len(colours)
        assert page.evaluate("document.getElementById('chart-util')._fullLayout.showlegend") is False
        legend = page.locator("#chart-legend")
        assert legend.locator(".legend-item").count() == min(gpus, 8)
        assert page.evaluate("(e => e.scrollWidth <= e.clientWidth + 1)(document.getElementById('chart-legend'))")
        # The holder in the table, with the reservation's link; the GPU's node page one click away.
        row = page.locator(f'#gpu-table tr:has(td.label a:text-is("{booked_label}"))')
        assert holder in row.locator("td.holder").inner_text()
        assert row.locator("td.label a").get_attribute("href").startswith("/nodes/")
        # Nothing runs wider than the viewport.
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        _shot(page, f"{name}-{width}")

        # The range picker: 24 h reads the minute rollups (three hours ago, out of the live window).
        assert page.evaluate(f"{HEATMAP}.data[1].z.flat().includes({rollup_util})") is False
        page.click('.range-picker button[data-range="24h"]')
        page.wait_for_function("document.getElementById('live').dataset.range === '24h'")
        assert page.evaluate(f"{HEATMAP}.data[1].z.flat().includes({rollup_util})") is True
        span = page.evaluate(f"(d => (new Date(d.at(-1)) - new Date(d[0])) / 3600000)({HEATMAP}.data[1].x)")
        assert 23 <= span <= 24
        assert page.get_attribute('.range-picker button[data-range="24h"]', "aria-pressed") == "true"
        assert "averages per 5 minutes" in page.inner_text("#range-note")
        # ... and a click on "Live" brings the live window back.
        page.click('.range-picker button[data-range="live"]')
        page.wait_for_function("document.getElementById('live').dataset.range === 'live'")
        assert page.evaluate(f"{HEATMAP}.data[1].z.flat().includes({rollup_util})") is False
        assert page.evaluate("document.documentElement.scrollWidth") <= width
    assert errors == []


def test_the_charts_of_an_8_gpu_pool_mark_bookings_and_change_with_the_range(world, asgi_server, page):
    gpus = list(Gpu.objects.filter(pool=world.pool).order_by("node__name", "index"))
    reservation = _hold(world.team, world.pool, gpus[5], world.member)
    _samples([g.pk for g in gpus], 60, lambda i, s: (i * 7 + s) % 100)
    _minute_rollups([g.pk for g in gpus], 77.5)
    _sign_in(page, asgi_server, world.member)
    _check_the_charts(page, f"{asgi_server}/pools/a100/", 8, "node-b:1", f"ML #{reservation.pk}", 77.5, "pool-8")
    # Unticking a GPU in the table takes its line away.
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.set_viewport_size({"width": 1440, "height": 900})
    page.wait_for_function(f"{HEATMAP}._fullLayout.width > 1000")  # redrawn for the new width, not reloaded
    page.locator(f'#gpu-table input[data-pick="{gpus[0].pk}"]').uncheck()
    page.wait_for_function("document.getElementById('chart-util').data.length === 7")
    # Turned to a phone's width the charts shrink; a height change alone (a full-page screenshot, a phone's
    # toolbar) redraws nothing and logs nothing.
    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_function(f"{HEATMAP}._fullLayout.width <= 390 && "
                           "document.getElementById('chart-power')._fullLayout.width <= 390")
    page.screenshot(full_page=True)
    page.wait_for_timeout(500)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    assert errors == []


def test_the_charts_of_a_200_gpu_pool_stay_readable(world, asgi_server, page):
    pool = PoolFactory(slug="big", name="Big")
    cluster = ClusterFactory(slug="big-lab")
    for n in range(25):
        add_node(pool, f"big-{n:02d}", 8, cluster=cluster)
    QuotaFactory(team=world.team, pool=pool, max_ge=8)
    gpus = list(Gpu.objects.filter(pool=pool).order_by("node__name", "index"))
    assert len(gpus) == 200
    other = Team.objects.get(slug="infra")
    QuotaFactory(team=other, pool=pool, max_ge=8)
    _hold(other, pool, gpus[123], world.outsider)
    _samples([g.pk for g in gpus], 45, lambda i, s: (i + 3 * s) % 100)
    _minute_rollups([g.pk for g in gpus], 66.5)
    _sign_in(page, asgi_server, world.member)
    # Another team's booking: the member sees the team, not the reservation.
    _check_the_charts(page, f"{asgi_server}/pools/big/", 200, "big-15:3", "Infra", 66.5, "pool-200")
    height = page.evaluate(f"{HEATMAP}._fullLayout.height")
    assert height <= 900


def test_an_empty_pool_says_what_to_do_instead_of_drawing_empty_charts(world, live_server, page):
    QuotaFactory(team=world.team, pool=PoolFactory(slug="empty", name="Empty"), max_ge=2)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    for user, says in ((world.member, "Ask them"), (world.staff, "python -m agent")):
        _sign_in(page, live_server.url, user)
        for width, height in ((1440, 900), (390, 844)):
            page.set_viewport_size({"width": width, "height": height})
            page.goto(f"{live_server.url}/pools/empty/")
            assert page.locator("#pool-empty").is_visible()
            assert says in page.inner_text("#pool-empty")
            assert page.locator(".js-plotly-plot, #chart-heatmap, .gpu-bars").count() == 0
            assert page.evaluate("document.documentElement.scrollWidth") <= width
            _shot_page(page, f"pool-empty-{user.username}-{width}")
    assert errors == []


def _shot_page(page, name: str) -> None:
    if os.environ.get("SCREENSHOTS"):
        page.screenshot(path=str(Path(os.environ["SCREENSHOTS"]) / f"{name}.png"), full_page=True)
