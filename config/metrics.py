"""/metrics in Prometheus text format: pool capacity and occupancy, reservations by state, team holdings,
and live GPU telemetry.

Per-GPU gauges are named like NVIDIA's DCGM exporter's fields, lower-cased with our
prefix, and carry its labels (gpu, UUID, modelName, Hostname) plus pool, so dashboards
written for dcgm-exporter port by renaming the metric:

| ours                                  | dcgm-exporter            | unit |
|---------------------------------------|--------------------------|------|
| gpupool_dcgm_fi_dev_gpu_util          | DCGM_FI_DEV_GPU_UTIL     | %    |
| gpupool_dcgm_fi_dev_mem_copy_util     | DCGM_FI_DEV_MEM_COPY_UTIL| %    |
| gpupool_dcgm_fi_dev_fb_used           | DCGM_FI_DEV_FB_USED      | MiB  |
| gpupool_dcgm_fi_dev_fb_free           | DCGM_FI_DEV_FB_FREE      | MiB  |
| gpupool_dcgm_fi_dev_gpu_temp          | DCGM_FI_DEV_GPU_TEMP     | °C   |
| gpupool_dcgm_fi_dev_power_usage       | DCGM_FI_DEV_POWER_USAGE  | W    |

They come from the hot cache (one get_many of the per-node keys) and one inventory query, never
a query per GPU; a GPU without a sample in the last two minutes is left out, as the
exporter leaves out a GPU it cannot read. Pool and team gauges: capacity, allocated,
used (allocated and above the idle threshold), and in GPU-equivalents (what quotas count):
gpupool_team_ge_held{team,pool,mode,model}, gpupool_pool_ge_capacity{pool} and
gpupool_pool_ge_held{pool}. Ingest counters: samples accepted and
rejected or clamped by reason.
"""
from __future__ import annotations


from django.conf import settings
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from allocations.models import Allocation, Reservation
from allocations.selectors import ge_held_now, pools_ge, with_occupancy
from common.secrets import bearer_token, same_secret
from inventory.models import Gpu, GpuPool


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

        # GPU-equivalents (weights, shares, MIG slices and vGPU grants applied): what quotas count.
        team_ge = GaugeMetricFamily("gpupool_team_ge_held",
                                    "GPU-equivalents a team holds now in a pool, by sharing mode and GPU model",
                                    labels=["team", "pool", "mode", "model"])
        for row in ge_held_now(now):
            team_ge.add_metric([row.team, row.pool, row.mode, row.model], row.ge)
        yield team_ge
        pool_capacity = GaugeMetricFamily("gpupool_pool_ge_capacity",
                                          "A pool's GPUs in GPU-equivalents (each its model's weight now)",
                                          labels=["pool"])
        pool_held = GaugeMetricFamily("gpupool_pool_ge_held", "GPU-equivalents held now of a pool's GPUs",
                                      labels=["pool"])
        for pool in pools_ge(GpuPool.objects.order_by("slug"), now):
            pool_capacity.add_metric([pool.pool.slug], pool.capacity)
            pool_held.add_metric([pool.pool.slug], pool.held_now)
        yield pool_capacity
        yield pool_held


DCGM_FIELDS = [
    ("gpu_util", "GPU utilization (in %).", lambda s: s.util),
    ("mem_copy_util", "Memory utilization (in %).", lambda s: s.mem_util),
    ("fb_used", "Framebuffer memory used (in MiB).", lambda s: s.mem_used),
    ("fb_free", "Framebuffer memory free (in MiB).", lambda s: max(0, s.mem_total - s.mem_used)),
    ("gpu_temp", "GPU temperature (in C).", lambda s: s.temp),
    ("power_usage", "Power draw (in W).", lambda s: s.power),
]


class TelemetryCollector:
    """Per-GPU DCGM-style gauges and pool/team use, from the hot cache plus one inventory query."""

    def collect(self):
        from django.conf import settings

        from monitoring import hot, ingest
        from teams.models import Team

        now = timezone.now()
        gpus = list(Gpu.objects.values_list("id", "index", "uuid", "model_name", "node__name", "pool__slug",
                                            "node_id"))
        latest = hot.latest_get((g[0], g[6]) for g in gpus)
        labels = ["gpu", "UUID", "modelName", "Hostname", "pool"]
        families = [(GaugeMetricFamily(f"gpupool_dcgm_fi_dev_{name}", doc, labels=labels), read)
                    for name, doc, read in DCGM_FIELDS]
        for gpu_id, index, uuid, model, host, pool, _ in gpus:
            sample = latest.get(gpu_id)
            if sample is None:
                continue
            values = [str(index), uuid, model, host, pool or ""]
            for family, read in families:
                family.add_metric(values, read(sample))
        yield from (family for family, _ in families)

        holder = dict(Allocation.objects.filter(starts_at__lte=now, ends_at__gt=now)
                      .values_list("gpu_id", "reservation__team__slug"))
        idle_at = settings.TELEMETRY_IDLE_UTIL_PCT
        pools: dict[str, list[int]] = {}
        teams: dict[str, list[int]] = {slug: [0, 0] for slug in Team.objects.values_list("slug", flat=True)}
        for gpu_id, _, _, _, _, pool, _ in gpus:
            if pool is None:
                continue
            row = pools.setdefault(pool, [0, 0, 0])
            row[0] += 1
            team = holder.get(gpu_id)
            if team is None:
                continue
            sample = latest.get(gpu_id)
            busy = sample is not None and sample.util > idle_at
            row[1] += 1
            row[2] += busy
            teams.setdefault(team, [0, 0])
            teams[team][0] += 1
            teams[team][1] += busy
        for name, doc, col in [("capacity", "GPUs in the pool", 0), ("allocated", "GPUs of the pool allocated now", 1),
                               ("used", "Allocated GPUs of the pool busier than the idle threshold", 2)]:
            family = GaugeMetricFamily(f"gpupool_pool_{name}_gpus", doc, labels=["pool"])
            for pool, row in sorted(pools.items()):
                family.add_metric([pool], row[col])
            yield family
        for name, doc, col in [("allocated", "GPUs the team holds now", 0),
                               ("used", "GPUs the team holds that are busier than the idle threshold", 1)]:
            family = GaugeMetricFamily(f"gpupool_team_{name}_gpus", doc, labels=["team"])
            for team, row in sorted(teams.items()):
                family.add_metric([team], row[col])
            yield family

        reasons = ("accepted",) + ingest.REJECT_REASONS + ingest.CLAMP_REASONS
        totals = hot.counters(reasons)
        accepted = CounterMetricFamily("gpupool_telemetry_samples_accepted", "Telemetry samples stored")
        accepted.add_metric([], totals["accepted"])
        yield accepted
        rejected = CounterMetricFamily("gpupool_telemetry_samples_rejected", "Telemetry samples refused, by reason",
                                       labels=["reason"])
        for reason in ingest.REJECT_REASONS:
            rejected.add_metric([reason], totals[reason])
        yield rejected
        clamped = CounterMetricFamily("gpupool_telemetry_samples_clamped", "Telemetry samples corrected, by reason",
                                      labels=["reason"])
        for reason in ingest.CLAMP_REASONS:
            clamped.add_metric([reason], totals[reason])
        yield clamped


def metrics(request: HttpRequest) -> HttpResponse:
    # The figures name teams, pools, hosts and GPU UUIDs: only a scraper that sends the token gets
    # them, or anyone where they were declared public (the embedded demo, or METRICS_PUBLIC=true).
    token = settings.METRICS_TOKEN
    if token and not same_secret(bearer_token(request) or "", token):
        response = HttpResponse("Send the metrics token: Authorization: Bearer <METRICS_TOKEN>\n", status=401,
                                content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    if not token and not settings.METRICS_PUBLIC:
        return HttpResponse("/metrics names teams, hosts and GPUs, so it is closed until METRICS_TOKEN is set "
                            "(scrape with Authorization: Bearer <METRICS_TOKEN>); set METRICS_PUBLIC=true instead "
                            "where the ingress already protects /metrics.\n", status=403, content_type="text/plain")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PortalCollector())
    registry.register(TelemetryCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
