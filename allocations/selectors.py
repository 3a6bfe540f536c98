"""Reads about reservations, pools' occupancy, availability over time and quota use."""
from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import NamedTuple, Sequence

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import DEFAULT_DB_ALIAS, connection
from django.db.models import (Count, DateTimeField, DurationField, F, FloatField, OuterRef, Q, QuerySet, Subquery, Sum,
                              Value)
from django.db.models.functions import Coalesce, Greatest, Least
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from allocations import booking, quota_math, shapes, units
from allocations.models import Allocation, AllocationQuerySet, QueueEntry, Quota, Reservation
from allocations.apply.desired import team_namespace
from allocations.placement import mig
from allocations.shapes import Amounts
from common import sql
from common.errors import ValidationFailed
from inventory.models import Cluster, Gpu, GpuPool
from inventory.selectors import model_weights, weight_of
from inventory.sharing import REPLICA_MODES, SharingMode, mig_dynamic, mig_layout_names
from teams.models import Team
from teams.selectors import team_ids_of, teams_of

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
    return qs.filter(team_id__in=team_ids_of(user))


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
    gpu_models: list[str] | str  # as the column reads (sql.json_value decodes SQLite's text)
    ge: float
    borrowed_ge: float
    priority_class: str
    preemptible: bool
    preempt_at: datetime | None
    starts_at: datetime
    ends_at: datetime
    state: str
    reason: str
    reason_message: dict | None
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
    "gpu_cores_pct": ("gpu_cores_pct", "r.gpu_cores_pct"), "gpu_models": ("gpu_models", "r.gpu_models"),
    "ge": ("ge", "r.ge"),
    "borrowed_ge": ("borrowed_ge", "r.borrowed_ge"), "priority_class": ("priority_class", "r.priority_class"),
    "preemptible": ("preemptible", "r.preemptible"),
    "preempt_at": ("preempt_at", "r.preempt_at"), "starts_at": ("starts_at", "r.starts_at"),
    "ends_at": ("ends_at", "r.ends_at"), "state": ("state", "r.state"), "reason": ("reason", "r.reason"),
    "reason_message": ("reason_message", "r.reason_message"),
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
         "gpu_memory_mib", "gpu_cores_pct", "gpu_models", "ge", "borrowed_ge", "preempt_at", "priority_class",
         "preemptible",
         "starts_at",
         "ends_at", "state", "reason", "reason_message", "ended_at", "created_at", "updated_at"],
        [r.id, r.team_id, r.pool_id, r.requested_by_id, r.mode, r.gpus, r.shares, r.mig_profile, r.mig_count,
         r.gpu_memory_mib, r.gpu_cores_pct, sql.json_value(r.gpu_models) or [], r.ge, r.borrowed_ge, sql.aware(r.preempt_at), r.priority_class,
         bool(r.preemptible),
         sql.aware(r.starts_at), sql.aware(r.ends_at),
         r.state, r.reason, sql.json_value(r.reason_message), sql.aware(r.ended_at), sql.aware(r.created_at), sql.aware(r.updated_at)],
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
    milli: int
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
    (time-slicing and MPS shares held on one GPU add up to one grant, whatever runs of slots its
    rows hold), MIG instances by their stable name, and the GE charged."""
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
            last["shares"] += units.share_slots(row.milli, row.replicas or 1)  # a further run of slots
            last["ge"] += row.ge
            if row.memory_mib is not None:
                last["gpu_memory_mib"] = (last["gpu_memory_mib"] or 0) + row.memory_mib
                last["gpu_cores_pct"] = (last["gpu_cores_pct"] or 0) + (row.cores_pct or 0)
            continue
        replica = row.mode in REPLICA_MODES
        grants[row.reservation_id].append({
            **gpu, "mode": row.mode, "shares": units.share_slots(row.milli, row.replicas or 1) if replica else None,
            "replicas": row.replicas if replica else None,
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
            "a.milli, a.mig_profile, a.mig_start, a.memory_mib, a.cores_pct, a.ge, g.mig_devices, p.sharing_config "
            "FROM allocations_allocation a JOIN inventory_gpu g ON g.id = a.gpu_id "
            "JOIN inventory_node n ON n.id = g.node_id "
            "JOIN allocations_reservation r ON r.id = a.reservation_id "
            "JOIN inventory_gpupool p ON p.id = r.pool_id "
            f"WHERE a.reservation_id IN ({', '.join(['%s'] * len(reservations))}) "
            'ORDER BY a.reservation_id, g.node_id, g."index", a.mig_start, a.share_from',
            [r.pk for r in reservations],
        )
        held = [HeldRow(rid, uuid, node, index, model, sql.aware(start), sql.aware(end), mode, milli, profile,
                        mig_start, memory, cores, ge, sql.json_value(devices) or (),
                        (sql.json_value(config) or {}).get("replicas"))
                for (rid, uuid, node, index, model, start, end, mode, milli, profile, mig_start, memory, cores, ge,
                     devices, config) in rows]
    set_grants(reservations, held)
    return with_queue(reservations)


def job_environment(reservation: Reservation, now: datetime | None = None) -> dict | None:
    """Where and how a job uses an active reservation's grants (reservation.grants, set by
    with_allocated_gpus): `where` (host or kubernetes), the nodes, on Kubernetes the team's
    namespace, and the variables a job on a host starts with: CUDA_VISIBLE_DEVICES names the GPU
    UUIDs (MIG device UUIDs for MIG instances), as the host agent's reservation-<id>.env does; the
    mode's limits (MPS pipes, HAMi limits) are host-local and only in that file. None until it is
    active."""
    if reservation.state != Reservation.State.ACTIVE:
        return None
    now = now or timezone.now()
    grants = [g for g in getattr(reservation, "grants", ()) if g["starts_at"] <= now < g["ends_at"]]
    if not grants:
        return None
    kinds = set(Gpu.objects.filter(uuid__in={g["uuid"] for g in grants})
                .values_list("node__cluster__kind", flat=True))
    on_kubernetes = kinds == {Cluster.Kind.KUBERNETES}
    devices = [g["mig_instance"] if g.get("mode") == "mig" and str(g.get("mig_instance") or "").startswith("MIG-")
               else g["uuid"] for g in grants]
    variables = {
        "GPUPOOL_RESERVATION": str(reservation.pk), "GPUPOOL_TEAM": reservation.team.slug,
        "GPUPOOL_MODE": reservation.mode, "GPUPOOL_ENDS_AT": reservation.ends_at.isoformat(),
    }
    if not on_kubernetes:
        variables = {"CUDA_VISIBLE_DEVICES": ",".join(dict.fromkeys(devices)), **variables}
    return {
        "where": "kubernetes" if on_kubernetes else "host",
        "nodes": list(dict.fromkeys(g["node"] for g in grants)),
        "namespace": team_namespace(reservation.team.slug) if on_kubernetes else None,
        "variables": variables,
    }


def with_queue(reservations: list[Reservation], *, every_state: bool = False) -> list[Reservation]:
    """Set `queue_info` (its QueueEntry, or None) on each reservation: on the pending ones only unless
    `every_state` (a reservation's own page shows how its promise turned out once it started)."""
    asking = [r.pk for r in reservations if every_state or r.state == Reservation.State.PENDING]
    entries = {e.pk: e for e in QueueEntry.objects.filter(pk__in=asking)} if asking else {}
    for reservation in reservations:
        reservation.queue_info = entries.get(reservation.pk)
    return reservations


@dataclass(frozen=True)
class QueueRow:
    """One waiting request as a pool's queue page shows it; `reservation` None: another team's."""

    position: int | None
    team: str
    reservation: Reservation | None
    entry: QueueEntry
    asked: str


def pool_queue(pool: GpuPool, user: User) -> list[QueueRow]:
    """The pool's waiting requests in queue order (the last pass's positions; new ones last)."""
    mine = None if user.is_staff else set(teams_of(user).values_list("pk", flat=True))
    waiting = list(Reservation.objects.filter(pool=pool, state=Reservation.State.PENDING)
                   .select_related("team", "queue_entry", "requested_by"))
    waiting.sort(key=lambda r: (r.queue_entry.position is None, r.queue_entry.position or 0, r.queue_entry.queued_at))
    rows = []
    for reservation in waiting:
        visible = mine is None or reservation.team_id in mine
        reservation.queue_info = reservation.queue_entry
        shape = reservation.queue_entry.shape
        rows.append(QueueRow(position=reservation.queue_entry.position,
                             team=reservation.team.name if visible else _("another team"),
                             reservation=reservation if visible else None, entry=reservation.queue_entry,
                             asked=str(booking.Shape(**{**shape, "mig_layout": (),
                                                        "gpu_models": tuple(shape.get("gpu_models") or ())}
                                                     ).in_words())))
    return rows


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
    """What a pool has free of a shape for one slot, in the shape's unit (booking.Room).

    `free`: shares, MIG instances of the profile, GPUs that could take the vGPU share, or whole GPUs;
    `most_together`: the most of those one request could get (on one GPU for shares, on one node for
    the rest); `free_on_one_node`: the same number (the name the timeline had when it counted whole
    GPUs only); `fits`: whether the shape asked could be booked for the slot (by the team, within its
    quota, when a team was given). `quota_left`: how many of the unit the team's quota still allows for
    the whole slot (None: no team given); `over_quota`: the shape asked is more than that."""

    start: datetime
    end: datetime
    free: int
    free_on_one_node: int
    unit: str = "GPUs"
    most_together: int = 0
    fits: bool = False
    quota_left: int | None = None
    over_quota: bool = False

    @property
    def bookable(self) -> int:
        """What the team may book of the slot: what is free, within what its quota allows."""
        return self.free if self.quota_left is None else min(self.free, self.quota_left)


def availability_shape(pool: GpuPool, snapshot: booking.PoolSnapshot, request: Amounts | None = None, *,
                       gpu_models: Sequence[str] | None = None) -> booking.Shape:
    """The shape the timeline counts, in the pool's unit: `request`'s amount fields where given, else
    one of the pool's unit (1 GPU, 1 share, 1 instance of the smallest profile the layout offers on the
    GPUs of `gpu_models`, the pool's default vGPU memory and cores), accepting only `gpu_models` (empty:
    any model). Bad values are the service's 400s, naming the field and the rule."""
    request = request or Amounts()
    models = shapes.checked_gpu_models(pool, gpu_models, snapshot)
    mode = pool.sharing_mode
    defaults: dict = {}
    if mode == SharingMode.EXCLUSIVE and request.gpus is None and not request.given():
        defaults["gpus"] = 1
    elif mode in REPLICA_MODES and request.shares is None and not request.given():
        defaults["shares"] = 1
    elif mode == SharingMode.MIG and request.mig_profile is None:
        offered = mig_profiles_offered(pool, snapshot.of_models(models))
        if offered:
            defaults["mig_profile"] = offered[0]
    asked = dataclasses.replace(request, **defaults)
    return shapes.shape_for(pool, asked, snapshot, gpu_models=models)


def mig_profiles_offered(pool: GpuPool, snapshot: booking.PoolSnapshot) -> list[str]:
    """The MIG profiles a mig pool's layout offers on its usable GPUs, smallest first, each once."""
    usable = [gpu for gpu in snapshot.gpus if gpu.usable] or list(snapshot.gpus)
    return [profile.name for profile in _layout_profiles(pool, {gpu.model for gpu in usable})]


def _layout_profiles(pool: GpuPool, models: set[str]) -> list[mig.MigProfile]:
    """The profiles of the pool's MIG layout on GPUs of `models`, smallest first, each name once."""
    config = pool.sharing_config or {}
    return booking.layout_profiles(models, mig_layout_names(config), dynamic=mig_dynamic(config))


@dataclass(frozen=True)
class PoolOffer:
    """What a pool offers a booking form, in its unit: its mode, replicas (shares), MIG profiles with the GE
    one instance costs, the largest usable card's memory, the GE of a whole card and the vGPU defaults."""

    mode: str
    replicas: int
    mig_profiles: tuple[tuple[str, float, int], ...]  # (name, GE per instance, memory MiB)
    gpu_memory_mib: int
    weight: float  # GE of one whole card (the heaviest model's, when the pool mixes models)
    default_memory_mib: int | None
    default_cores_pct: int | None
    mig_dynamic: bool = False  # a MIG pool that carves its GPUs on demand (any profile of their models)
    models: tuple[tuple[str, float], ...] = ()  # the usable GPUs' models with their weight (GE a card), by name

    def card_weight(self, models: Sequence[str] = ()) -> float:
        """The GE of one whole card for a request that accepts `models`: the heaviest of those the pool has
        (`weight`, the heaviest of all, when none of them is named), so a form never shows less than the
        booking may be charged."""
        named = set(models)
        return max((weight for model, weight in self.models if model in named), default=self.weight)


def pool_offer(pool: GpuPool) -> PoolOffer:
    """What the reserve form offers for `pool` (two small queries: its usable GPUs' models, the weights)."""
    config = pool.sharing_config or {}
    cards = list(Gpu.objects.usable().filter(pool=pool).values_list("model_name", "memory_mib").distinct())
    if not cards:
        cards = list(Gpu.objects.filter(pool=pool).values_list("model_name", "memory_mib").distinct())
    models = {model for model, _ in cards}
    weights = model_weights()
    weight = max((float(weight_of(weights, model)) for model in models), default=1.0)
    profiles = (tuple((p.name, p.compute_slices / units.MIG_COMPUTE_SLICES * weight, p.memory_mib)
                      for p in _layout_profiles(pool, models)) if pool.sharing_mode == SharingMode.MIG else ())
    return PoolOffer(mode=pool.sharing_mode, replicas=int(config.get("replicas") or 0), mig_profiles=profiles,
                     gpu_memory_mib=max((memory for _, memory in cards), default=0), weight=weight,
                     default_memory_mib=config.get("default_memory_mib"),
                     default_cores_pct=config.get("default_cores_pct"),
                     mig_dynamic=pool.sharing_mode == SharingMode.MIG and mig_dynamic(config),
                     models=tuple((model, float(weight_of(weights, model))) for model in sorted(models)))




def _fits(shape: booking.Shape, room: booking.Room, snapshot: booking.PoolSnapshot) -> bool:
    """Whether `choose` could give `shape` for the slot, from what room counted (on the GPUs of the models
    the shape accepts): shares must sit on one GPU and vGPU shares on one node; MIG instances may spread
    over nodes; whole GPUs sit on one node when a node could hold them all, else take whole nodes (the
    nodes' sizes counted on those models alone, as choose_whole_gpus counts them)."""
    if shape.mode in REPLICA_MODES:
        return room.most_together >= shape.shares
    if shape.mode == SharingMode.MIG:
        return room.free >= shape.mig_count
    if shape.mode == SharingMode.VGPU:
        return room.most_together >= shape.gpus
    if shape.gpus <= booking.most_usable_on_a_node(snapshot.of_models(shape.gpu_models).gpus):
        return room.most_together >= shape.gpus
    return room.free >= shape.gpus


def pool_availability(pool: GpuPool, start: datetime, end: datetime, slot: timedelta,
                      request: Amounts | None = None, *, gpu_models: Sequence[str] | None = None) -> list[Slot]:
    """What the pool has free of a shape per slot of [start, end), in the pool's unit (see availability)."""
    return availability(pool, start, end, slot, request, gpu_models=gpu_models).slots


@dataclass(frozen=True)
class Availability:
    shape: booking.Shape  # what was counted, defaults filled in
    capacity: int  # how much of the unit the pool's usable GPUs (of the shape's models) offer when nothing is booked
    slots: list[Slot]


def _units_of(shape: booking.Shape) -> int:
    """How many of its unit a shape asks (GPUs, shares, MIG instances)."""
    if shape.mode in REPLICA_MODES:
        return shape.shares
    if shape.mode == SharingMode.MIG:
        return shape.mig_count
    return shape.gpus


def _shape_ge(snapshot: booking.PoolSnapshot, shape: booking.Shape, pool: GpuPool) -> float | None:
    """What `shape` is charged in GE, as placed on the pool empty (None: it never fits the pool)."""
    empty = dataclasses.replace(snapshot, grants=())
    try:
        return sum(grant.ge for grant in booking.choose(empty, shape, policy=pool.placement_policy))
    except booking.BookingRefused:
        return None


def availability(pool: GpuPool, start: datetime, end: datetime, slot: timedelta,
                 request: Amounts | None = None, quota=None, *, gpu_models: Sequence[str] | None = None
                 ) -> Availability:
    """What the pool has free of a shape per slot of [start, end), in the pool's unit.

    The shape is `request`'s amount (or one of the pool's unit, see availability_shape), accepting only
    `gpu_models` (empty: any model): then every count, the capacity and the GE a quota is charged are
    those of the GPUs of those models, as a reservation with that `gpu_models` would be placed. The pool
    is read once for the whole range; each slot asks booking.room on the grants that overlap it, so
    the timeline counts exactly as a booking of that slot would (only usable GPUs: healthy, on
    healthy, schedulable nodes; what the queue's plan promises to waiting requests counts as taken).
    With a team's `quota` (quotas.QuotaLimits), each slot also says how many of the unit the team may
    still book there (what it already holds in the slot counted against its quota and team-wide cap)."""
    if end <= start:
        raise ValidationFailed(_("end must be after start."), field="end", rule="after_start")
    if end > LATEST_INSTANT:
        raise ValidationFailed(_("end must be before %(latest)s.") % {"latest": LATEST_INSTANT.date().isoformat()},
                               field="end", rule="max_value")
    if slot <= timedelta(0):
        raise ValidationFailed(_("slot must be positive."), field="slot", rule="min_value")
    count = -(-(end - start) // slot)
    if count > MAX_AVAILABILITY_SLOTS:
        raise ValidationFailed(
            _("%(count)d slots asked; at most %(most)d (widen slot or shorten the range).")
            % {"count": count, "most": MAX_AVAILABILITY_SLOTS},
            field="slot", rule="max_slots",
        )
    # queue and quotas read through this module: imported here, not at the top
    from allocations import queue, quotas

    snapshot = booking.pool_snapshot(pool.pk, start, end)
    shape = availability_shape(pool, snapshot, request, gpu_models=gpu_models)
    held_in_pool = held_everywhere = ()
    asked_ge = unit_ge = None
    if quota is not None:
        held_in_pool = team_windows(quota.team_id, quota.pool_id, start, end)
        if quota.team_max_ge is not None:
            held_everywhere = team_windows(quota.team_id, None, start, end)
        asked_ge = _shape_ge(snapshot, shape, pool)
        unit_ge = asked_ge / max(1, _units_of(shape)) if asked_ge else None
    # What the queue's plan promises to waiting requests is not free for a new booking either.
    snapshot = queue.with_promised(snapshot, queue.promised_grants(pool.pk, timezone.now()))
    slots = []
    for i in range(count):
        s_start = start + i * slot
        s_end = min(s_start + slot, end)
        in_slot = booking.PoolSnapshot(
            start=s_start, end=s_end, gpus=snapshot.gpus,
            grants=tuple(g for g in snapshot.grants
                         if g.starts_at < s_end and g.ends_at > s_start and g.ends_at > g.starts_at))
        room = booking.room(in_slot, shape)
        fits = _fits(shape, room, in_slot)
        quota_left, over_quota = None, False
        if quota is not None:
            left = quotas.headroom(quota, start=s_start, end=s_end, in_pool=held_in_pool, everywhere=held_everywhere)
            quota_left = math.floor((left + 1e-9) / unit_ge) if unit_ge else room.free
            over_quota = asked_ge is not None and asked_ge > left + 1e-9
            fits = fits and not over_quota
        slots.append(Slot(start=s_start, end=s_end, free=room.free, free_on_one_node=room.most_together,
                          unit=room.unit, most_together=room.most_together, fits=fits,
                          quota_left=quota_left, over_quota=over_quota))
    empty = booking.PoolSnapshot(start=start, end=end, gpus=snapshot.gpus, grants=())
    return Availability(shape=shape, capacity=booking.room(empty, shape).free, slots=slots)


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


def allocations_holding(now: datetime) -> QuerySet[Allocation]:
    """The grants holding GPUs at `now`: started and not ended."""
    return Allocation.objects.filter(starts_at__lte=now, ends_at__gt=now)


def quotas_with_held_ge(quotas: QuerySet[Quota], now: datetime | None = None) -> QuerySet[Quota]:
    """`quotas` with `held_ge`: the GE their team's grants in their pool hold at `now` (as ge_held_now counts)."""
    now = now or timezone.now()
    held = (allocations_holding(now).filter(reservation__team=OuterRef("team"), reservation__pool=OuterRef("pool"))
            .order_by().values("reservation__team").annotate(ge=Sum("ge")).values("ge"))
    return quotas.annotate(held_ge=Coalesce(Subquery(held, output_field=FloatField()), Value(0.0)))


def ge_held_now(now: datetime | None = None) -> list[HeldGe]:
    """GE held at `now` across the fleet, per team, pool (the reservation's), mode and GPU model:
    the grants that have not ended, through allocation_window, however long the history."""
    now = now or timezone.now()
    rows = (allocations_holding(now).order_by()
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
    return [(sql.instant(a), sql.instant(b), ge) for a, b, ge in
            _team_window_rows(team_id, pool_id, start, end, exclude_reservation)]


def teams_window_micros(team_ids: Sequence[int], pool_id: int | None, start: datetime, end: datetime
                        ) -> dict[int, tuple[list[int], list[int], list[float]]]:
    """team_windows' windows of each of `team_ids` (every one a key) as columns, but one per reservation: each one's
    start and end as whole microseconds since the epoch, and its GE, sorted by start, then end. (team_windows sums
    the reservations of one window into one; the quota sums are the same either way, but the queue's estimate takes
    each row for a booking that ends on its own, and two bookings of one window counted as one made a team's first
    end later than it is likely.) The queue's plan counts a team's windows in
    NumPy, PostgreSQL reads them as such already, and the plan makes the (start, end, GE) of a window only where it
    reads one. One query for all the teams: a pass reads the windows of every team that waits, and a query per team
    scanned the pool's reservations once per team (four teams: 48 ms of PostgreSQL's time in the queue benchmark's
    pass, against 12 for one query)."""
    if not team_ids:
        return {}
    among, params = sql.in_list("r.team_id", list(team_ids))
    query, more = _team_window_query(among, pool_id, start, end, None)
    rows = sql.fetch_all("SELECT r.team_id, " + query + " GROUP BY r.team_id, a.reservation_id, a.starts_at, "
                         "a.ends_at ORDER BY r.team_id, a.starts_at, a.ends_at, a.reservation_id", [*params, *more])
    teams, starts, ends, ge = (list(column) for column in zip(*rows)) if rows else ([], [], [], [])
    if starts and not isinstance(starts[0], int):  # PostgreSQL reads them as micros (every row, as the first)
        starts, ends = [sql.instant_micros(a) for a in starts], [sql.instant_micros(b) for b in ends]
    ge = [float(amount) for amount in ge]
    spans = {}
    for team_id in team_ids:  # each team's rows, one run of them (sorted by team)
        first, last = bisect.bisect_left(teams, team_id), bisect.bisect_right(teams, team_id)
        spans[team_id] = (starts[first:last], ends[first:last], ge[first:last])
    return spans


def _team_window_rows(team_id: int, pool_id: int | None, start: datetime, end: datetime,
                      exclude_reservation: int | None) -> list[tuple]:
    """team_windows' rows as read: each start and end as sql.instant_column gives it."""
    query, params = _team_window_query("r.team_id = %s", pool_id, start, end, exclude_reservation)
    return sql.fetch_all("SELECT " + query + " GROUP BY a.starts_at, a.ends_at", [team_id, *params])


def _team_window_query(team_is: str, pool_id: int | None, start: datetime, end: datetime,
                       exclude_reservation: int | None) -> tuple[str, list]:
    """The team windows' query after its SELECT, up to its GROUP BY, with its parameters after `team_is`'s (the
    condition on r.team_id)."""
    # Summed per window in the database: a reservation's grants share one window, and a share booking
    # may write several rows (runs of share slots, MIG instances), so this returns a row per window.
    query = (f"{sql.instant_column('a.starts_at')}, {sql.instant_column('a.ends_at')}, sum(a.ge) "
             "FROM allocations_allocation a "
             "JOIN allocations_reservation r ON r.id = a.reservation_id "
             f"WHERE {team_is} AND r.ends_at > %s AND {AllocationQuerySet.BOOKED_DURING_SQL}")
    params = [sql.db_datetime(start), sql.db_datetime(end), sql.db_datetime(start)]
    if pool_id is not None:
        query += " AND r.pool_id = %s"
        params.append(pool_id)
    if exclude_reservation is not None:
        query += " AND a.reservation_id <> %s"
        params.append(exclude_reservation)
    return query, params


# --- what each GPU of a pool is held by now (the pool page's bars) -------------------------------

@dataclass(frozen=True)
class Segment:
    """A part of one GPU's bar: held by a reservation, or free. `left` and `width` are percent of the bar."""

    left: float
    width: float
    part: str  # what it is, in the pool's unit: "2 of 4 shares", "1g.10gb", "20 GiB", "30 % cores", "whole GPU"
    reservation_id: int | None = None  # None: free
    team: str = ""
    visible: bool = False  # whether the viewer may open the reservation (and so see its id)
    ge: float | None = None
    memory_mib: int | None = None  # the memory the holder may use there, when the mode caps it

    @property
    def free(self) -> bool:
        return self.reservation_id is None


@dataclass(frozen=True)
class GpuBar:
    """One GPU of a pool and who holds which part of it now. `rows` is one bar (share space, MIG slices or
    the whole card) or, for vGPU grants, two thin bars: ("memory", ...) and ("cores", ...)."""

    gpu_id: int
    label: str
    uuid: str
    model: str
    memory_mib: int
    usable: bool
    rows: tuple[tuple[str, tuple[Segment, ...]], ...]

    @property
    def holders(self) -> list[Segment]:
        """The held parts, once each (a vGPU grant's memory and cores as one), for a list under the bar."""
        if len(self.rows) == 2:  # vgpu: memory and cores of the same grants, in the same order
            memory, cores = (tuple(seg for seg in segments if not seg.free) for _, segments in self.rows)
            return [dataclasses.replace(m, part=f"{m.part} + {c.part}") for m, c in zip(memory, cores)]
        return [seg for seg in self.rows[0][1] if not seg.free] if self.rows else []


def gpu_label(node: str, index: int) -> str:
    """How a GPU is named to people: "<node>:<index>"."""
    return f"{node}:{index}"


def _mib_words(mib: int) -> str:
    return f"{mib // 1024} GiB" if mib and mib % 1024 == 0 else f"{mib} MiB"


def _shares_words(count: int, replicas: int) -> str:
    return ngettext("%(count)d of %(replicas)d share", "%(count)d of %(replicas)d shares", replicas) % {
        "count": count, "replicas": replicas}


def pool_gpu_bars(pool: GpuPool, viewer: User, now: datetime | None = None) -> list[GpuBar]:
    """Each GPU of the pool split among what holds it at `now`: share slots (time-slicing, MPS), MIG
    instances by their memory slices, vGPU memory and cores, whole GPUs; the free parts of the pool's
    unit between them. Two queries (the GPUs, the grants held now)."""
    now = now or timezone.now()
    gpus = list(pool.gpus.select_related("node").order_by("node__name", "index"))
    held: dict[int, list[tuple]] = {}
    rows = (Allocation.objects.filter(gpu__pool=pool, starts_at__lte=now, ends_at__gt=now)
            .order_by("gpu_id", "share_from", "reservation_id")
            .values_list("gpu_id", "reservation_id", "reservation__team__slug", "reservation__team_id", "mode",
                         "share_from", "share_to", "mig_profile", "mig_start", "memory_mib", "cores_pct", "ge"))
    for row in rows:
        held.setdefault(row[0], []).append(row)
    own_teams = None if viewer.is_staff else set(team_ids_of(viewer))
    config = pool.sharing_config or {}
    replicas = int(config.get("replicas") or 0)
    layouts: dict[str, list] = {}
    bars = []
    for gpu in gpus:
        grants = held.get(gpu.pk, [])

        def segment(left_milli, right_milli, part, grant=None, memory=None, ge=None):
            if grant is None:
                return Segment(left=left_milli / 10, width=(right_milli - left_milli) / 10, part=part)
            _, rid, team, team_id, *_rest = grant
            return Segment(left=left_milli / 10, width=(right_milli - left_milli) / 10, part=part,
                           reservation_id=rid, team=team, visible=own_teams is None or team_id in own_teams,
                           ge=grant[11] if ge is None else ge, memory_mib=memory)

        vgpu = [g for g in grants if g[4] == SharingMode.VGPU]
        parted = [g for g in grants if g[4] != SharingMode.VGPU]
        if vgpu or (pool.sharing_mode == SharingMode.VGPU and not parted):
            memory_row, cores_row, m_at, c_at = [], [], 0, 0
            for g in vgpu:
                m = 1000 * (g[9] or 0) // max(gpu.memory_mib, 1)
                memory_row.append(segment(m_at, m_at + m, _mib_words(g[9] or 0), g, g[9]))
                cores_row.append(segment(c_at, c_at + 10 * (g[10] or 0), _("%(pct)d %% cores") % {"pct": g[10] or 0},
                                         g))
                m_at, c_at = m_at + m, c_at + 10 * (g[10] or 0)
            free_mib = max(0, gpu.memory_mib - sum(g[9] or 0 for g in vgpu))
            if m_at < 1000:
                memory_row.append(segment(m_at, 1000, _("%(memory)s free") % {"memory": _mib_words(free_mib)}))
            if c_at < 1000:
                cores_row.append(segment(c_at, 1000, _("%(pct)d %% cores free") % {"pct": 100 - c_at // 10}))
            rows_of = (("memory", tuple(memory_row)), ("cores", tuple(cores_row)))
        else:
            parts: list[tuple[int, int, str, tuple | None, int | None, float]] = []
            for g in parted:
                mode, lo, hi = g[4], g[5], g[6]
                if mode in REPLICA_MODES:
                    # A row per run of share slots: adjacent runs of one reservation make one segment.
                    if parts and parts[-1][3] is not None and parts[-1][3][1] == g[1] and parts[-1][1] == lo:
                        p = parts.pop()
                        memory = (p[4] or 0) + (g[9] or 0) if g[9] is not None else None
                        parts.append((p[0], hi, "", p[3], memory, p[5] + g[11]))
                    else:
                        parts.append((lo, hi, "", g, g[9], g[11]))
                elif mode == SharingMode.MIG:
                    parts.append((lo, hi, g[7], g, g[9], g[11]))
                else:
                    parts.append((lo, hi, _("whole GPU"), g, None, g[11]))
            # Name the share segments once merged: "k of N shares".
            width = units.share_slot_width(replicas) if replicas else units.MILLI_PER_GPU
            parts = [(lo, hi, part or _shares_words((hi - lo) // width, replicas), g, memory, ge)
                     for lo, hi, part, g, memory, ge in parts]
            free = _free_parts(pool.sharing_mode, replicas, gpu.model_name, config, layouts,
                               [(lo, hi) for lo, hi, *_ in parts])
            merged = sorted([*parts, *((lo, hi, part, None, None, None) for lo, hi, part in free)], key=lambda p: p[0])
            rows_of = (("", tuple(segment(lo, hi, part, g, memory, ge) for lo, hi, part, g, memory, ge in merged)),)
        bars.append(GpuBar(gpu_id=gpu.pk, label=gpu_label(gpu.node.name, gpu.index), uuid=gpu.uuid, model=gpu.model_name,
                           memory_mib=gpu.memory_mib, usable=gpu.healthy and gpu.node.healthy and gpu.node.schedulable,
                           rows=rows_of))
    return bars


def _free_parts(mode: str, replicas: int, model: str, config: dict, layouts: dict, busy: list[tuple[int, int]]
                ) -> list[tuple[int, int, str]]:
    """The parts of a GPU's share space the pool's unit offers and nothing holds: free share slots (runs of
    them as one part), free MIG instances of the layout, or the whole card."""
    def clear(lo, hi):
        return all(hi <= b_lo or b_hi <= lo for b_lo, b_hi in busy)

    if mode in REPLICA_MODES and replicas:
        free: list[tuple[int, int, str]] = []
        for i in range(replicas):
            lo, hi = booking.share_slot(i, replicas)
            if not clear(lo, hi):
                continue
            if free and free[-1][1] == lo:
                free[-1] = (free[-1][0], hi, "")
            else:
                free.append((lo, hi, ""))
        width = units.share_slot_width(replicas)
        return [(lo, hi, ngettext("%(count)d share free", "%(count)d shares free", (hi - lo) // width)
                 % {"count": (hi - lo) // width}) for lo, hi, _unused in free]
    if mode == SharingMode.MIG and mig_dynamic(config):
        # Laid out on demand: each run of slices nothing holds is free, to be carved as a booking needs.
        runs: list[tuple[int, int]] = []
        for slot in range(mig.MIG_SLICES):
            lo, hi = slot * booking.MIG_SLICE_MILLI, (slot + 1) * booking.MIG_SLICE_MILLI
            if not clear(lo, hi):
                continue
            if runs and runs[-1][1] == lo:
                runs[-1] = (runs[-1][0], hi)
            else:
                runs.append((lo, hi))
        return [(lo, hi, ngettext("%(count)d slice free (carved on demand)", "%(count)d slices free (carved on demand)",
                                  (hi - lo) // booking.MIG_SLICE_MILLI) % {"count": (hi - lo) // booking.MIG_SLICE_MILLI})
                for lo, hi in runs]
    if mode == SharingMode.MIG:
        if model not in layouts:
            layouts[model] = booking.layout_offered(model, mig_layout_names(config))
        return [(*booking.mig_part(profile, start), _("%(profile)s free") % {"profile": profile.name})
                for profile, start in layouts[model]
                if clear(*booking.mig_part(profile, start))]
    return [(0, 1000, _("free"))] if clear(0, 1000) else []
