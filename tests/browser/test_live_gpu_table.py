"""The pool page's "GPUs now" table follows the samples: its Processes column changes with them and its
power keeps one format (whole watts) from the first render to the live updates."""
from __future__ import annotations

import time

import httpx
import pytest
from django.test import Client
from playwright.sync_api import expect

from inventory import services
from inventory.models import Node
from tests.monitoring.conftest import batch, payload, sample

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_gpu_table_updates_processes_and_keeps_the_power_format(world, asgi_server, page):
    node = Node.objects.get(name="node-a")
    _, key = services.host_token_create(actor=world.staff, cluster=node.cluster, host_name=node.name)
    uuid = node.gpus.get(index=0).uuid
    agent = httpx.Client(base_url=asgi_server, headers={"Authorization": f"Host {key}"})
    t = time.time()
    first = sample(uuid, util=10, power_w=84.0, processes=[{"pid": 4242, "used_memory_mib": 1000}])
    assert agent.post("/api/v1/agent/telemetry/", json=payload(batch([first], t=t))).status_code == 200

    client = Client()
    client.force_login(world.member)
    page.context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": asgi_server}])
    page.goto(f"{asgi_server}/pools/a100/")
    page.wait_for_function("document.getElementById('live-status').textContent === 'connected'")
    row = page.locator(f'#gpu-table tr[data-gpu="{node.gpus.get(index=0).pk}"]')
    assert row.locator('[data-f="power"]').inner_text() == "84"
    assert row.locator('[data-f="processes"]').inner_text() == "4242 (1000 MiB)"

    later = sample(uuid, util=20, power_w=84.0, processes=[{"pid": 5151, "used_memory_mib": 2048},
                                                           {"pid": 6161, "used_memory_mib": 512}])
    assert agent.post("/api/v1/agent/telemetry/", json=payload(batch([later], t=t + 1))).status_code == 200
    expect(row.locator('[data-f="util"]')).to_have_text("20")
    assert row.locator('[data-f="power"]').inner_text() == "84"
    assert row.locator('[data-f="processes"]').inner_text() == "5151 (2048 MiB), 6161 (512 MiB)"

    done = sample(uuid, util=0, power_w=61.7, processes=[])
    assert agent.post("/api/v1/agent/telemetry/", json=payload(batch([done], t=t + 2))).status_code == 200
    expect(row.locator('[data-f="util"]')).to_have_text("0")
    assert row.locator('[data-f="power"]').inner_text() == "62"
    assert row.locator('[data-f="processes"]').inner_text() == "none"
