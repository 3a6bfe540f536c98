"""/metrics per-GPU DCGM-style gauges and pool/team use; the live pages; the dashboard's allocated-vs-used block."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from allocations.models import Allocation, Reservation
from monitoring.alerts import alerts_evaluate
from monitoring.models import AlertRule
from tests.monitoring.conftest import batch, payload, post, sample

pytestmark = pytest.mark.django_db


def _hold(world, gpus):
    now = timezone.now()
    reservation = Reservation.objects.create(team=world.team, pool=world.pool, gpus=len(gpus), state="active",
                                             starts_at=now - timedelta(hours=1), ends_at=now + timedelta(hours=1))
    for gpu in gpus:
        Allocation.objects.create(reservation=reservation, gpu=gpu, starts_at=reservation.starts_at,
                                  ends_at=reservation.ends_at)


@pytest.fixture(autouse=True)
def _metrics_token(settings):
    settings.METRICS_TOKEN = "scrape-token"


def _scrape() -> dict:
    body = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token").content.decode()
    out = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_metrics_have_dcgm_style_gpu_gauges_and_pool_and_team_use(world, host):
    _hold(world, host.gpus[:2])  # GPU 0 busy, GPU 1 idle
    utils = [80, 0, 40, 7]
    post(host, payload(batch([sample(u, util=utils[i], memory_used_mib=1000 * (i + 1))
                              for i, u in enumerate(host.uuids)])))
    post(host, payload(batch([sample(host.uuids[0], memory_used_mib=-1)])))
    metrics = _scrape()
    util = {labels["UUID"]: (labels, value) for labels, value in metrics["gpupool_dcgm_fi_dev_gpu_util"]}
    labels, value = util[host.uuids[0]]
    assert value == 80 and labels == {"gpu": "0", "UUID": host.uuids[0], "device": "nvidia0",
                                      "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "node-a", "pool": "a100"}
    assert len(util) == 4  # GPUs without a sample (node-b, node-c) are left out
    free = {lab["UUID"]: v for lab, v in metrics["gpupool_dcgm_fi_dev_fb_free"]}
    used = {lab["UUID"]: v for lab, v in metrics["gpupool_dcgm_fi_dev_fb_used"]}
    assert used[host.uuids[2]] == 3000 and free[host.uuids[2]] == 81559 - 3000
    assert {"gpupool_dcgm_fi_dev_gpu_temp", "gpupool_dcgm_fi_dev_power_usage"} <= set(metrics)

    def gauge(name, **match):
        return next(v for labels, v in metrics[name] if labels == match)

    assert gauge("gpupool_pool_capacity_gpus", pool="a100") == 8
    assert gauge("gpupool_pool_allocated_gpus", pool="a100") == 2
    assert gauge("gpupool_pool_used_gpus", pool="a100") == 1
    assert gauge("gpupool_team_allocated_gpus", team="ml") == 2 and gauge("gpupool_team_used_gpus", team="ml") == 1
    assert gauge("gpupool_telemetry_samples_accepted_total") == 4
    assert gauge("gpupool_telemetry_samples_rejected_total", reason="negative_memory") == 1


def test_the_pool_page_shows_live_charts_to_those_who_may_see_the_pool(world, host):
    post(host, payload(batch([sample(u, util=33) for u in host.uuids])))
    member = Client()
    member.force_login(world.member)
    page = member.get("/pools/a100/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "js/plotly-cartesian-3.4.0.min.js" in html and 'data-ws="/ws/pools/a100/"' in html
    data = json.loads(html.split('<script id="chart-data" type="application/json">')[1].split("</script>")[0])
    assert len(data["gpus"]) == 8 and data["window"] == 300
    assert data["history"][str(host.gpus[0].pk)]["util"][0][1] == 33
    assert member.get("/pools/l4/").status_code == 404
    node_c = world.other_pool.gpus.first().node
    assert member.get(f"/nodes/{host.node.pk}/").status_code == 200
    assert member.get(f"/nodes/{node_c.pk}/").status_code == 404
    assert Client().get("/pools/a100/").status_code == 302  # to the login page


def test_the_dashboard_shows_allocated_vs_used_idle_gpus_and_alerts(world, host):
    _hold(world, host.gpus[:3])
    post(host, payload(batch([sample(u, util=[90, 0, 50, 0][i], **({} if i % 2 == 0 else {"processes": []}))
                              for i, u in enumerate(host.uuids)])))
    AlertRule.objects.all().delete()
    AlertRule.objects.create(name="Busy", metric="gpu_util", scope="gpu", threshold=80, for_seconds=0)
    alerts_evaluate()
    client = Client()
    client.force_login(world.owner)
    html = client.get("/").content.decode()
    usage = html.split('<tr data-pool="a100">')[1].split("</tr>")[0]
    assert ('<td class="num" data-f="free">1</td>' in usage and '<td class="num" data-f="booked_busy">2</td>' in usage
            and '<td class="num warn" data-f="booked_idle">1</td>' in usage)
    idle = html.split('id="idle-gpus"')[1].split("</p>")[0]
    assert "a100 node-a:1 (ML, 0 %)" in idle and "node-a:3" not in idle  # 3 is idle but nobody holds it
    alerts = html.split('id="alerts"')[1].split("</section>")[0]
    assert "firing" in alerts and "Busy" in alerts and "node-a GPU 0" in alerts


def test_the_grafana_dashboard_queries_only_metrics_the_portal_exports(world, host):
    import re
    from pathlib import Path

    post(host, payload(batch([sample(u) for u in host.uuids])))
    exported = {name.removesuffix("_total") for name in _scrape()}
    dashboard = json.loads((Path(__file__).resolve().parents[2] / "monitoring/grafana/gpupool.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"gpupool_[a-z_]+", e)}
    assert used and {m.removesuffix("_total") for m in used} <= exported
