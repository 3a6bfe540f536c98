"""A member books "H100 only" from the reserve form of a pool of two models, in a real browser, in English and in
Chinese, and reads the restriction on the reservation's page and in the list; at a phone's width no page is wider
than the screen. Ticking a model recounts the timeline and the GE a card costs. Screenshots at desktop and phone
width go to $SCREENSHOTS_MODELS when it is set."""
from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from allocations.models import Reservation
from tests.allocations.test_gpu_models import A100, H100, mixed  # noqa: F401 - the fixture
from tests.conftest import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def shoot(page, name: str) -> None:
    folder = os.environ.get("SCREENSHOTS_MODELS")
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(100)
        if width == 390:
            scroll = page.evaluate("document.documentElement.scrollWidth")
            assert scroll <= 390, f"{name} is {scroll} px wide at 390"
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(Path(folder) / f"{name}-{width}.png"), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 900})


@pytest.mark.parametrize("language, words", [
    ("en", {"legend": "GPU models", "only": "only", "any": "any model of the pool"}),
    ("zh-hans", {"legend": "GPU 型号", "only": "仅限", "any": "资源池中任何型号"}),
])
def test_a_member_books_h100_only_from_the_form(world, mixed, live_server, page, language, words):
    sign_in(page, live_server.url)
    if language != "en":
        page.select_option("header select[name=language]", language)
        page.wait_for_function(f"document.documentElement.lang === '{language}'")
    page.goto(f"{live_server.url}/reserve/")
    page.select_option("select[name=team]", "ml")
    page.select_option("select[name=pool]", "mixed")
    page.wait_for_load_state("networkidle")  # the pool's amount fields, and its models, swapped in (HTMX)
    models = page.locator("#gpu-models")
    assert models.locator("legend").inner_text() == words["legend"]
    assert models.locator("input[type=checkbox]").count() == 2
    # Ticking a model recounts the timeline on its GPUs alone (4 of the pool's 8; nothing is booked), and what a
    # card costs becomes the heaviest ticked model's (H100: 2 GE, A100: 1 GE; none ticked: the heaviest).
    free, ge_each = page.locator("#availability .timeline .slot").first, page.locator("#amount .ge-each")
    expect(free).to_have_attribute("data-free", "8")
    expect(ge_each).to_have_text("2")
    for action, model, gpus, ge in ((page.check, A100, "4", "1"), (page.check, H100, "8", "2"),
                                    (page.uncheck, A100, "4", "2")):
        action(f"#gpu-models input[value='{model}']")
        expect(free).to_have_attribute("data-free", gpus)
        expect(ge_each).to_have_text(ge)
    shoot(page, f"reserve-models-{language}")
    page.fill("input[name=gpus]", "2")
    ends_at = timezone.localtime(timezone.now() + timedelta(hours=3)).strftime("%Y-%m-%d %H:%M")
    page.fill("input[name=ends_at]", ends_at)
    shoot(page, f"reserve-{language}")
    page.click("#reserve-form button[type=submit]")
    page.wait_for_url(f"{live_server.url}/reservations/")
    reservation = Reservation.objects.get()
    assert reservation.gpu_models == [H100]
    assert set(reservation.allocations.values_list("gpu__model_name", flat=True)) == {H100}
    row = page.locator(f"#reservation-{reservation.pk}")
    assert f"{words['only']} {H100}" in row.locator(".gpu-models").inner_text()
    shoot(page, f"reservations-{language}")
    page.goto(f"{live_server.url}/reservations/{reservation.pk}/")
    assert page.locator("#gpu-models").inner_text() == H100
    shoot(page, f"detail-{language}")
    # One booked for any model says so.
    page.goto(f"{live_server.url}/reserve/?pool=mixed")
    page.select_option("select[name=team]", "ml")
    page.fill("input[name=gpus]", "1")
    page.fill("input[name=ends_at]", ends_at)
    page.click("#reserve-form button[type=submit]")
    page.wait_for_url(f"{live_server.url}/reservations/")
    other = Reservation.objects.exclude(pk=reservation.pk).get()
    assert other.gpu_models == []
    page.goto(f"{live_server.url}/reservations/{other.pk}/")
    assert page.locator("#gpu-models").inner_text() == words["any"]
