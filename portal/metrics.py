"""/metrics in Prometheus text format: pool capacity and occupancy, reservations by state, team holdings.

Per-GPU telemetry gauges join here with the telemetry issue.
"""
from __future__ import annotations

from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from allocations.models import Allocation, Reservation
from allocations.selectors import with_occupancy
from inventory.models import GpuPool


class PortalCollector:
    """Reads the database at scrape time, so every replica reports the same truth."""

    def collect(self):
        now = timezone.now()
        pool_gpus = GaugeMetricFamily("gpupool_pool_gpus", "GPUs in a pool by condition", labels=["pool", "kind"])
        for pool in with_occupancy(GpuPool.objects.all(), now):
            pool_gpus.add_metric([pool.slug, "total"], pool.gpus_total or 0)
            pool_gpus.add_metric([pool.slug, "healthy"], pool.gpus_healthy or 0)
            pool_gpus.add_metric([pool.slug, "allocated"], pool.gpus_allocated or 0)
        yield pool_gpus

        by_state = dict(Reservation.objects.values_list("state").annotate(n=Count("id")))
        reservations = GaugeMetricFamily("gpupool_reservations", "Reservations by state", labels=["state"])
        for state in Reservation.State.values:
            reservations.add_metric([state], by_state.get(state, 0))
        yield reservations

        held = GaugeMetricFamily("gpupool_team_gpus_allocated", "GPUs a team holds now in a pool",
                                 labels=["team", "pool"])
        rows = (
            Allocation.objects.filter(starts_at__lte=now, ends_at__gt=now)
            .values_list("reservation__team__slug", "reservation__pool__slug").annotate(n=Count("id"))
        )
        for team, pool, n in rows:
            held.add_metric([team, pool], n)
        yield held


def metrics(request: HttpRequest) -> HttpResponse:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PortalCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
