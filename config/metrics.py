"""/metrics in Prometheus text format: pool capacity and occupancy, reservations by state, team holdings,
and live GPU telemetry.

Per-GPU gauges are named like NVIDIA's DCGM exporter's fields, lower-cased with our
prefix, and carry its labels (gpu, UUID, device, modelName, Hostname) plus pool, so dashboards
written for dcgm-exporter port by renaming the metric. As the exporter does, a GPU in MIG mode
also has one series per MIG instance of the memory gauges (fb_used, fb_free), with its labels
GPU_I_PROFILE (e.g. 1g.10gb) and GPU_I_ID (NVML's GPU instance id; an instance whose id its host
never reported is left out rather than given a made-up one):

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

Per share (one reservation's part of a GPU or MIG instance, monitoring.shares):
gpupool_share_memory_allocated_mib and gpupool_share_memory_used_mib, labels team,
reservation, pool, mode and the GPU's DCGM labels, plus GPU_I_PROFILE, GPU_I_ID and
mig_instance (our id of the instance, unique where GPU_I_ID is not known) for a MIG share; used
is the memory of the processes attributed to it at ingest. gpupool_gpu_memory_unattributed_mib:
memory of processes on a GPU that no share could be told to own.
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
        yield from _kubernetes_telemetry_families(now)


def _kubernetes_telemetry_families(now):
    """How the reads of each Kubernetes cluster's telemetry go (monitoring.kubernetes), for the portal's own
    monitoring: the silent-cluster alert can also be written against these."""
    from monitoring.selectors import telemetry_sources

    doc = {"seconds_since_read": "Seconds since the cluster's telemetry was last read successfully",
           "lag_seconds": "Age of the newest samples at the last read (median over GPUs)",
           "sample_period_seconds": "How far apart a GPU's samples really are (median)",
           "series_read": "Series the last read returned",
           "unknown_gpus": "GPUs the cluster's exporter reports that the inventory lacks",
           "unleased_pods": "Pods on GPUs their team holds no reservation on",
           "read_errors": "Reads that failed since the portal started reading the cluster"}
    families = {name: GaugeMetricFamily(f"gpupool_k8s_telemetry_{name}", text, labels=["cluster", "source"])
                for name, text in doc.items()}
    for source in telemetry_sources(now=now):
        row, labels = source.row, [source.cluster.slug, source.source]
        if row is None:
            continue
        values = {"seconds_since_read": source.since_success_s, "lag_seconds": row.lag_seconds,
                  "sample_period_seconds": row.sample_period_seconds, "series_read": row.series_read,
                  "unknown_gpus": row.unknown_gpus, "unleased_pods": len(row.unleased),
                  "read_errors": row.errors_total}
        for name, value in values.items():
            if value is not None:
                families[name].add_metric(labels, value)
    yield from families.values()


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
                                            "node_id", "mig_devices"))
        latest = hot.latest_get((g[0], g[6]) for g in gpus)
        labels = ["gpu", "UUID", "device", "modelName", "Hostname", "pool"]
        families = {name: (GaugeMetricFamily(f"gpupool_dcgm_fi_dev_{name}", doc, labels=labels), read)
                    for name, doc, read in DCGM_FIELDS}
        gpu_labels: dict[int, dict[str, str]] = {}
        for gpu_id, index, uuid, model, host, pool, _, mig_devices in gpus:
            values = [str(index), uuid, f"nvidia{index}", model, host, pool or ""]
            gpu_labels[gpu_id] = dict(zip(labels, values))
            sample = latest.get(gpu_id)
            if sample is None:
                continue
            for family, read in families.values():
                family.add_metric(values, read(sample))
            for device in mig_devices or ():
                _mig_instance_series(families, gpu_labels[gpu_id], device, sample)
        yield from (family for family, _ in families.values())
        yield from _share_families(now, gpu_labels, latest)

        holder = dict(Allocation.objects.filter(starts_at__lte=now, ends_at__gt=now)
                      .values_list("gpu_id", "reservation__team__slug"))
        idle_at = settings.TELEMETRY_IDLE_UTIL_PCT
        pools: dict[str, list[int]] = {}
        teams: dict[str, list[int]] = {slug: [0, 0] for slug in Team.objects.values_list("slug", flat=True)}
        for gpu_id, _, _, _, _, pool, _, _ in gpus:
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


def _mig_labels(profile: str, instance_id: int) -> dict[str, str]:
    return {"GPU_I_PROFILE": profile, "GPU_I_ID": str(instance_id)}


def _mig_instance_series(families: dict, gpu: dict[str, str], device, sample) -> None:
    """One MIG instance's memory series, as dcgm-exporter adds them beside the GPU's: used is what its
    processes use (NVML lists them per instance), free the rest of the instance's memory."""
    if not isinstance(device, dict) or not device.get("uuid") or not device.get("profile"):
        return
    instance = device["uuid"]
    instance_id = device.get("gpu_instance_id")
    if not isinstance(instance_id, int):
        instance_id = next((gi for _, i, _, gi in sample.shares if i == instance and gi is not None), None)
    if instance_id is None:
        return  # no GPU_I_ID to give it: left out, like a GPU the exporter cannot read
    used = sum(mib for _, i, mib, _ in sample.shares if i == instance)
    labels = {**gpu, **_mig_labels(str(device["profile"]), instance_id)}
    for name, value in (("fb_used", used), ("fb_free", max(0, int(device.get("memory_mib") or 0) - used))):
        family = families[name][0]
        family.add_sample(family.name, labels, value)


def _share_families(now, gpu_labels: dict[int, dict[str, str]], latest: dict):
    """Allocated vs used GPU memory per share, and what no share owns (see the module's docstring)."""
    from monitoring import shares

    allocated = GaugeMetricFamily("gpupool_share_memory_allocated_mib",
                                  "GPU memory a reservation's share of a GPU or MIG instance may use (MiB)")
    used = GaugeMetricFamily("gpupool_share_memory_used_mib",
                             "GPU memory the processes of a reservation's share use (MiB)")
    for share in shares.shares_now(now):
        if share.gpu_id not in gpu_labels:
            continue
        labels = {"team": share.team, "reservation": str(share.reservation_id), "mode": share.mode,
                  **gpu_labels[share.gpu_id]}
        sample = latest.get(share.gpu_id)
        if share.mode == shares.MIG:
            instance_id = share.gpu_instance_id
            if instance_id is None and sample is not None:
                instance_id = shares.instance_id_of(sample.shares, share.reservation_id, share.instance)
            labels.update(GPU_I_PROFILE=share.mig_profile, GPU_I_ID="" if instance_id is None else str(instance_id),
                          mig_instance=share.instance)
        allocated.add_sample(allocated.name, labels, share.allocated_mib)
        if sample is not None:
            used.add_sample(used.name, labels, shares.used_mib(sample.shares, share.reservation_id, share.instance))
    yield allocated
    yield used
    unattributed = GaugeMetricFamily("gpupool_gpu_memory_unattributed_mib",
                                     "GPU memory of processes no share could be told to own (MiB)")
    for gpu_id, sample in latest.items():
        stray = sum(mib for r, _, mib, _ in sample.shares if r is None)
        if stray and gpu_id in gpu_labels:
            unattributed.add_sample(unattributed.name, gpu_labels[gpu_id], stray)
    yield unattributed


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
