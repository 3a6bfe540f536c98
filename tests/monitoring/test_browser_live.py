"""In headless Chromium: the pool page's Plotly charts grow as an agent's samples stream in over the WebSocket,
and an older sample arriving late (an agent's backlog) never draws the line back in time."""
from __future__ import annotations

import time

import httpx
import pytest
from django.test import Client

from inventory import services
from inventory.models import Node
from tests.monitoring.conftest import batch, payload, sample

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

POINTS = "([id, i]) => document.getElementById(id).data[i].x.length"


def test_the_pool_charts_extend_in_place_as_samples_arrive(world, asgi_server, page):
    node = Node.objects.get(name="node-a")
    _, key = services.host_token_create(actor=world.staff, cluster=node.cluster, host_name=node.name)
    uuids = list(node.gpus.order_by("index").values_list("uuid", flat=True))
    agent = httpx.Client(base_url=asgi_server, headers={"Authorization": f"Host {key}"})

    # The server process hashes passwords its own way (the suite uses a fast hasher): sign in by session cookie.
    client = Client()
    client.force_login(world.member)
    page.context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": asgi_server}])
    page.goto(f"{asgi_server}/pools/a100/")
    page.wait_for_function("document.getElementById('live-status').textContent === 'connected'")
    assert page.evaluate(POINTS, ["chart-util", 0]) == 0  # no history yet
    loaded_at = page.evaluate("performance.timeOrigin")

    t = time.time()
    for i in range(5):
        body = payload(batch([sample(u, util=10 + 10 * i + g) for g, u in enumerate(uuids)], t=t + i))
        assert agent.post("/api/v1/agent/telemetry/", json=body).status_code == 200
        page.wait_for_function(f"document.getElementById('chart-util').data[0].x.length >= {i + 1}")

    assert page.evaluate(POINTS, ["chart-util", 0]) == 5
    assert page.evaluate(POINTS, ["chart-temp", 3]) == 5
    assert page.evaluate(POINTS, ["chart-util", 5]) == 0  # node-b's GPUs sent nothing
    assert page.evaluate("document.getElementById('chart-util').data[0].y") == [10, 20, 30, 40, 50]
    assert page.locator('#gpu-table tr[data-gpu] [data-f="util"]').first.inner_text() == "50"
    assert page.evaluate("performance.timeOrigin") == loaded_at  # extended in place, never reloaded

    # A backlog from before those five (another stream, as an agent restarted after an outage would
    # send) is stored, but the charts and the table keep the newest values.
    old = payload(batch([sample(u, util=99) for u in uuids], t=t - 30), stream="backlog-stream")
    assert agent.post("/api/v1/agent/telemetry/", json=old).status_code == 200
    body = payload(batch([sample(u, util=60 + g, sm_clock_mhz=1755, ecc_corrected=2, ecc_uncorrected=0, xid=79)
                          for g, u in enumerate(uuids)], t=t + 5))
    assert agent.post("/api/v1/agent/telemetry/", json=body).status_code == 200
    page.wait_for_function("document.getElementById('chart-util').data[0].x.length >= 6")
    assert page.evaluate("document.getElementById('chart-util').data[0].y") == [10, 20, 30, 40, 50, 60]
    assert page.locator('#gpu-table tr[data-gpu] [data-f="util"]').first.inner_text() == "60"
    # The health figures the agent sent, live in the table.
    first = page.locator("#gpu-table tr[data-gpu]").first
    assert [first.locator(f'[data-f="{f}"]').inner_text() for f in ("sm_clock", "ecc", "xid")] == ["1755", "2 / 0", "79"]


def test_the_pool_page_shows_each_holders_memory_against_its_share_live(world, asgi_server, page):
    from tests.monitoring.test_shares import proc, reserve

    world.pool.sharing_mode, world.pool.sharing_config = "time_slicing", {"replicas": 4}
    world.pool.save()
    node = Node.objects.get(name="node-a")
    gpu = node.gpus.order_by("index").first()
    mine = reserve(world, world.member, world.team, "time_slicing", gpu, slots=[0])
    reserve(world, world.outsider, world.other_team, "time_slicing", gpu, slots=[1, 2])
    _, key = services.host_token_create(actor=world.staff, cluster=node.cluster, host_name=node.name)
    agent = httpx.Client(base_url=asgi_server, headers={"Authorization": f"Host {key}"})
    client = Client()
    client.force_login(world.member)
    page.context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": asgi_server}])
    page.goto(f"{asgi_server}/pools/a100/")
    page.wait_for_function("document.getElementById('live-status').textContent === 'connected'")

    # member's process uses more than its one share of four (81559 / 4 = 20389 MiB); the other team's less.
    processes = [proc(100, 30000, user="member"), proc(200, 10000, user="outsider")]
    body = payload(batch([sample(gpu.uuid, processes=processes)], t=time.time()))
    assert agent.post("/api/v1/agent/telemetry/", json=body).status_code == 200
    mine_seg = f'.gpu-bar[data-gpu="{gpu.pk}"] .seg[data-reservation="{mine.pk}"]'
    page.wait_for_selector(f"{mine_seg} .seg-used.over")
    assert page.locator(f"{mine_seg} .seg-used").evaluate("e => e.style.width") == "100%"
    holder = page.locator(f'.gpu-bar[data-gpu="{gpu.pk}"] ul.holders li[data-reservation="{mine.pk}"] .share-use')
    assert holder.inner_text() == "uses 30000 of 20389 MiB"
    # The other team's parts show no reservation id to this member, and no use either.
    assert page.locator(f'.gpu-bar[data-gpu="{gpu.pk}"] .share-use').count() == 1

    # Back within its share: the line shrinks and is no longer red.
    body = payload(batch([sample(gpu.uuid, processes=[proc(100, 10000, user="member")])], t=time.time() + 1))
    assert agent.post("/api/v1/agent/telemetry/", json=body).status_code == 200
    page.wait_for_function(f"!document.querySelector('{mine_seg} .seg-used').classList.contains('over')")
    assert holder.inner_text() == "uses 10000 of 20389 MiB"


def test_the_pool_charts_speak_the_viewers_language(world, asgi_server, page):
    from teams.models import Preference

    Preference.objects.create(user=world.member, language="zh-hans")
    node = Node.objects.get(name="node-a")
    _, key = services.host_token_create(actor=world.staff, cluster=node.cluster, host_name=node.name)
    uuids = list(node.gpus.order_by("index").values_list("uuid", flat=True))
    agent = httpx.Client(base_url=asgi_server, headers={"Authorization": f"Host {key}"})
    client = Client()
    client.force_login(world.member)
    page.context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": asgi_server}])
    page.goto(f"{asgi_server}/pools/a100/")
    page.wait_for_function("document.getElementById('live-status').textContent === '已连接'")
    assert page.locator("#range-note").inner_text() == "实时，每秒更新：最近 300 秒。"
    assert page.evaluate("document.getElementById('chart-power').layout.title.text") == "功耗（W）"
    t = time.time()
    body = payload(batch([sample(u, util=40, processes=[]) for u in uuids], t=t))
    assert agent.post("/api/v1/agent/telemetry/", json=body).status_code == 200
    page.wait_for_function("document.getElementById('chart-util').data[0].x.length >= 1")
    assert page.locator('#gpu-table tr[data-gpu] [data-f="processes"]').first.inner_text() == "无"
    hover = page.evaluate("document.getElementById('chart-heatmap').data[1].hovertemplate")
    assert "利用率 %{z} %" in hover
    page.get_by_role("button", name="1 小时").click()
    page.wait_for_function("document.getElementById('range-note').textContent.startsWith('最近 1 小时：每 ')")
    assert "历史）；实时数据会持续更新表格。" in page.locator("#range-note").inner_text()
    # Plotly's own words and dates follow: its zh-CN locale is loaded and asked for.
    assert page.evaluate("document.getElementById('chart-util')._context.locale") == "zh-CN"
    ticks = page.locator("#chart-util .xtick text").all_text_contents()
    assert ticks and not any(month in " ".join(ticks) for month in ("Jan", "Nov", "Dec"))
