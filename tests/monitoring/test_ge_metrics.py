"""/metrics in GPU-equivalents: per team, pool, mode and model, and each pool's worth and what is held."""
from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from tests.allocations.grants import A100, H100, L4, by_hand, mixed_grants

pytestmark = pytest.mark.django_db


def _scrape(settings) -> dict:
    settings.METRICS_TOKEN = "scrape-token"
    body = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token").content.decode()
    out: dict = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_metrics_count_ge_held_per_team_pool_mode_and_model(world, settings):
    now = timezone.now()
    grants = mixed_grants(world, now)
    metrics = _scrape(settings)
    team_ge = {dict(labels)["team"] + "/" + dict(labels)["pool"] + "/" + dict(labels)["mode"] + "/"
               + dict(labels)["model"]: value for labels, value in metrics["gpupool_team_ge_held"].items()}
    assert team_ge == pytest.approx({
        f"ml/a100/exclusive/{H100}": 4.0, f"ml/l4-ts/time_slicing/{L4}": 0.375,
        f"ml/a100-mig/mig/{A100}": 3 / 7, f"ml/a100-vgpu/vgpu/{A100}": 0.4,
        f"infra/a100/exclusive/{H100}": 2.0})
    assert sum(v for k, v in team_ge.items() if k.startswith("ml/")) == pytest.approx(
        by_hand(grants, world.team.pk, timezone.now())[0])
    capacity = {dict(k)["pool"]: v for k, v in metrics["gpupool_pool_ge_capacity"].items()}
    held = {dict(k)["pool"]: v for k, v in metrics["gpupool_pool_ge_held"].items()}
    assert capacity == pytest.approx({"a100": 16.0, "l4": 4.0, "l4-ts": 0.5, "a100-mig": 1.0, "a100-vgpu": 1.0})
    assert held == pytest.approx({"a100": 6.0, "l4": 0.0, "l4-ts": 0.375, "a100-mig": 3 / 7, "a100-vgpu": 0.4})
    # The GPU-count gauges are still there.
    assert {"gpupool_pool_gpus", "gpupool_team_gpus_allocated", "gpupool_reservations"} <= set(metrics)
