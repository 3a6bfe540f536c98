"""Reads of telemetry and alerts: who may watch what, history at the right resolution, allocated vs used."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from django.conf import settings
from django.db.models import Q, QuerySet
from django.utils import timezone
from django.utils.translation import gettext

from allocations import units
from allocations.models import Allocation
from allocations.selectors import pools_visible_to, with_occupancy
from common import sql
from inventory.models import Gpu, GpuPool, Node
from monitoring import hot, idle, live
from monitoring.models import Alert, HourRollup, MinuteRollup, Sample
from teams.models import Team
from teams.selectors import can_act_for_team, teams_of

# --- who may watch what ------------------------------------------------------------------


def pool_for_viewer(user, slug: str) -> GpuPool | None:
    """The pool, if the user may see it: staff always, members when their team has a quota in it."""
    if not user.is_authenticated:
        return None
    return pools_visible_to(user).filter(slug=slug).first()


def node_for_viewer(user, node_id: int) -> Node | None:
    """The node, if every pool its GPUs belong to is one the user may see (staff: any node)."""
    if not user.is_authenticated:
        return None
    node = Node.objects.select_related("cluster").filter(pk=node_id).first()
    if node is None or user.is_staff:
        return node
    pools = set(node.gpus.exclude(pool=None).values_list("pool_id", flat=True))
    visible = set(pools_visible_to(user).filter(pk__in=pools).values_list("pk", flat=True))
    return node if pools and pools == visible else None


def team_for_viewer(user, slug: str) -> Team | None:
    team = Team.objects.filter(slug=slug).first()
    return team if team is not None and can_act_for_team(user, team) else None


def live_group(user, kind: str, key: str) -> str | None:
    """The WebSocket group the user may join for /ws/<kind>s/<key>/, or None (refused)."""
    if kind == "pool":
        obj = pool_for_viewer(user, key)
    elif kind == "node":
        obj = node_for_viewer(user, int(key)) if key.isdigit() else None
    elif kind == "team":
        obj = team_for_viewer(user, key)
    else:
        obj = None
    return live.group_name(kind, obj.pk) if obj is not None else None


# --- history -----------------------------------------------------------------------------

RANGES = {"5m": 5 * 60, "15m": 15 * 60, "1h": 3600, "24h": 86400, "7d": 7 * 86400, "30d": 30 * 86400}
MAX_POINTS = 360
HISTORY_METRICS = ("util", "mem_used", "temp", "power", "sm_clock")
# Metrics a source may leave out (null in the tables): averaged over the samples that have them.
OPTIONAL_METRICS = {"sm_clock"}
NICE_STEPS = (1, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


@dataclass
class History:
    resolution: str  # raw, minute or hour
    step: int  # seconds per point
    start: int
    end: int
    # gpu id → metric → list of (ts, avg, max)
    series: dict[int, dict[str, list]] = field(default_factory=dict)


def _resolution(span: int) -> tuple[str, int]:
    """The coarsest table that still has the range, and a step giving at most MAX_POINTS points."""
    if span <= settings.TELEMETRY_RAW_RETENTION.total_seconds():
        table, base = "raw", 1
    elif span <= min(2 * 86400, settings.TELEMETRY_MINUTE_RETENTION.total_seconds()):
        table, base = "minute", 60
    else:
        table, base = "hour", 3600
    step = next(s for s in NICE_STEPS if s >= base and span / s <= MAX_POINTS)
    return table, step


def pool_history(gpu_ids: list[int], range_key: str, now: float | None = None) -> History:
    """Per-GPU history of the last `range_key` (15m, 1h, 24h, 7d, 30d), bucketed to ≤ MAX_POINTS points.

    Reads only the GPUs asked for through the (gpu_id, ts/bucket) unique indexes, so the
    cost follows the pool's size and the range, not the fleet's: 15 minutes come from raw
    samples, 24 hours from minute rollups, 30 days from hour rollups. One hand-written
    GROUP BY returning plain tuples: a 100-GPU pool is 18,000-36,000 result rows, and the
    ORM's dicts and Decimal averages cost ~150-250 ms of CPU for them
    (`python -m benchmarks.telemetry_history`).
    """
    span = RANGES[range_key]
    end = int(time.time() if now is None else now)
    start = end - span
    table, step = _resolution(span)
    history = History(resolution=table, step=step, start=start, end=end)
    if not gpu_ids:
        return history
    if table == "raw":
        db_table, time_column, first = Sample._meta.db_table, "ts", start
        columns = ", ".join(f"CAST(avg({m}) AS DOUBLE PRECISION), max({m})" for m in HISTORY_METRICS)
    else:
        model = MinuteRollup if table == "minute" else HourRollup
        db_table, time_column, first = model._meta.db_table, "bucket", start - start % step
        # Each bucket's average weighted by its sample count: a minute with one sample must not count
        # as much as one with sixty.
        columns = ", ".join(
            f"CAST(sum({m}_avg * n) AS DOUBLE PRECISION) / "
            + (f"nullif(sum(CASE WHEN {m}_avg IS NOT NULL THEN n END), 0)" if m in OPTIONAL_METRICS else "sum(n)")
            + f", max({m}_max)" for m in HISTORY_METRICS)
    placeholders = ", ".join(["%s"] * len(gpu_ids))
    rows = sql.fetch_all(
        f"SELECT gpu_id, {time_column} - {time_column} %% %s AS b, {columns} FROM {db_table} "
        f"WHERE gpu_id IN ({placeholders}) AND {time_column} >= %s AND {time_column} <= %s "
        "GROUP BY gpu_id, b ORDER BY gpu_id, b",
        [step, *gpu_ids, first, end],
        # A generic plan (what a prepared statement settles on) cannot see that a hundred GPU ids
        # pick far fewer rows than the time range and read the range for the whole fleet.
        plan_each_time=True,
    )
    series = history.series
    for gpu_id, bucket, *values in rows:
        per_gpu = series.get(gpu_id)
        if per_gpu is None:
            per_gpu = series[gpu_id] = {m: [] for m in HISTORY_METRICS}
        for i, metric in enumerate(HISTORY_METRICS):
            per_gpu[metric].append((bucket, values[2 * i], values[2 * i + 1]))
    return history


# --- allocated vs actually used ----------------------------------------------------------


@dataclass
class GpuUse:
    gpu_id: int
    label: str
    pool: str
    team: str | None
    util: int | None  # None: no recent sample


@dataclass
class UseSummary:
    name: str
    slug: str
    capacity: int
    allocated: int = 0
    used: int = 0  # allocated and busier than the idle threshold
    util_sum: float = 0.0
    reporting: int = 0
    idle: list[GpuUse] = field(default_factory=list)

    @property
    def avg_util(self) -> float | None:
        return round(self.util_sum / self.reporting, 1) if self.reporting else None

    @property
    def used_pct(self) -> int:
        return round(100 * self.used / self.allocated) if self.allocated else 0


def usage(pools: QuerySet[GpuPool], teams: QuerySet[Team], now=None) -> tuple[list[UseSummary], list[UseSummary]]:
    """Per pool and per team: GPUs allocated now, how many of those are actually used, and the idle ones.

    Three queries (pools, GPUs with holders, teams) and one cache read, whatever the fleet size.
    """
    now = now or timezone.now()
    idle_at = settings.TELEMETRY_IDLE_UTIL_PCT
    pool_list = list(with_occupancy(pools, now).order_by("slug"))
    by_pool = {p.pk: UseSummary(p.name, p.slug, p.gpus_total or 0) for p in pool_list}
    team_list = list(teams)
    by_team = {t.pk: UseSummary(t.name, t.slug, 0) for t in team_list}
    held = dict(Allocation.objects.filter(starts_at__lte=now, ends_at__gt=now)
                .filter(Q(gpu__pool_id__in=by_pool) | Q(reservation__team_id__in=by_team))
                .values_list("gpu_id", "reservation__team_id"))
    gpus = list(Gpu.objects.filter(pk__in=held).values_list("id", "pool_id", "pool__slug", "node__name", "index",
                                                            "node_id"))
    latest = hot.latest_get((g[0], g[5]) for g in gpus)
    team_slugs = dict(Team.objects.filter(pk__in=set(held.values())).values_list("pk", "slug"))
    for gpu_id, pool_id, pool_slug, node_name, index, _ in gpus:
        team_id = held[gpu_id]
        sample = latest.get(gpu_id)
        use = GpuUse(gpu_id, f"{node_name}:{index}", pool_slug or "", team_slugs.get(team_id),
                     sample.util if sample else None)
        for summary in (by_pool.get(pool_id), by_team.get(team_id)):
            if summary is None:
                continue
            summary.allocated += 1
            if sample is not None:
                summary.reporting += 1
                summary.util_sum += sample.util
                if sample.util > idle_at:
                    summary.used += 1
                else:
                    summary.idle.append(use)
    for t in team_list:
        by_team[t.pk].capacity = by_team[t.pk].allocated
    return list(by_pool.values()), list(by_team.values())


# --- booked vs busy, per pool -------------------------------------------------------------


@dataclass
class GpuActivity:
    gpu_id: int
    label: str  # node:index
    pool: str
    team: str | None  # the holder's name; for use outside the portal the card's holders, if any, joined
    reservation_id: int | None  # the idle booking's; None for use outside the portal
    util: int
    processes: int


@dataclass
class PoolActivity:
    """What a pool's GPUs do now, in GPUs: a shared card counts by its parts (k of N shares, a MIG
    instance's slices, a vGPU grant's worth), so booked_busy + booked_idle + unbooked_busy + free +
    no_data == capacity."""

    name: str
    slug: str
    capacity: int
    free: float = 0.0  # nobody booked it and nothing runs on it
    booked_busy: float = 0.0
    booked_idle: float = 0.0  # booked, and its holder runs nothing
    unbooked_busy: float = 0.0  # busy although nobody booked it: use outside the portal
    no_data: float = 0.0  # no recent sample: its agent or exporter is silent
    idle_bookings: list[GpuActivity] = field(default_factory=list)
    outside_use: list[GpuActivity] = field(default_factory=list)


def pool_activity(pools: QuerySet[GpuPool], now=None) -> list[PoolActivity]:
    """Per pool: GPUs free, booked and busy, booked but idle, busy without a booking, and without data.

    Busy comes from the hot telemetry: utilization above TELEMETRY_IDLE_UTIL_PCT, or a process on the card.
    A card whose processes were attributed to its holders at ingest (monitoring.shares.attribute) is split
    by them: a holder using memory is busy, one using none idle, use nobody could be told is outside use on
    the card's unbooked part. A card without process data (some exporters send none) is busy or idle as a
    whole, its booked part with it. Three queries and one cache read, whatever the fleet size.
    """
    now = now or timezone.now()
    pool_list = list(pools.order_by("slug").values_list("pk", "name", "slug"))
    by_pool = {pk: PoolActivity(name, slug, 0) for pk, name, slug in pool_list}
    gpus = list(Gpu.objects.filter(pool_id__in=by_pool).order_by("node__name", "index")
                .values_list("id", "pool_id", "node_id", "node__name", "index"))
    # gpu id → {reservation id: (team name, milli of the card it holds)}
    held: dict[int, dict[int, list]] = {}
    for gpu_id, reservation_id, team, milli in (
            # By pool, not by a list of the GPUs' ids: 10,000 placeholders cost psycopg ~0.2 s to split.
            Allocation.objects.filter(gpu__pool_id__in=list(by_pool), starts_at__lte=now, ends_at__gt=now)
            .order_by("reservation_id").values_list("gpu_id", "reservation_id", "reservation__team__name", "milli")):
        entry = held.setdefault(gpu_id, {}).setdefault(reservation_id, [team, 0])
        entry[1] += milli
    latest = hot.latest_get((g[0], g[2]) for g in gpus)
    for gpu_id, pool_id, _, node_name, index in gpus:
        summary = by_pool[pool_id]
        summary.capacity += 1
        holders = held.get(gpu_id, {})
        booked = {r: min(1.0, milli / units.MILLI_PER_GPU) for r, (_, milli) in holders.items()}
        unbooked = max(0.0, 1.0 - sum(booked.values()))
        sample = latest.get(gpu_id)
        if sample is None:
            summary.no_data += 1
            continue
        outside = any(r is None and mib > 0 for r, _, mib, _ in sample.shares)
        label = f"{node_name}:{index}"
        for reservation_id, part in booked.items():
            if idle.share_busy(sample, reservation_id):
                summary.booked_busy += part
            else:
                summary.booked_idle += part
                summary.idle_bookings.append(GpuActivity(gpu_id, label, summary.slug, holders[reservation_id][0],
                                                         reservation_id, sample.util, len(sample.processes)))
        if outside or (not holders and idle.card_busy(sample)):
            summary.unbooked_busy += unbooked
            teams = ", ".join(sorted({team for team, _ in holders.values()})) or None
            summary.outside_use.append(GpuActivity(gpu_id, label, summary.slug, teams, None, sample.util,
                                                   len(sample.processes)))
        else:
            summary.free += unbooked
    return list(by_pool.values())


def alerts_visible_to(user) -> QuerySet[Alert]:
    """Staff see every alert; members those about their teams or the pools their teams may use."""
    qs = Alert.objects.select_related("rule", "pool", "node", "team")
    if user.is_staff:
        return qs
    if not user.is_authenticated:
        return qs.none()
    return qs.filter(Q(team__in=teams_of(user)) | Q(pool__in=pools_visible_to(user)))


@dataclass
class Lease:
    """One lease key an agent reported ("<reservation id>:<device>", allocations.apply.backends.agent.lease_key),
    read for people: the reservation, its team and the GPU it names."""

    key: str
    reservation_id: int | None  # None: the key names no reservation the portal knows
    team: str | None
    gpu: str  # "GPU <index>" when the device is one of the node's GPUs (or a MIG instance of one), else the device
    why: str = ""  # for a refused lease, the agent's reason


def node_leases(node: Node) -> dict | None:
    """What a bare-metal host's agent last said about its GPU leases (None: it never said anything)."""
    from allocations.models import HostLeaseReport, Reservation

    report = HostLeaseReport.objects.filter(node=node).first()
    if report is None:
        return None
    keys = [*report.held, *report.failed]
    ids = {int(key.split(":", 1)[0]) for key in keys if key.split(":", 1)[0].isdigit()}
    teams = dict(Reservation.objects.filter(pk__in=ids).values_list("pk", "team__name"))
    gpus = {}
    for index, uuid, mig_devices in node.gpus.values_list("index", "uuid", "mig_devices"):
        gpus[uuid] = f"GPU {index}"
        for device in mig_devices or ():
            if isinstance(device, dict) and device.get("uuid"):
                gpus[device["uuid"]] = f"GPU {index} MIG {device.get('profile', '')}".rstrip()

    def lease(key: str, why: str = "") -> Lease:
        rid, _, device = key.partition(":")
        reservation_id = int(rid) if rid.isdigit() and int(rid) in teams else None
        gpu = gpus.get(device) or gpus.get(device.split("/", 1)[0], device)
        return Lease(key, reservation_id, teams.get(reservation_id), gpu, why)

    return {"held": [lease(key) for key in report.held],
            "failed": [lease(key, why) for key, why in sorted(report.failed.items())],
            "unleased_in_use": [gpus.get(uuid, uuid) for uuid in report.unleased_in_use], "reported_at": report.reported_at}


# --- Kubernetes telemetry sources ------------------------------------------------------------

@dataclass
class SourceStatus:
    """One Kubernetes cluster's telemetry as staff (and, for the source and period, its pages) see it."""

    cluster: object
    source: str
    row: object | None  # monitoring.models.ClusterTelemetry, None before the first read
    silent: bool
    since_success_s: float | None

    @property
    def state(self) -> str:
        if self.row is None:
            return "waiting for the first read"
        if self.silent:
            return "silent"
        return "error" if self.row.error else "ok"

    @property
    def state_label(self) -> str:
        """The state in the reader's language (`state` stays the page's class name and the tests' word)."""
        return {"waiting for the first read": gettext("waiting for the first read"), "silent": gettext("silent"),
                "error": gettext("error"), "ok": gettext("ok")}[self.state]


def telemetry_sources(cluster_ids=None, now=None) -> list[SourceStatus]:
    """Every Kubernetes cluster with a telemetry source (of `cluster_ids` only, when given) and how its reads go."""
    from inventory.models import Cluster, TelemetrySource
    from monitoring.kubernetes import silent_after
    from monitoring.models import ClusterTelemetry

    now = now or timezone.now()
    clusters = Cluster.objects.filter(kind=Cluster.Kind.KUBERNETES).exclude(telemetry_source=TelemetrySource.NONE)
    if cluster_ids is not None:
        clusters = clusters.filter(pk__in=list(cluster_ids))
    rows = {r.cluster_id: r for r in ClusterTelemetry.objects.filter(cluster__in=clusters)}
    out = []
    for cluster in clusters.order_by("slug"):
        row = rows.get(cluster.pk)
        last = (row.last_success_at or row.since) if row else None
        age = (now - last).total_seconds() if last else None
        out.append(SourceStatus(cluster, cluster.telemetry_source, row,
                                age is not None and age >= silent_after(cluster), age))
    return out
