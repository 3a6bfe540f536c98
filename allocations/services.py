"""Writes about quotas and reservations.

Every function here is one transaction. Placement runs under a row lock on the pool
(`SELECT ... FOR UPDATE`), so two requests for the same pool are decided one after the
other and never both take the last free GPU; on SQLite the IMMEDIATE transaction mode
serializes writers the same way. Celery tasks are queued with `transaction.on_commit`,
so a task never sees a reservation that was rolled back.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import DEFAULT_DB_ALIAS, IntegrityError, transaction
from django.utils import timezone

from allocations import booking, quota_math, selectors, shapes, units
from allocations.apply import jobs
from allocations.models import ApplyJob, Quota, Reservation
from allocations.transitions import ending_state
from allocations.shapes import Amounts
from allocations.transitions import move as _move
from allocations.transitions import record as _record
from common import sql
from common.dispatch import enqueue_after_commit
from common.errors import Conflict, FieldError, NotFound, PermissionDenied, ValidationFailed
from inventory.models import Gpu, GpuPool
from inventory.sharing import SharingMode
from teams.models import Team

State = Reservation.State


# --- window and quota checks -------------------------------------------------------------

def _validated_window(starts_at: datetime | None, ends_at: datetime, now: datetime) -> datetime:
    """Check [starts_at, ends_at) and return the effective start (a missing or just-past start means now)."""
    if starts_at is None or now - settings.RESERVATION_START_GRACE <= starts_at < now:
        starts_at = now
    if ends_at <= starts_at:
        raise ValidationFailed("ends_at must be after starts_at.", field="ends_at", rule="after_starts_at")
    if ends_at <= now:
        raise ValidationFailed("The window is in the past: ends_at must be in the future.", field="ends_at",
                               rule="in_past")
    if starts_at < now:
        raise ValidationFailed("starts_at is in the past; leave it out to start now.", field="starts_at",
                               rule="in_past")
    if starts_at - now > settings.RESERVATION_MAX_LEAD:
        raise ValidationFailed(f"starts_at may be at most {settings.RESERVATION_MAX_LEAD.days} days ahead.",
                               field="starts_at", rule="max_lead")
    _check_duration(starts_at, ends_at)
    return starts_at


def _check_duration(starts_at: datetime, ends_at: datetime) -> None:
    """A reservation's window, as created or extended, is at most RESERVATION_MAX_DURATION long."""
    if ends_at - starts_at > settings.RESERVATION_MAX_DURATION:
        raise ValidationFailed(f"A reservation lasts at most {settings.RESERVATION_MAX_DURATION.days} days.",
                               field="ends_at", rule="max_duration")


@dataclass(frozen=True)
class QuotaLimits:
    """A team's quota in a pool (and its team-wide cap), with the slugs its refusals name."""

    team_id: int
    team_slug: str
    pool_id: int
    pool_slug: str
    max_ge: float
    ge_hours_per_month: float | None
    team_max_ge: float | None = None

    @classmethod
    def of(cls, *, max_ge, ge_hours_per_month, team_max_ge, **names) -> QuotaLimits:
        """From the database's decimals (the checks add floats to them), with the ids and slugs in `names`."""
        return cls(**names, max_ge=float(max_ge),
                   ge_hours_per_month=None if ge_hours_per_month is None else float(ge_hours_per_month),
                   team_max_ge=None if team_max_ge is None else float(team_max_ge))


def _ge(value: float) -> str:
    return f"{value:.2f}"


def _check_quota(quota: QuotaLimits, *, ge: float, asked: str, field: str, start: datetime, end: datetime,
                 exclude_reservation: int | None = None) -> None:
    """Refuse when the team would hold more GE than its quota in the pool at some instant of [start, end),
    more than its team-wide cap across pools, or book more GE-hours in a calendar month than the
    pool's monthly budget. `ge` is what the new grants are charged; `asked` the request in its own
    unit, for the message; `field` the request field a refusal names."""
    team, pool = quota.team_slug, quota.pool_slug
    windows = selectors.team_windows(quota.team_id, quota.pool_id, start, end, exclude_reservation)
    peak, peak_at = units.peak(windows, start, end)
    if peak + ge > quota.max_ge + 1e-9:
        when = f" at {peak_at:%Y-%m-%d %H:%M} UTC" if peak else ""
        raise Conflict(
            f"Over quota: team {team} would hold {_ge(peak + ge)} GE in pool {pool}{when} (quota {_ge(quota.max_ge)}, "
            f"{_ge(peak + ge - quota.max_ge)} over): {asked} is {_ge(ge)} GE and it holds {_ge(peak)}.",
            field=field, rule="quota_exceeded",
        )
    if quota.team_max_ge is not None:
        everywhere = selectors.team_windows(quota.team_id, None, start, end, exclude_reservation)
        peak, peak_at = units.peak(everywhere, start, end)
        if peak + ge > quota.team_max_ge + 1e-9:
            when = f" at {peak_at:%Y-%m-%d %H:%M} UTC" if peak else ""
            raise Conflict(
                f"Over the team-wide cap: team {team} would hold {_ge(peak + ge)} GE across all pools{when} (cap "
                f"{_ge(quota.team_max_ge)}, {_ge(peak + ge - quota.team_max_ge)} over): {asked} is {_ge(ge)} GE.",
                field=field, rule="team_cap_exceeded",
            )
    if quota.ge_hours_per_month is None:
        return
    for month in quota_math.months_between(start, end):
        # Not excluding the reservation being extended: its booked hours count, and [start, end) is
        # only the extension, which its allocations do not cover yet.
        used = selectors.month_ge_hours(quota.team_id, quota.pool_id, month)
        wanted = ge * quota_math.overlap_hours((start, end), month)
        if used + wanted > quota.ge_hours_per_month + 1e-6:
            over = used + wanted - quota.ge_hours_per_month
            raise Conflict(
                f"Over the monthly GE-hours of team {team} in pool {pool} for {month[0]:%Y-%m}: "
                f"{used:.1f} booked + {wanted:.1f} asked ({asked}) > {quota.ge_hours_per_month:g} ({over:.1f} over).",
                field="ends_at", rule="ge_hours_exceeded",
            )


# --- commands ------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class ReservationRequest(Amounts):
    """What a member asks for, as the API takes it: pool and team by slug, the window, and the amount in
    the pool's unit (which of Amounts' fields apply depends on its sharing mode; shapes.shape_for
    checks them)."""

    team: str
    pool: str
    ends_at: datetime
    starts_at: datetime | None = None


@dataclass(frozen=True)
class _Asked:
    """A create's pool, team, the actor's role in the team and the team's quota in the pool."""

    pool: GpuPool
    team: Team
    role: str | None
    quota: QuotaLimits | None


def _lock_pool_for(request: ReservationRequest, actor: AbstractBaseUser) -> _Asked:
    """Lock the pool's row and read, in the same statement, the team, the actor's role in it and the
    team's quota in the pool. Everything placement decides on is read after this lock."""
    row = sql.fetch_one(
        "SELECT p.id, p.sharing_mode, p.sharing_config, p.placement_policy, t.id, m.role, q.max_ge, "
        "q.ge_hours_per_month, q.id IS NOT NULL, t.max_ge "
        "FROM inventory_gpupool p JOIN teams_team t ON t.slug = %s "
        "LEFT JOIN teams_membership m ON m.team_id = t.id AND m.user_id = %s "
        "LEFT JOIN allocations_quota q ON q.team_id = t.id AND q.pool_id = p.id "
        "WHERE p.slug = %s" + sql.for_update_of("p"),
        [request.team, actor.pk, request.pool],
    )
    if row is None:
        pool_id, team_id = sql.fetch_one(
            "SELECT (SELECT id FROM inventory_gpupool WHERE slug = %s), (SELECT id FROM teams_team WHERE slug = %s)",
            [request.pool, request.team],
        )
        missing = [FieldError(field=name, rule="does_not_exist", message=f"There is no {name} {slug!r}.")
                   for name, slug, found in (("pool", request.pool, pool_id), ("team", request.team, team_id))
                   if found is None]
        raise ValidationFailed(missing[0].message, errors=missing)
    pool_id, sharing_mode, config, policy, team_id, role, max_ge, ge_hours, has_quota, team_max_ge = row
    # Partial instances: the columns read here are set, any other loads when first used.
    pool = GpuPool.from_db(DEFAULT_DB_ALIAS, ["id", "slug", "sharing_mode", "sharing_config", "placement_policy"],
                           [pool_id, request.pool, sharing_mode, sql.json_value(config) or {}, policy])
    team = Team.from_db(DEFAULT_DB_ALIAS, ["id", "slug"], [team_id, request.team])
    quota = QuotaLimits.of(
        team_id=team_id, team_slug=request.team, pool_id=pool_id, pool_slug=request.pool, max_ge=max_ge,
        ge_hours_per_month=ge_hours, team_max_ge=team_max_ge) if has_quota else None
    return _Asked(pool=pool, team=team, role=role, quota=quota)


def _insert_reservation(*, asked: _Asked, actor: AbstractBaseUser, shape: booking.Shape,
                        grants: list[booking.NewGrant], starts_at: datetime, ends_at: datetime,
                        now: datetime) -> Reservation:
    """Write the reservation, its grants and its first event; return it as saved."""
    start, end, at = sql.db_datetime(starts_at), sql.db_datetime(ends_at), sql.db_datetime(now)
    spans = len({grant.gpu_id for grant in grants})
    ge = sum(grant.ge for grant in grants)
    vgpu = shape.mode == SharingMode.VGPU
    row = dict(
        mode=shape.mode, gpus=spans, shares=shape.shares or None, mig_profile=shape.mig_profile,
        mig_count=shape.mig_count or None,
        gpu_memory_mib=(grants[0].memory_mib if vgpu else None), gpu_cores_pct=(shape.cores_pct if vgpu else None),
        ge=ge)
    (reservation_id,) = sql.fetch_one(
        "INSERT INTO allocations_reservation (team_id, pool_id, requested_by_id, mode, gpus, shares, mig_profile, "
        "mig_count, gpu_memory_mib, gpu_cores_pct, ge, starts_at, ends_at, state, reason, ended_at, created_at, "
        "updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, '', NULL, %s, %s) RETURNING id",
        [asked.team.pk, asked.pool.pk, actor.pk, row["mode"], row["gpus"], row["shares"], row["mig_profile"],
         row["mig_count"], row["gpu_memory_mib"], row["gpu_cores_pct"], ge, start, end, State.SCHEDULED, at, at],
    )
    booking.grants_write(reservation_id=reservation_id, grants=grants, start=starts_at, end=ends_at)
    reservation = selectors.reservation_from_row(selectors.ReservationRow(
        id=reservation_id, **row, starts_at=starts_at, ends_at=ends_at, state=State.SCHEDULED, reason="",
        ended_at=None, created_at=now, updated_at=now, team_id=asked.team.pk, team_slug=asked.team.slug,
        pool_id=asked.pool.pk, pool_slug=asked.pool.slug, requested_by_id=actor.pk,
        requested_by_username=actor.get_username()))
    reservation.team, reservation.pool, reservation.requested_by = asked.team, asked.pool, actor
    _record(reservation, from_state="", to_state=State.SCHEDULED, actor=actor,
            reason=f"{shape.in_words()} placed ({ge:.2f} GE)", at=now)
    return reservation


def reservation_create(*, actor: AbstractBaseUser, request: ReservationRequest,
                       now: datetime | None = None) -> Reservation:
    """Place what the request asks for in the pool's unit for the window, or refuse with the reason.

    The answer carries `allocated_gpus` and `grants` (as selectors.with_allocated_gpus sets them)."""
    now = now or timezone.now()
    starts_at = _validated_window(request.starts_at, request.ends_at, now)
    ends_at = request.ends_at

    try:
        with transaction.atomic():
            asked = _lock_pool_for(request, actor)
            pool, team = asked.pool, asked.team
            if not (actor.is_staff or asked.role is not None):
                raise PermissionDenied(f"You are not a member of team {team.slug}.", field="team",
                                       rule="not_a_member")
            if asked.quota is None:
                raise PermissionDenied(f"Team {team.slug} has no quota in pool {pool.slug}.", field="pool",
                                       rule="no_quota")
            snapshot = booking.pool_snapshot(pool.pk, starts_at, ends_at)
            shape = shapes.shape_for(pool, request, snapshot)
            field = shapes.AMOUNT_FIELD[shape.mode]
            try:
                grants = booking.choose(snapshot, shape, policy=pool.placement_policy)
            except booking.BookingRefused as refused:
                raise Conflict(refused.message, field=field, rule=refused.code) from None
            _check_quota(asked.quota, ge=sum(grant.ge for grant in grants), asked=shape.in_words(), field=field,
                         start=starts_at, end=ends_at)
            reservation = _insert_reservation(asked=asked, actor=actor, shape=shape, grants=grants,
                                              starts_at=starts_at, ends_at=ends_at, now=now)
            if starts_at <= now:
                enqueue_after_commit("allocations.tasks.activate_reservation", reservation.pk)
    except IntegrityError as exc:
        # Only the database's guards can fire here (the exclusion constraint, the vgpu trigger), and
        # only if the lock above was bypassed.
        raise Conflict("Those GPUs were just taken; try again.", field="gpus", rule="gpus_busy") from exc
    # The answer's GPUs from what was just written: no query to read them back.
    by_id = {gpu.id: gpu for gpu in snapshot.gpus}
    held = sorted(grants, key=lambda g: (by_id[g.gpu_id].node_id, by_id[g.gpu_id].index, g.mig_start or 0,
                                         g.share_from))
    selectors.set_grants([reservation], [
        selectors.HeldRow(reservation.pk, by_id[g.gpu_id].uuid, by_id[g.gpu_id].node_name, by_id[g.gpu_id].index,
                          by_id[g.gpu_id].model, starts_at, ends_at, g.mode, g.milli, g.mig_profile, g.mig_start,
                          g.memory_mib,
                          g.cores_pct, g.ge, by_id[g.gpu_id].mig_devices, shape.replicas or None)
        for g in held])
    return reservation


def _locked_reservation(reservation_id: int, actor: AbstractBaseUser) -> Reservation:
    """Lock the reservation's row and read it with its team, pool and booker; 404 when it does not
    exist or the actor may not act for its team (outsiders do not learn that it exists)."""
    row = sql.fetch_one(
        # The reservation's columns, then the actor's role in the team.
        f"SELECT {selectors.RESERVATION_ROW_SQL}, m.role "
        "FROM allocations_reservation r JOIN teams_team t ON t.id = r.team_id "
        "JOIN inventory_gpupool p ON p.id = r.pool_id "
        "LEFT JOIN auth_user u ON u.id = r.requested_by_id "
        "LEFT JOIN teams_membership m ON m.team_id = r.team_id AND m.user_id = %s "
        "WHERE r.id = %s" + sql.for_update_of("r"),
        [actor.pk, reservation_id],
    )
    *columns, actor_role = row or (None,)
    if row is None or not (actor.is_staff or actor_role is not None):
        raise NotFound(f"Reservation {reservation_id} does not exist.", field="id", rule="does_not_exist")
    return selectors.reservation_from_row(columns)


@transaction.atomic
def reservation_release(*, actor: AbstractBaseUser, reservation_id: int, now: datetime | None = None
                        ) -> Reservation:
    """Release early (running) or cancel (not started). The GPUs are free again at once. One whose
    window is already over expires, as the sweep would have it."""
    now = now or timezone.now()
    reservation = _locked_reservation(reservation_id, actor)
    if reservation.state not in Reservation.LIVE_STATES:
        raise Conflict(f"A {reservation.state} reservation cannot be released.", field="state", rule="not_live")
    who = getattr(actor, "username", "system")
    if ending_state(ends_at=reservation.ends_at, released_at=now) == State.EXPIRED:
        # The window is already over and the sweep has not got to it yet: do what the sweep would,
        # so it ends as expired (its GPUs were held to the end, not given back early).
        _undo(reservation, final_state=State.EXPIRED, actor=actor, reason="Window ended.", now=now)
        return reservation
    if reservation.starts_at > now:
        # Never used: every allocation shrinks to an empty window at its start.
        sql.execute("UPDATE allocations_allocation SET ends_at = starts_at WHERE reservation_id = %s",
                    [reservation.pk])
        _move(reservation, State.RELEASED, actor=actor, reason=f"Cancelled before its start by {who}.", now=now)
        return reservation
    sql.execute("UPDATE allocations_allocation SET ends_at = %s WHERE reservation_id = %s AND ends_at > %s",
                [sql.db_datetime(now), reservation.pk, sql.db_datetime(now)])
    _undo(reservation, final_state=State.RELEASED, actor=actor, reason=f"Released early by {who}.", now=now)
    return reservation


def _quota_limits(reservation: Reservation) -> QuotaLimits:
    """The quota binding a held reservation (403 when staff removed it since)."""
    team, pool = reservation.team.slug, reservation.pool.slug
    # order_by(): Quota's default ordering would join teams and pools for first().
    quota = Quota.objects.filter(team_id=reservation.team_id, pool_id=reservation.pool_id).order_by().first()
    if quota is None:
        raise PermissionDenied(f"Team {team} has no quota in pool {pool}.", field="pool", rule="no_quota")
    return QuotaLimits.of(team_id=reservation.team_id, team_slug=team, pool_id=reservation.pool_id, pool_slug=pool,
                          max_ge=quota.max_ge, ge_hours_per_month=quota.ge_hours_per_month,
                          team_max_ge=reservation.team.max_ge)


@transaction.atomic
def reservation_extend(*, actor: AbstractBaseUser, reservation_id: int, ends_at: datetime,
                       now: datetime | None = None) -> Reservation:
    """Move ends_at later, keeping the same GPUs, when they stay free and the quota allows."""
    now = now or timezone.now()
    pool_id = Reservation.objects.filter(pk=reservation_id).values_list("pool_id", flat=True).first()
    if pool_id is None:
        raise NotFound(f"Reservation {reservation_id} does not exist.", field="id", rule="does_not_exist")
    # Same lock order as reservation_create (pool, then reservation): no deadlock between the two.
    GpuPool.objects.select_for_update().get(pk=pool_id)
    reservation = _locked_reservation(reservation_id, actor)
    if reservation.state not in Reservation.LIVE_STATES:
        raise Conflict(f"A {reservation.state} reservation cannot be extended.", field="state", rule="not_live")
    old_end = reservation.ends_at
    if ends_at <= old_end:
        raise ValidationFailed(f"ends_at must be after the current end ({old_end.isoformat()}).", field="ends_at",
                               rule="after_current_end")
    _check_duration(reservation.starts_at, ends_at)
    # The grants it holds up to its end: not those a failover moved it off (their rows end earlier).
    held = [booking.NewGrant(gpu_id=a.gpu_id, ge=a.ge, mode=a.mode, share_from=a.share_from, share_to=a.share_to,
                             milli=a.milli, mig_profile=a.mig_profile, mig_start=a.mig_start,
                             memory_mib=a.memory_mib, cores_pct=a.cores_pct)
            for a in reservation.allocations.filter(ends_at=old_end)]
    gpu_ids = sorted({grant.gpu_id for grant in held})
    # Longer on a broken or drained GPU is a booking placement would not make: refuse, as create would.
    broken = (Gpu.objects.filter(pk__in=gpu_ids).unusable().select_related("node")
              .order_by("node__name", "index").first())
    if broken is not None:
        why = "is unhealthy" if not broken.healthy else (
            "is on an unhealthy node" if not broken.node.healthy else "is on a node drained for new bookings")
        raise Conflict(f"GPU {broken.uuid} ({broken.node.name}, index {broken.index}) {why}; the reservation "
                       "cannot be extended on it. Book again for the extra time.", field="ends_at",
                       rule="gpus_unusable")
    # The extra time is booked like any other window: the same GPUs must be free for all of it.
    extra = booking.pool_snapshot(pool_id, old_end, ends_at, without_reservation=reservation.pk)
    clash = booking.first_clash(extra, held)
    if clash is not None:
        uuid = next(gpu.uuid for gpu in extra.gpus if gpu.id == clash.gpu_id)
        raise Conflict(
            f"GPU {uuid} is booked by another reservation from {clash.starts_at:%Y-%m-%d %H:%M} UTC; "
            f"the latest possible end is {clash.starts_at.isoformat()}.", field="ends_at", rule="gpus_busy",
        )
    _check_quota(_quota_limits(reservation), ge=sum(grant.ge for grant in held), asked="the extension",
                 field="ends_at", start=old_end, end=ends_at, exclude_reservation=reservation.pk)
    reservation.allocations.filter(ends_at=old_end).update(ends_at=ends_at)
    reservation.ends_at = ends_at
    reservation.save(update_fields=["ends_at", "updated_at"])
    _record(reservation, from_state=reservation.state, to_state=reservation.state, actor=actor,
            reason=f"Extended from {old_end.isoformat()} to {ends_at.isoformat()}.")
    return reservation


# --- time-driven steps (run by Celery; safe to run twice) ------------------------------------

@transaction.atomic
def reservation_activate(*, reservation_id: int, now: datetime | None = None) -> bool:
    """scheduled → applying once starts_at has come, with an apply job per cluster it touches.
    The job moves it to active (or failed). Returns whether it acted."""
    now = now or timezone.now()
    reservation = Reservation.objects.select_for_update().filter(
        pk=reservation_id, state=State.SCHEDULED, starts_at__lte=now, ends_at__gt=now
    ).first()
    if reservation is None:
        return False
    _move(reservation, State.APPLYING, reason="Window started; applying on the cluster.")
    if not jobs.jobs_create(reservation=reservation, action=ApplyJob.Action.APPLY, now=now):
        _move(reservation, State.FAILED, reason="None of its GPUs belongs to a cluster any more.", now=now)
    return True


def _undo(reservation: Reservation, *, final_state: str, reason: str, actor: AbstractBaseUser | None = None,
          now: datetime) -> None:
    """applying/active → releasing, with an undo job per cluster; scheduled (never applied) → final at once."""
    if reservation.state == State.SCHEDULED:
        _move(reservation, final_state, actor=actor, reason=f"{reason} It had not been applied yet.", now=now)
        return
    _move(reservation, State.RELEASING, actor=actor, reason=reason)
    if not jobs.jobs_create(reservation=reservation, action=ApplyJob.Action.UNDO, final_state=final_state, now=now):
        _move(reservation, final_state, actor=actor, reason=reason, now=now)


@transaction.atomic
def reservation_undo_again(*, reservation_id: int, now: datetime | None = None) -> bool:
    """A reservation in releasing without an open undo job (its job was lost): queue one. Returns whether it acted."""
    now = now or timezone.now()
    reservation = Reservation.objects.select_for_update().filter(pk=reservation_id, state=State.RELEASING).first()
    if reservation is None or reservation.apply_jobs.filter(action=ApplyJob.Action.UNDO,
                                                            status__in=ApplyJob.OPEN_STATUSES).exists():
        return False
    went_releasing_at = (reservation.events.filter(to_state=State.RELEASING).order_by("-at")
                         .values_list("at", flat=True).first() or now)
    final = ending_state(ends_at=reservation.ends_at, released_at=went_releasing_at)
    if not jobs.jobs_create(reservation=reservation, action=ApplyJob.Action.UNDO, final_state=final, now=now):
        _move(reservation, final, reason=reservation.reason, now=now)
    return True


@transaction.atomic
def reservation_expire(*, reservation_id: int, now: datetime | None = None) -> bool:
    """A live reservation whose window has ended: undone, then expired; failed if it was never applied.
    Returns whether it acted."""
    now = now or timezone.now()
    reservation = Reservation.objects.select_for_update().filter(
        pk=reservation_id, state__in=Reservation.LIVE_STATES, ends_at__lte=now
    ).first()
    if reservation is None:
        return False
    if reservation.state == State.SCHEDULED:
        # Its window passed with no worker to apply it (workers down, or the broker away so long):
        # the team never had the GPUs, and the reservation says so rather than looking used up.
        _move(reservation, State.FAILED, now=now,
              reason="Its window ended before it could be applied: no worker started it in time.")
        return True
    _undo(reservation, final_state=State.EXPIRED, reason="Window ended.", now=now)
    return True


def due_reservation_ids(now: datetime | None = None) -> dict[str, list[int]]:
    """What the sweep should act on: due to start, due to end, releasing without an undo job."""
    now = now or timezone.now()
    live = Reservation.objects.filter(state__in=Reservation.LIVE_STATES)
    return {
        "activate": list(
            Reservation.objects.filter(state=State.SCHEDULED, starts_at__lte=now, ends_at__gt=now)
            .values_list("id", flat=True)[:1000]
        ),
        "expire": list(live.filter(ends_at__lte=now).values_list("id", flat=True)[:1000]),
        "undo_again": jobs.releasing_without_undo_ids(),
    }


# --- quotas (staff) ------------------------------------------------------------------------

@transaction.atomic
def quota_set(*, actor: AbstractBaseUser, team: Team, pool: GpuPool, max_ge: int,
              ge_hours_per_month: int | None) -> Quota:
    """Create or change a team's quota in a pool. It binds the next reservation; held ones stay."""
    if not actor.is_staff:
        raise PermissionDenied("Only staff can change quotas.", field="quota", rule="staff_required")
    # Check the values before get_or_create writes them: a new quota is INSERTed there, so a value
    # beyond the column's range (ge_hours_per_month is an integer on PostgreSQL) failed in the
    # database as a 500 instead of a 400 naming the field. Uniqueness is get_or_create's to settle;
    # team and pool are rows the caller already read.
    Quota(team=team, pool=pool, max_ge=max_ge, ge_hours_per_month=ge_hours_per_month).full_clean(
        exclude=["team", "pool"], validate_unique=False, validate_constraints=False)
    quota, _ = Quota.objects.select_for_update().get_or_create(
        team=team, pool=pool, defaults={"max_ge": max_ge, "ge_hours_per_month": ge_hours_per_month}
    )
    quota.max_ge = max_ge
    quota.ge_hours_per_month = ge_hours_per_month
    quota.full_clean()
    quota.save()
    return quota
