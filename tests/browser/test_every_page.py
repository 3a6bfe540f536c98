"""Every page, as a member, a manager and staff, on a desktop (1440x900) and a phone (390x844): no console
error, no request to any host but the portal's own, and at 390 px nothing wider than the screen (wide
tables and charts scroll or shrink inside their own box)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest
from django.test import Client
from django.utils import timezone

from allocations.models import Reservation
from inventory import services
from inventory.models import Node
from tests.factories import TeamFactory, window
from tests.monitoring.conftest import batch, payload, sample

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

VIEWPORTS = ((1440, 900), (390, 844))


def _fleet(world, base_url: str, api) -> dict:
    """A booking to open, and a few seconds of telemetry from node-a so the tables and charts have rows."""
    for user, team, gpus, hours in ((world.member, "ml", 2, 3), (world.owner, "ml", 1, 26),
                                    (world.outsider, "infra", 3, 2)):
        created = api(user).post("/api/v1/reservations/", {"pool": "a100", "team": team, "gpus": gpus,
                                                           "ends_at": window(0, hours)[1].isoformat()}, format="json")
        assert created.status_code == 201, created.content
    TeamFactory(slug="audio", name="Audio")  # a third team: staff's nav lists the teams in a menu
    node = Node.objects.get(name="node-a")
    _, key = services.host_token_create(actor=world.staff, cluster=node.cluster, host_name=node.name)
    uuids = list(node.gpus.order_by("index").values_list("uuid", flat=True))
    agent = httpx.Client(base_url=base_url, headers={"Authorization": f"Host {key}"})
    t = time.time() - 10
    for i in range(10):
        body = payload(batch([sample(u, util=20 + 7 * g + i) for g, u in enumerate(uuids)], t=t + i))
        assert agent.post("/api/v1/agent/telemetry/", json=body).status_code == 200
    ml = Reservation.objects.filter(team__slug="ml").order_by("pk").first()
    return {"reservation": ml.pk, "node": node.pk}


def _paths(ids: dict) -> list[tuple[str, int]]:
    return [("/", 200), ("/reserve/", 200), ("/reservations/", 200), (f"/reservations/{ids['reservation']}/", 200),
            ("/teams/ml/", 200), ("/pools/a100/", 200), ("/pools/a100/queue/", 200), (f"/nodes/{ids['node']}/", 200),
            ("/telemetry/", 200), ("/tokens/", 200), ("/notifications/", 200), ("/api/v1/docs/", 200),
            ("/reports/", 200), (f"/teams/ml/statements/{timezone.now():%Y-%m}/", 200), ("/no/such/page/", 404)]


def test_every_page_fits_and_stays_quiet_for_every_role(world, asgi_server, page, api):
    ids = _fleet(world, asgi_server, api)
    outside: list[str] = []
    errors: list[str] = []
    where = {"now": ""}

    def only_ours(route):
        if route.request.url.startswith(asgi_server):
            route.continue_()
        else:
            outside.append(f"{where['now']}: {route.request.url}")
            route.abort()

    page.route("**/*", only_ours)
    page.on("console", lambda msg: msg.type == "error" and errors.append(f"{where['now']}: {msg.text}"))
    page.on("pageerror", lambda error: errors.append(f"{where['now']}: {error}"))
    shots = os.environ.get("SCREENSHOTS")
    too_wide = []
    for persona, user in (("member", world.member), ("manager", world.owner), ("staff", world.staff)):
        # The server process hashes passwords its own way (the suite uses a fast hasher): sign in by cookie.
        client = Client()
        client.force_login(user)
        page.context.clear_cookies()
        page.context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value,
                                   "url": asgi_server}])
        for width, height in VIEWPORTS:
            page.set_viewport_size({"width": width, "height": height})
            for path, status in _paths(ids):
                where["now"] = f"{persona} {path} at {width}"
                response = page.goto(f"{asgi_server}{path}")
                assert response.status == status, where["now"]
                if path == "/api/v1/docs/":
                    page.wait_for_selector(".swagger-ui .opblock", timeout=20000)
                page.wait_for_load_state("networkidle")
                if status == 404:  # the browser reports the page's own status as an error: that one is expected
                    errors[:] = [e for e in errors if not (e.startswith(where["now"]) and "404" in e)]
                if width == 390:
                    scroll_width = page.evaluate("document.documentElement.scrollWidth")
                    if scroll_width > width:
                        too_wide.append(f"{where['now']}: {scroll_width} px")
                if shots:
                    name = f"{persona}-{path.strip('/').replace('/', '-') or 'dashboard'}-{width}.png"
                    page.screenshot(path=str(Path(shots) / name), full_page=True)
        if persona == "staff":  # every team's page is a click away, on a phone too
            where["now"] = "staff teams menu at 390"
            page.goto(f"{asgi_server}/")
            page.click("header nav summary:has-text('Teams')")
            page.click("header nav a:has-text('Audio')")
            page.wait_for_url(f"{asgi_server}/teams/audio/")
        # Charts drawn on a desktop shrink with the window (a phone turned, a window narrowed), no reload.
        for path in ("/pools/a100/", f"/nodes/{ids['node']}/"):
            where["now"] = f"{persona} {path} narrowed from 1440 to 390"
            page.set_viewport_size({"width": 1440, "height": 900})
            page.goto(f"{asgi_server}{path}")
            page.wait_for_load_state("networkidle")
            page.set_viewport_size({"width": 390, "height": 844})
            page.wait_for_function("document.documentElement.scrollWidth <= 390", timeout=5000)
            widest = page.evaluate("Math.max(...[...document.querySelectorAll('.js-plotly-plot')]"
                                   ".map(c => c.getBoundingClientRect().right))")
            assert widest <= 390, where["now"]
    assert outside == []
    assert errors == []
    assert too_wide == []
