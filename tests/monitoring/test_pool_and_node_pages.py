"""Pool and node pages: an empty pool says what to do, node pages are reachable from the pool page and the GPU
table, and the staff's lease list names reservations and teams instead of raw lease keys."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from allocations.models import Allocation, HostLeaseReport, Reservation
from inventory.models import Node
from tests.factories import PoolFactory, QuotaFactory

pytestmark = pytest.mark.django_db


def _page(user, path: str) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(path)
    assert response.status_code == 200
    return response.content.decode()


def test_a_pool_without_gpus_tells_members_to_ask_staff_and_draws_no_chart(world):
    QuotaFactory(team=world.team, pool=PoolFactory(slug="empty", name="Empty"), max_ge=2)
    html = _page(world.member, "/pools/empty/")
    assert 'id="pool-empty"' in html and "until platform staff add GPUs" in html
    # No chart to draw on an empty axis (it showed the year 2000), no "0/0" bar.
    assert 'id="chart-data"' not in html and "plotly" not in html and "python -m agent" not in html


def test_a_pool_without_gpus_tells_staff_how_to_add_a_host_agent_or_a_cluster(world):
    PoolFactory(slug="empty", name="Empty")
    html = _page(world.staff, "/pools/empty/")
    empty = html.split('id="pool-empty"')[1].split("</section>")[0]
    assert "python -m agent --portal http://testserver --token KEY" in empty
    assert "/admin/inventory/hosttoken/add/" in empty and "/admin/inventory/cluster/add/" in empty
    assert "/admin/inventory/gpu/" in empty


def test_the_pool_page_links_each_node_and_each_gpu_to_its_node_page(world):
    html = _page(world.member, "/pools/a100/")
    for node in Node.objects.filter(gpus__pool=world.pool).distinct():
        assert f'<a href="/nodes/{node.pk}/">{node.name}</a>' in html  # the nodes line
        assert html.count(f'<td class="label"><a href="/nodes/{node.pk}/">{node.name}:') == 4  # the GPU table
    node = Node.objects.get(name="node-a")
    assert f'<a href="/pools/a100/">{world.pool.name}</a>' in _page(world.member, f"/nodes/{node.pk}/")


def test_the_gpu_table_names_each_holder_with_a_link_only_for_the_viewers_team(world):
    now = timezone.now()
    gpus = list(world.pool.gpus.order_by("node__name", "index"))
    mine, theirs = (Reservation.objects.create(team=team, pool=world.pool, gpus=1, state="active",
                                               starts_at=now - timedelta(hours=1), ends_at=now + timedelta(hours=1))
                    for team in (world.team, world.other_team))
    for reservation, gpu in ((mine, gpus[0]), (theirs, gpus[1])):
        Allocation.objects.create(reservation=reservation, gpu=gpu, starts_at=reservation.starts_at,
                                  ends_at=reservation.ends_at)
    html = _page(world.member, "/pools/a100/")
    holders = [cell.split("</td>")[0] for cell in html.split('<td class="holder">')[1:]]
    assert holders[0] == f'<a href="/reservations/{mine.pk}/">ML #{mine.pk}</a>'
    assert holders[1] == "Infra"  # another team's booking: its name, not its reservation
    assert "free" in holders[2]


def test_staff_see_leases_as_reservation_team_and_gpu_not_raw_keys(world):
    node = Node.objects.get(name="node-a")
    gpu = node.gpus.get(index=2)
    now = timezone.now()
    reservation = Reservation.objects.create(team=world.team, pool=world.pool, gpus=1, state="active",
                                             starts_at=now - timedelta(hours=1), ends_at=now + timedelta(hours=1))
    HostLeaseReport.objects.create(node=node, held=[f"{reservation.pk}:{gpu.uuid}"],
                                   failed={f"999999:{gpu.uuid}": "no such device"}, unleased_in_use=[gpu.uuid],
                                   reported_at=now)
    html = _page(world.staff, f"/nodes/{node.pk}/")
    held = html.split('id="leases-held"')[1].split("</ul>")[0]
    assert f'<a href="/reservations/{reservation.pk}/">reservation #{reservation.pk}</a> of ML on GPU 2' in held
    assert f">{reservation.pk}:{gpu.uuid}<" not in held  # the raw key only as a tooltip
    assert "Refused an unknown reservation on GPU 2" in html
    assert "Running processes without a lease: GPU 2" in html
    assert "leases-held" not in _page(world.member, f"/nodes/{node.pk}/")  # staff only, as before


def test_a_nodes_history_answers_those_who_may_watch_it_and_names_a_bad_range(world, api):
    from tests.browser.test_pool_charts import _minute_rollups as minute_rollups

    node = Node.objects.get(name="node-a")
    gpu_ids = list(node.gpus.values_list("pk", flat=True))
    minute_rollups(gpu_ids, 42.5)
    body = api(world.member).get(f"/api/v1/nodes/{node.pk}/telemetry/?range=24h").json()
    assert body["node"] == node.pk and body["resolution"] == "minute" and body["step"] == 300
    assert {g["gpu"] for g in body["gpus"]} == set(gpu_ids)
    assert {p[1] for g in body["gpus"] for p in g["util"]} == {42.5}
    node_c = world.other_pool.gpus.first().node
    assert api(world.member).get(f"/api/v1/nodes/{node_c.pk}/telemetry/").status_code == 404
    bad = api(world.member).get(f"/api/v1/nodes/{node.pk}/telemetry/?range=2y")
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "range"
    assert bad.json()["errors"][0]["rule"] == "invalid_choice"


def _chinese_page(user, path: str) -> str:
    client = Client(HTTP_ACCEPT_LANGUAGE="zh-hans")
    client.force_login(user)
    response = client.get(path)
    assert response.status_code == 200 and response["Content-Language"] == "zh-hans"
    return response.content.decode()


def _chart_words(html: str) -> dict:
    import json

    return json.loads(html.split('<script id="chart-data" type="application/json">')[1].split("</script>")[0])["words"]


def test_the_pool_and_node_pages_speak_chinese_headings_and_chart_labels(world):
    node = Node.objects.get(name="node-a")
    for html in (_chinese_page(world.member, "/pools/a100/"), _chinese_page(world.member, f"/nodes/{node.pk}/")):
        assert "<h2>遥测</h2>" in html and "<h2>当前 GPU</h2>" in html and "<th>持有者</th>" in html
        assert 'data-title="GPU 利用率（%）"' in html and 'data-title="功耗（W）"' in html  # units kept
        assert 'data-title="SM 时钟（MHz）"' in html and '<th class="num">利用率 %</th>' in html
        assert 'data-range="7d" aria-pressed="false">7 天</button>' in html
        # What live-charts.js writes (hover, legend, notes), from the page in the viewer's language.
        words = _chart_words(html)
        assert words["hover_util"] == "利用率 {value} %" and words["free"] == "空闲"
        assert words["share_use"] == "已用 {used} / {allocated} MiB" and words["states"]["firing"] == "告警中"
        assert "Telemetry" not in html and "GPUs now" not in html
    pool = _chinese_page(world.member, "/pools/a100/")
    assert "<h2>每个 GPU 当前的持有者</h2>" in pool and ">预约</a> · 节点：" in pool
    # The English page is unchanged.
    english = _page(world.member, "/pools/a100/")
    assert "<h2>Telemetry</h2>" in english and 'data-title="GPU utilization (%)"' in english
    assert _chart_words(english)["hover_util"] == "{value} % utilization"
