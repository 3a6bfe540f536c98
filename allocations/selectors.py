"""Reads about reservations, pools' occupancy, availability over time and quota use."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import NamedTuple, Sequence

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import DEFAULT_DB_ALIAS, connection
from django.db.models import Count, DateTimeField, DurationField, F, OuterRef, Q, QuerySet, Subquery, Sum, Value
from django.db.models.functions import Coalesce, Greatest, Least
from django.utils import timezone

from allocations import booking, quota_math
from allocations.models import Allocation, AllocationQuerySet, Quota, Reservation
from common import sql
from common.errors import ValidationFailed
from inventory.models import Gpu, GpuPool
from inventory.sharing import REPLICA_MODES
from inventory.selectors import model_weights, weight_of
from teams.models import Membership, Team
from teams.selectors import teams_of

User = AbstractBaseUser | AnonymousUser

MAX_AVAILABILITY_SLOTS = 500
# Availability is asked for windows before this: far past any booking, and far enough from the end
# of Python's calendar (year 9999) that adding a slot or a day cannot overflow.
LATEST_INSTANT = datetime(9000, 1, 1, tzinfo=dt_timezone.utc)


def reservations_visible_to(user: User) -> QuerySet[Reservation]:
    """Staff see all reservations; everyone else those of their teams.

    The team ids are read first and compared with `team_id` directly (not a subquery joined to
    teams): for one team, PostgreSQL then walks reservation_team_newest and stops after a page,
    where the join sorted all of the team's history (first page of 200,000: ~190 ms)."""
    qs = Reservation.objects.select_related("team", "pool", "requested_by")
    if user.is_staff:
        return qs
    team_ids = Membership.objects.filter(user_id=user.pk).order_by().values_list("team_id", flat=True)
    return qs.filter(team_id__in=list(team_ids))


class ReservationRow(NamedTuple):
    """The columns a reservation is shown with (the API's list, a create's and a release's answer)."""

    id: int
    mode: str
    gpus: int
    shares: int | None
    mig_profile: str
    mig_count: int | None
    gpu_memory_mib: int | None
    gpu_cores_pct: int | None
    ge: float
    starts_at: datetime
    ends_at: datetime
    state: str
    reason: str
    ended_at: datetime | None
    created_at: datetime
    updated_at: datetime
    team_id: int
    team_slug: str
    pool_id: int
    pool_slug: str
    requested_by_id: int | None
    requested_by_username: str | None


# ReservationRow's columns as the ORM reads them (the API's list: values_list) and as hand-written SQL
# over `allocations_reservation r`, `teams_team t`, `inventory_gpupool p` and `auth_user u` reads them
# (the release's locked read): one table, so the two reads cannot drift apart.
_RESERVATION_COLUMNS = {
    "id": ("id", "r.id"), "mode": ("mode", "r.mode"), "gpus": ("gpus", "r.gpus"),
    "shares": ("shares", "r.shares"), "mig_profile": ("mig_profile", "r.mig_profile"),
    "mig_count": ("mig_count", "r.mig_count"), "gpu_memory_mib": ("gpu_memory_mib", "r.gpu_memory_mib"),
    "gpu_cores_pct": ("gpu_cores_pct", "r.gpu_cores_pct"), "ge": ("ge", "r.ge"), "starts_at": ("starts_at", "r.starts_at"),
    "ends_at": ("ends_at", "r.ends_at"), "state": ("state", "r.state"), "reason": ("reason", "r.reason"),
    "ended_at": ("ended_at", "r.ended_at"), "created_at": ("created_at", "r.created_at"),
    "updated_at": ("updated_at", "r.updated_at"), "team_id": ("team_id", "r.team_id"),
    "team_slug": ("team__slug", "t.slug"), "pool_id": ("pool_id", "r.pool_id"), "pool_slug": ("pool__slug", "p.slug"),
    "requested_by_id": ("requested_by_id", "r.requested_by_id"),
    "requested_by_username": ("requested_by__username", "u.username"),
}
assert tuple(_RESERVATION_COLUMNS) == ReservationRow._fields
RESERVATION_ROW = tuple(orm for orm, _ in _RESERVATION_COLUMNS.values())
RESERVATION_ROW_SQL = ", ".join(column for _, column in _RESERVATION_COLUMNS.values())


def reservation_from_row(row: ReservationRow | Sequence) -> Reservation:
    """A Reservation from a ReservationRow (or a tuple in its order), with its team, pool and booker as
    partial instances (id and slug or username set; any other column loads when first used). Building
    these costs a fraction of what select_related's full instances do, on every page of the API's list."""
    r = row if isinstance(row, ReservationRow) else ReservationRow._make(row)
    reservation = Reservation.from_db(
        DEFAULT_DB_ALIAS,
        ["id", "team_id", "pool_id", "requested_by_id", "mode", "gpus", "shares", "mig_profile", "mig_count",
         "gpu_memory_mib", "gpu_cores_pct", "ge", "starts_at", "ends_at", "state", "reason", "ended_at",
         "created_at", "updated_at"],
        [r.id, r.team_id, r.pool_id, r.requested_by_id, r.mode, r.gpus, r.shares, r.mig_profile, r.mig_count,
         r.gpu_memory_mib, r.gpu_cores_pct, r.ge, sql.aware(r.starts_at), sql.aware(r.ends_at),
         r.state, r.reason, sql.aware(r.ended_at), sql.aware(r.created_at), sql.aware(r.updated_at)],
    )
    reservation.team = Team.from_db(DEFAULT_DB_ALIAS, ["id", "slug"], [r.team_id, r.team_slug])
    reservation.pool = GpuPool.from_db(DEFAULT_DB_ALIAS, ["id", "slug"], [r.pool_id, r.pool_slug])
    reservation.requested_by = (
        get_user_model().from_db(DEFAULT_DB_ALIAS, ["id", "username"], [r.requested_by_id, r.requested_by_username])
        if r.requested_by_id is not None else None)
    return reservation


class HeldRow(NamedTuple):
    """One grant as a reservation's answer shows it (with_allocated_gpus reads these; a create builds
    them from what it just wrote)."""

    reservation_id: int
    uuid: str
    node: str
    index: int
    model_name: str
    starts_at: datetime
    ends_at: datetime
    mode: str
    mig_profile: str
    mig_start: int | None
    memory_mib: int | None
    cores_pct: int | None
    ge: float
    mig_devices: Sequence[dict]
    replicas: int | None


def set_grants(reservations: list[Reservation], held: Sequence[HeldRow]) -> list[Reservation]:
    """Set `allocated_gpus` and `grants` on each reservation from its HeldRows (in node, index, slice
    order). `allocated_gpus`: its GPUs as plain rows (uuid, node, index, model_name, starts_at,
    ends_at), one per GPU and window. `grants`: the same with the mode's share of each GPU
    (time-slicing and MPS shares held on one GPU add up to one grant), MIG instances by their
    stable name, and the GE charged."""
    gpus: dict[int, list[dict]] = {r.pk: [] for r in reservations}
    grants: dict[int, list[dict]] = {r.pk: [] for r in reservations}
    for row in held:
        gpu = {"uuid": row.uuid, "node": row.node, "index": row.index, "model_name": row.model_name,
               "starts_at": row.starts_at, "ends_at": row.ends_at}
        if not gpus[row.reservation_id] or gpus[row.reservation_id][-1] != gpu:
            gpus[row.reservation_id].append(gpu)
        last = grants[row.reservation_id][-1] if grants[row.reservation_id] else None
        if (row.mode in REPLICA_MODES and last is not None and last["uuid"] == row.uuid
                and (last["starts_at"], last["ends_at"]) == (row.starts_at, row.ends_at)):
            last["shares"] += 1  # one row per share slot: shares of one GPU add up to one grant
            last["ge"] += row.ge
            if row.memory_mib is not None:
                last["gpu_memory_mib"] = (last["gpu_memory_mib"] or 0) + row.memory_mib
                last["gpu_cores_pct"] = (last["gpu_cores_pct"] or 0) + (row.cores_pct or 0)
            continue
        replica = row.mode in REPLICA_MODES
        grants[row.reservation_id].append({
            **gpu, "mode": row.mode, "shares": 1 if replica else None, "replicas": row.replicas if replica else None,
            "mig_profile": row.mig_profile or None,
            "mig_instance": (booking.mig_instance_id(row.uuid, row.mig_devices, row.mig_profile, row.mig_start)
                             if row.mig_profile else None),
            "gpu_memory_mib": row.memory_mib, "gpu_cores_pct": row.cores_pct, "ge": row.ge})
    for reservation in reservations:
        reservation.allocated_gpus = gpus[reservation.pk]
        reservation.grants = grants[reservation.pk]
    return reservations


def with_allocated_gpus(reservations: list[Reservation]) -> list[Reservation]:
    """Set `allocated_gpus` and `grants` on each reservation (set_grants) from its grants in the database.
    One hand-written query of exactly those columns (common/sql.py says why): this answers every
    release and list call."""
    held: list[HeldRow] = []
    if reservations:
        rows = sql.fetch_all(
            'SELECT a.reservation_id, g.uuid, n.name, g."index", g.model_name, a.starts_at, a.ends_at, a.mode, '
            "a.mig_profile, a.mig_start, a.memory_mib, a.cores_pct, a.ge, g.mig_devices, p.sharing_config "
            "FROM allocations_allocation a JOIN inventory_gpu g ON g.id = a.gpu_id "
            "JOIN inventory_node n ON n.id = g.node_id "
            "JOIN allocations_reservation r ON r.id = a.reservation_id "
            "JOIN inventory_gpupool p ON p.id = r.pool_id "
            f"WHERE a.reservation_id IN ({', '.join(['%s'] * len(reservations))}) "
            'ORDER BY a.reservation_id, g.node_id, g."index", a.mig_start, a.share_from',
            [r.pk for r in reservations],
        )
        held = [HeldRow(rid, uuid, node, index, model, sql.aware(start), sql.aware(end), mode, profile, mig_start,
                        memory, cores, ge, sql.json_value(devices) or (),
                        (sql.json_value(config) or {}).get("replicas"))
                for (rid, uuid, node, index, model, start, end, mode, profile, mig_start, memory, cores, ge, devices,
                     config) in rows]
    return set_grants(reservations, held)


def pools_visible_to(user: User) -> QuerySet[GpuPool]:
    """Staff see every pool; members the pools their teams hold a quota in."""
    if user.is_staff:
        return GpuPool.objects.all()
    return GpuPool.objects.filter(quotas__team__in=teams_of(user)).distinct()


def with_occupancy(pools: QuerySet[GpuPool], now: datetime | None = None) -> QuerySet[GpuPool]:
    """Annotate gpus_total, gpus_healthy, gpus_allocated (held at `now`) and gpus_free."""
    now = now or timezone.now()
    total = Gpu.objects.filter(pool=OuterRef("pk")).values("pool").annotate(n=Count("id")).values("n")
    good = Gpu.objects.usable().filter(pool=OuterRef("pk")).values("pool").annotate(n=Count("id")).values("n")
    allocated = (
        Allocation.objects.filter(gpu__pool=OuterRef("pk"), starts_at__lte=now, ends_at__gt=now)
        .values("gpu__pool").annotate(n=Count("gpu_id", distinct=True)).values("n")
    )
    pools = pools.annotate(
        gpus_total=Coalesce(Subquery(total), 0),
        gpus_healthy=Coalesce(Subquery(good), 0),
        gpus_allocated=Coalesce(Subquery(allocated), 0),
    )
    # An allocated GPU that turned unhealthy is subtracted too: "free" errs low, never high.
    return pools.annotate(gpus_free=Greatest(F("gpus_healthy") - F("gpus_allocated"), Value(0)))


@dataclass(frozen=True)
class Slot:
    start: datetime
    end: datetime
    free: int
    free_on_one_node: int


def pool_availability(pool: GpuPool, start: datetime, end: datetime, slot: timedelta) -> list[Slot]:
    """Free GPUs per slot of [start, end): GPUs free for the whole slot, and the most free on one node.

    Only healthy GPUs on healthy, schedulable nodes count: those are the ones a
    reservation can get.
    """
    if end <= start:
        raise ValidationFailed("end must be after start.", field="end", rule="after_start")
    if end > LATEST_INSTANT:
        raise ValidationFailed(f"end must be before {LATEST_INSTANT:%Y-%m-%d}.", field="end", rule="max_value")
    if slot <= timedelta(0):
        raise ValidationFailed("slot must be positive.", field="slot", rule="min_value")
    count = -(-(end - start) // slot)
    if count > MAX_AVAILABILITY_SLOTS:
        raise ValidationFailed(
            f"{count} slots asked; at most {MAX_AVAILABILITY_SLOTS} (widen slot or shorten the range).",
            field="slot", rule="max_slots",
        )
    gpus = list(
        Gpu.objects.usable().filter(pool=pool).values_list("id", "node_id")
    )
    node_of = dict(gpus)
    windows: dict[int, list[tuple[datetime, datetime]]] = {}
    for gpu_id, a_start, a_end in Allocation.objects.filter(gpu_id__in=node_of).booked_during(start, end).values_list(
            "gpu_id", "starts_at", "ends_at"):
        windows.setdefault(gpu_id, []).append((a_start, a_end))

    slots = []
    for i in range(count):
        s_start = start + i * slot
        s_end = min(s_start + slot, end)
        free_per_node: dict[int, int] = {}
        for gpu_id, node_id in gpus:
            if not any(a < s_end and b > s_start for a, b in windows.get(gpu_id, ())):
                free_per_node[node_id] = free_per_node.get(node_id, 0) + 1
        slots.append(Slot(start=s_start, end=s_end, free=sum(free_per_node.values()),
                          free_on_one_node=max(free_per_node.values(), default=0)))
    return slots


@dataclass(frozen=True)
class GeShare:
    """Part of a team's use in one pool: what its grants of one sharing mode on one GPU model hold
    now and have booked this month, in GPU-equivalents (each grant's charged `ge`)."""

    mode: str
    model: str
    held_now: float
    ge_hours_this_month: float


@dataclass(frozen=True)
class QuotaUse:
    """A team's use of one pool in GE: held now (the sum of the `ge` of its grants holding at this
    instant) and GE-hours this calendar month (UTC; each grant's `ge` x its hours inside the month),
    with the split by mode and model. `quota` is None for a pool the team uses without a quota
    (one taken away while it still held grants there)."""

    pool: GpuPool
    quota: Quota | None
    held_now: float = 0.0
    ge_hours_this_month: float = 0.0
    breakdown: tuple[GeShare, ...] = ()

    @property
    def held_pct(self) -> int:
        limit = self.quota.max_ge if self.quota else None
        return round(100 * self.held_now / float(limit)) if limit else 0

    @property
    def hours_pct(self) -> int | None:
        limit = self.quota.ge_hours_per_month if self.quota else None
        return round(100 * self.ge_hours_this_month / float(limit)) if limit else None


@dataclass(frozen=True)
class TeamUse:
    """A team's use across its pools, in GE, against its team-wide cap (Team.max_ge, None = none)."""

    team: Team
    month: quota_math.Window
    pools: tuple[QuotaUse, ...]

    @property
    def month_start(self) -> datetime:
        return self.month[0]

    @property
    def month_end(self) -> datetime:
        return self.month[1]

    @property
    def held_now(self) -> float:
        return sum(use.held_now for use in self.pools)

    @property
    def ge_hours_this_month(self) -> float:
        return sum(use.ge_hours_this_month for use in self.pools)

    @property
    def held_pct(self) -> int | None:
        return round(100 * self.held_now / float(self.team.max_ge)) if self.team.max_ge else None

    @property
    def breakdown(self) -> tuple[GeShare, ...]:
        """The split by mode and model over all pools."""
        return _merged(share for use in self.pools for share in use.breakdown)

    @property
    def held_breakdown(self) -> tuple[GeShare, ...]:
        """The split of what is held now (parts with nothing held left out)."""
        return tuple(share for share in self.breakdown if share.held_now > 0)


def _merged(shares) -> tuple[GeShare, ...]:
    sums: dict[tuple[str, str], list[float]] = {}
    for share in shares:
        row = sums.setdefault((share.mode, share.model), [0.0, 0.0])
        row[0] += share.held_now
        row[1] += share.ge_hours_this_month
    return tuple(GeShare(mode, model, held, hours) for (mode, model), (held, hours) in sorted(sums.items()))


def this_month(now: datetime) -> quota_math.Window:
    start = quota_math.month_start(now)
    return start, quota_math.next_month(start)


def quota_use(team: Team, now: datetime | None = None) -> list[QuotaUse]:
    """For each quota of the team: GE held now and GE-hours booked this calendar month, split by
    mode and model (two queries; see teams_use)."""
    [use] = teams_use([team], now=now, quota_pools_only=True)
    return list(use.pools)


def team_use(team: Team, now: datetime | None = None) -> TeamUse:
    """The team's GE use in every pool it has a quota in or grants in this month."""
    [use] = teams_use([team], now=now)
    return use


def teams_use(teams: Sequence[Team], now: datetime | None = None, *, quota_pools_only: bool = False
              ) -> list[TeamUse]:
    """TeamUse of each team, in the order given: one query for the quotas and one for the month's
    grants of all of them, summed by the database per team, pool, mode, model and charged GE (a
    grant's GE is one of a few values per pool: the weight over N, a MIG size), so a busy month's tens
    of thousands of grants come back as a few rows. GE x hours is multiplied here, as SQLite has no
    portable way to multiply a duration."""
    now = now or timezone.now()
    month = this_month(now)
    team_ids = [team.pk for team in teams]
    quotas = {(q.team_id, q.pool_id): q for q in Quota.objects.filter(team_id__in=team_ids).select_related("pool")}
    # Every pool id (a handful): the team-pool-end index then skips each team's past pool by pool.
    pools = {pool.pk: pool for pool in GpuPool.objects.all()} if not quota_pools_only else {
        q.pool_id: q.pool for q in quotas.values()}
    rows = _month_ge(team_ids, list(pools), month, now) if team_ids and pools else []
    shares: dict[tuple[int, int], list[GeShare]] = {}
    for team_id, pool_id, mode, model, ge, held, booked in rows:
        shares.setdefault((team_id, pool_id), []).append(GeShare(mode=mode, model=model, held_now=held * ge,
                                                                 ge_hours_this_month=booked * ge))
    out = []
    for team in teams:
        keys = sorted({key for key in quotas if key[0] == team.pk} | {key for key in shares if key[0] == team.pk},
                      key=lambda key: pools[key[1]].slug)
        uses = []
        for key in keys:
            parts = _merged(shares.get(key, ()))
            uses.append(QuotaUse(pool=pools[key[1]], quota=quotas.get(key),
                                 held_now=sum(p.held_now for p in parts),
                                 ge_hours_this_month=sum(p.ge_hours_this_month for p in parts), breakdown=parts))
        out.append(TeamUse(team=team, month=month, pools=tuple(uses)))
    return out


def month_ge_hours(team_id: int, pool_id: int | None, month: quota_math.Window) -> float:
    """GE-hours the team has booked within `month` (allocations clipped to it): in the pool, or in every
    pool when `pool_id` is None. Each grant counts the GE it was charged. Summed by the database."""
    start, end = (sql.db_datetime(bound) for bound in month)
    seconds = ("extract(epoch FROM (least(a.ends_at, %s) - greatest(a.starts_at, %s)))"
               if connection.vendor == "postgresql" else
               "(julianday(min(a.ends_at, %s)) - julianday(max(a.starts_at, %s))) * 86400")
    query = (f"SELECT coalesce(sum(a.ge * {seconds}), 0) FROM allocations_allocation a "
             "JOIN allocations_reservation r ON r.id = a.reservation_id "
             f"WHERE r.team_id = %s AND r.ends_at > %s AND {AllocationQuerySet.BOOKED_DURING_SQL}")
    params = [end, start, team_id, start, end, start]
    if pool_id is not None:
        query += " AND r.pool_id = %s"
        params.append(pool_id)
    (seconds_booked,) = sql.fetch_one(query, params)
    return float(seconds_booked or 0) / 3600


def _month_ge(team_ids: list[int], pool_ids: list[int], month: quota_math.Window, now: datetime) -> list[tuple]:
    """(team id, pool id, mode, model, ge, grants holding at `now`, hours booked in `month`) per
    distinct (team, pool, mode, model, ge). `reservation__ends_at__gt` skips the teams' past through
    reservation_team_pool_end (an allocation never outlives its reservation)."""
    month_start, month_end = (Value(bound, output_field=DateTimeField()) for bound in month)
    booked = Sum(Least("ends_at", month_end) - Greatest("starts_at", month_start), output_field=DurationField())
    rows = (Allocation.objects.filter(reservation__team_id__in=team_ids, reservation__pool_id__in=pool_ids,
                                      reservation__ends_at__gt=month[0])
            .booked_during(*month).order_by()
            .values("reservation__team_id", "reservation__pool_id", "mode", "gpu__model_name", "ge")
            .annotate(held=Count("pk", filter=Q(starts_at__lte=now, ends_at__gt=now)), booked=booked)
            .values_list("reservation__team_id", "reservation__pool_id", "mode", "gpu__model_name", "ge", "held",
                         "booked"))
    return [(*row[:-1], row[-1] / timedelta(hours=1) if row[-1] else 0.0) for row in rows]


class HeldGe(NamedTuple):
    team: str
    pool: str
    mode: str
    model: str
    ge: float


def ge_held_now(now: datetime | None = None) -> list[HeldGe]:
    """GE held at `now` across the fleet, per team, pool (the reservation's), mode and GPU model:
    the grants that have not ended, through allocation_window, however long the history."""
    now = now or timezone.now()
    rows = (Allocation.objects.filter(starts_at__lte=now, ends_at__gt=now).order_by()
            .values_list("reservation__team__slug", "reservation__pool__slug", "mode", "gpu__model_name")
            .annotate(ge=Sum("ge")))
    return sorted(HeldGe(*row) for row in rows)


@dataclass(frozen=True)
class PoolGe:
    """A pool in GE: what its GPUs are worth (each its model's weight, now) and what is held of them now."""

    pool: GpuPool
    capacity: float
    held_now: float
    breakdown: tuple[GeShare, ...]  # held now by mode and model (ge_hours_this_month unused: 0)


def pools_ge(pools: Sequence[GpuPool] | QuerySet[GpuPool], now: datetime | None = None) -> list[PoolGe]:
    """Capacity and held now in GE of each pool (three queries, whatever the fleet's size)."""
    now = now or timezone.now()
    pools = list(pools)
    ids = [pool.pk for pool in pools]
    weights = model_weights()
    capacity: dict[int, float] = {}
    for pool_id, model, n in (Gpu.objects.filter(pool_id__in=ids).order_by().values_list("pool_id", "model_name")
                              .annotate(n=Count("id"))):
        capacity[pool_id] = capacity.get(pool_id, 0.0) + n * float(weight_of(weights, model))
    held: dict[int, list[GeShare]] = {}
    for pool_id, mode, model, ge in (
            Allocation.objects.filter(gpu__pool_id__in=ids, starts_at__lte=now, ends_at__gt=now).order_by()
            .values_list("gpu__pool_id", "mode", "gpu__model_name").annotate(ge=Sum("ge"))):
        held.setdefault(pool_id, []).append(GeShare(mode=mode, model=model, held_now=ge, ge_hours_this_month=0.0))
    return [PoolGe(pool=pool, capacity=capacity.get(pool.pk, 0.0),
                   held_now=sum(share.held_now for share in held.get(pool.pk, ())),
                   breakdown=_merged(held.get(pool.pk, ()))) for pool in pools]


def team_windows(team_id: int, pool_id: int | None, start: datetime, end: datetime,
                 exclude_reservation: int | None = None) -> list[tuple[datetime, datetime, float]]:
    """The team's grants that overlap [start, end), as (start, end, GE charged) per distinct window: in the pool, or in
    every pool when `pool_id` is None (the team-wide cap). What its quotas count. Hand-written:
    every create runs it under the pool's lock.

    An allocation never ends after its reservation (release and failover cut allocations short,
    extend moves both), so `r.ends_at > start` loses nothing and lets the reservation_team_pool_end
    index skip the team's past (`python -m benchmarks.history`: a create for a team with 200,000 past
    reservations took 3.2-4.0x as long as one for a team without before, 1.1x after)."""
    # Summed per window in the database: a reservation's grants share one window, and a share booking
    # writes a row per share slot, so this returns a row per window instead of one per slot.
    query = ("SELECT a.starts_at, a.ends_at, sum(a.ge) FROM allocations_allocation a "
             "JOIN allocations_reservation r ON r.id = a.reservation_id "
             f"WHERE r.team_id = %s AND r.ends_at > %s AND {AllocationQuerySet.BOOKED_DURING_SQL}")
    params = [team_id, sql.db_datetime(start), sql.db_datetime(end), sql.db_datetime(start)]
    if pool_id is not None:
        query += " AND r.pool_id = %s"
        params.append(pool_id)
    if exclude_reservation is not None:
        query += " AND a.reservation_id <> %s"
        params.append(exclude_reservation)
    query += " GROUP BY a.starts_at, a.ends_at"
    return [(sql.aware(a), sql.aware(b), ge) for a, b, ge in sql.fetch_all(query, params)]
