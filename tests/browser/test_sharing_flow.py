"""A member books a MIG slice and half of a time-sliced GPU from the form, sees them on the pools' GPU bars,
and releases them, in a real browser; the shared-mode pages fit a phone's width."""
from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from allocations.models import Reservation
from tests.conftest import sign_in
from tests.factories import (
    ClusterFactory,
    GpuFactory,
    MembershipFactory,
    NodeFactory,
    PoolFactory,
    QuotaFactory,
    TeamFactory,
    UserFactory,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

A100 = "NVIDIA A100-SXM4-80GB"
# SHOTS=/some/dir saves a screenshot of each page at both widths (to look at them; not checked).
SHOTS = os.environ.get("SHOTS")


@pytest.fixture
def shared(db):
    team = TeamFactory(slug="vision", name="Vision")
    cluster = ClusterFactory(slug="lab")
    for slug, name, mode, config, gpus in (
            ("a100-mig", "A100 MIG", "mig", {"mig_layout": "all-1g.10gb"}, 1),
            ("a100-ts", "A100 time-sliced", "time_slicing", {"replicas": 4}, 2),
            ("a100-hami", "A100 vGPU", "vgpu", {"default_memory_mib": 20480, "default_cores_pct": 30}, 2)):
        pool = PoolFactory(slug=slug, name=name, sharing_mode=mode, sharing_config=config)
        node = NodeFactory(cluster=cluster, name=f"{slug}-node")
        for index in range(gpus):
            GpuFactory(node=node, pool=pool, index=index, model_name=A100, memory_mib=81920)
        QuotaFactory(team=team, pool=pool, max_ge=4)
    member = UserFactory(username="member")
    MembershipFactory(user=member, team=team)
    return member


def shoot(page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        width = page.viewport_size["width"]
        page.screenshot(path=str(Path(SHOTS) / f"{name}-{width}.png"), full_page=True)


def ends_in(hours: int) -> str:
    return timezone.localtime(timezone.now() + timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M")


def test_a_member_books_a_mig_slice_and_half_a_gpu_and_releases_them(shared, live_server, page):
    page.set_viewport_size({"width": 1440, "height": 900})
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/reserve/")

    # Choosing the MIG pool swaps in its fields (a profile of its layout, a count) and its timeline.
    page.select_option("select[name=pool]", "a100-mig")
    page.wait_for_selector("select[name=mig_profile]")
    assert page.locator("select[name=mig_profile] option").all_inner_texts() == ["1g.10gb (0.14 GE each)"]
    page.wait_for_selector("#availability:has-text('free 1g.10gb instances')")
    assert page.locator("#availability .slot").first.get_attribute("data-free") == "7"
    shoot(page, "reserve-mig")
    page.fill("input[name=count]", "1")
    page.fill("input[name=ends_at]", ends_in(3))
    page.click("#reserve-form button[type=submit]")
    page.wait_for_url(f"{live_server.url}/reservations/")
    assert "Reserved 1 × 1g.10gb of A100 MIG" in page.locator(".flash").inner_text()
    mig = Reservation.objects.get(pool__slug="a100-mig")

    # Half of a time-sliced GPU: 2 of 4 shares; the note says there is no memory isolation.
    page.goto(f"{live_server.url}/reserve/")
    page.select_option("select[name=pool]", "a100-ts")
    page.wait_for_selector("input[name=shares]")
    assert "no memory isolation" in page.locator(".mode-note").inner_text()
    page.fill("input[name=shares]", "2")
    page.locator("input[name=shares]").dispatch_event("change")
    page.wait_for_selector("#availability:has-text('free shares')")
    shoot(page, "reserve-ts")
    page.fill("input[name=ends_at]", ends_in(3))
    page.click("#reserve-form button[type=submit]")
    page.wait_for_url(f"{live_server.url}/reservations/")
    assert "Reserved 2 of 4 shares of A100 time-sliced" in page.locator(".flash").inner_text()
    ts = Reservation.objects.get(pool__slug="a100-ts")
    row = page.locator(f"#reservation-{ts.pk}").inner_text()
    assert "2 of 4 shares" in row and "0.5" in row
    shoot(page, "reservations")

    # The pools' GPU bars show the parts held, by team and reservation, and what is free.
    page.goto(f"{live_server.url}/pools/a100-mig/")
    held = page.locator(f'.seg.held[data-reservation="{mig.pk}"]')
    assert held.count() == 1 and f"vision #{mig.pk} · 1g.10gb" in held.inner_text()
    assert page.locator(".seg.free").count() == 6
    shoot(page, "pool-mig")
    page.goto(f"{live_server.url}/pools/a100-ts/")
    held = page.locator(f'.seg.held[data-reservation="{ts.pk}"]')
    assert held.count() == 1 and "2 of 4 shares" in held.inner_text()
    box = held.bounding_box()
    track = page.locator(".gpu-bar .track").first.bounding_box()
    assert abs(box["width"] - track["width"] / 2) < 3  # half the card
    shoot(page, "pool-ts")

    page.goto(f"{live_server.url}/reservations/{mig.pk}/")
    assert "1 × 1g.10gb" in page.locator("#booked").inner_text()
    assert re.search(r"GPU-[0-9a-f-]+/[0-6]\b", page.locator("#grants").inner_text())  # the instance's name
    shoot(page, "reservation-mig")

    # Release both; the bars are free again.
    page.goto(f"{live_server.url}/reservations/")
    for reservation in (mig, ts):
        page.once("dialog", lambda dialog: dialog.accept())  # "Release reservation #… now?"
        page.click(f"#reservation-{reservation.pk} button.danger")
        assert f"Reservation #{reservation.pk} released." in page.locator(".flash").inner_text()
    assert set(Reservation.objects.values_list("state", flat=True)) == {"released"}
    page.goto(f"{live_server.url}/pools/a100-ts/")
    assert page.locator(".seg.held").count() == 0 and page.locator(".seg.free").count() == 2


def test_the_shared_pages_fit_a_phone(shared, live_server, page, api):
    # And a pool with a dynamic MIG layout (here only: the form's first pool stays the MIG one above).
    pool = PoolFactory(slug="a100-dmig", name="A100 MIG on demand", sharing_mode="mig", sharing_config={"dynamic": True})
    node = NodeFactory(cluster=ClusterFactory(slug="lab"), name="a100-dmig-node")
    for index in range(2):
        GpuFactory(node=node, pool=pool, index=index, model_name=A100, memory_mib=81920)
    QuotaFactory(team=TeamFactory(slug="vision"), pool=pool, max_ge=4)
    for pool, amount in (("a100-mig", {"mig_profile": "1g.10gb", "count": 2}), ("a100-ts", {"shares": 3}),
                         ("a100-hami", {"gpu_memory_mib": 30720, "gpu_cores_pct": 40}),
                         ("a100-dmig", {"mig_profile": "3g.40gb", "count": 2}),
                         ("a100-dmig", {"mig_profile": "1g.10gb", "count": 1})):
        answer = api(shared).post("/api/v1/reservations/", {"pool": pool, "team": "vision", **amount,
                                                            "ends_at": (timezone.now() + timedelta(hours=2)).isoformat()},
                                  format="json")
        assert answer.status_code == 201, answer.content
    first = Reservation.objects.order_by("pk").first()
    for width, height in ((1440, 900), (390, 844)):
        page.set_viewport_size({"width": width, "height": height})
        sign_in(page, live_server.url)
        for path, name in (("/reserve/?pool=a100-mig", "reserve-mig"), ("/reserve/?pool=a100-ts", "reserve-ts"),
                           ("/reserve/?pool=a100-hami", "reserve-hami"), ("/pools/a100-mig/", "pool-mig"),
                           ("/reserve/?pool=a100-dmig", "reserve-dmig"), ("/pools/a100-dmig/", "pool-dmig"),
                           ("/pools/a100-ts/", "pool-ts"), ("/pools/a100-hami/", "pool-hami"),
                           ("/reservations/", "reservations"), (f"/reservations/{first.pk}/", "reservation")):
            page.goto(f"{live_server.url}{path}")
            page.wait_for_load_state("load")
            shoot(page, f"phone-{name}" if width == 390 else name)
            if name == "pool-dmig":  # one GPU carved 3g + 3g, the 1g on the other (the fuller one had no room) at slice 6
                held = page.locator(".seg.held").all_inner_texts()
                assert sum("3g.40gb" in text for text in held) == 2 and sum("1g.10gb" in text for text in held) == 1
                assert page.locator(".seg.free", has_text=re.compile("6 slices free")).count() == 1
            if name == "reserve-dmig":
                page.wait_for_selector("select[name=mig_profile]")
                assert len(page.locator("select[name=mig_profile] option").all_inner_texts()) == 6
            scroll = page.evaluate("document.documentElement.scrollWidth")
            assert scroll <= width, f"{path} is {scroll} px wide at {width}"
        page.context.clear_cookies()
