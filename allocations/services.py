"""Writes about quotas and reservations.

Every function here is one transaction. Placement runs under a row lock on the pool
(`SELECT ... FOR UPDATE`), so two requests for the same pool are decided one after the
other and never both take the last free GPU; on SQLite the IMMEDIATE transaction mode
serializes writers the same way. Celery tasks are queued with `transaction.on_commit`,
so a task never sees a reservation that was rolled back.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import DEFAULT_DB_ALIAS, IntegrityError, transaction
from django.db.models import F
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop, ngettext

from allocations import alternatives, booking, notices, queue, quotas, reclaim, selectors, shapes
from allocations.messages import Msg, stored_reason
from allocations.apply import jobs
from allocations.models import ApplyJob, PriorityClass, Quota, QueueEntry, Reservation
from allocations.transitions import ending_state
from allocations.shapes import Amounts
from allocations.transitions import move as _move
from allocations.transitions import record as _record
from common import sql
from common.dispatch import enqueue_after_commit
from common.errors import Conflict, FieldError, NotFound, PermissionDenied, ValidationFailed, instant
from inventory.models import Gpu, GpuPool
from inventory.sharing import SharingMode
from teams.models import Team
from teams.selectors import token_allows_team

State = Reservation.State


# --- window and quota checks -------------------------------------------------------------

def _validated_window(starts_at: datetime | None, ends_at: datetime, now: datetime) -> datetime:
    """Check [starts_at, ends_at) and return the effective start (a missing or just-past start means now)."""
    if starts_at is None or now - settings.RESERVATION_START_GRACE <= starts_at < now:
        starts_at = now
    if ends_at <= starts_at:
        raise ValidationFailed(_("The end must come after the start (%(start)s).") % {"start": instant(starts_at)},
                               field="ends_at", rule="after_starts_at")
    if ends_at <= now:
        raise ValidationFailed(_("The end (%(end)s) has already passed: give an end in the future.")
                               % {"end": instant(ends_at)}, field="ends_at", rule="in_past")
    if starts_at < now:
        raise ValidationFailed(_("The start (%(start)s) has already passed: leave it empty to start now.")
                               % {"start": instant(starts_at)}, field="starts_at", rule="in_past")
    if starts_at - now > settings.RESERVATION_MAX_LEAD:
        days = settings.RESERVATION_MAX_LEAD.days
        raise ValidationFailed(ngettext("A reservation may start at most %(days)d day ahead, by %(latest)s.",
                                        "A reservation may start at most %(days)d days ahead, by %(latest)s.", days)
                               % {"days": days, "latest": instant(now + settings.RESERVATION_MAX_LEAD)},
                               field="starts_at", rule="max_lead")
    _check_duration(starts_at, ends_at)
    return starts_at


def _check_duration(starts_at: datetime, ends_at: datetime) -> None:
    """A reservation's window, as created or extended, is at most RESERVATION_MAX_DURATION long."""
    if ends_at - starts_at > settings.RESERVATION_MAX_DURATION:
        days = settings.RESERVATION_MAX_DURATION.days
        raise ValidationFailed(ngettext("A reservation lasts at most %(days)d day: this one must end by %(latest)s.",
                                        "A reservation lasts at most %(days)d days: this one must end by "
                                        "%(latest)s.", days)
                               % {"days": days, "latest": instant(starts_at + settings.RESERVATION_MAX_DURATION)},
                               field="ends_at", rule="max_duration")


# --- commands ------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class ReservationRequest(Amounts):
    """What a member asks for, as the API takes it: pool and team by slug, the window, and the amount in
    the pool's unit (which of Amounts' fields apply depends on its sharing mode; shapes.shape_for
    checks them)."""

    team: str
    pool: str
    ends_at: datetime | None = None
    starts_at: datetime | str | None = None  # a datetime, None (now or as soon as it fits), or EARLIEST
    duration: timedelta | None = None  # instead of ends_at: this long, as soon as it fits (or EARLIEST)
    not_before: datetime | None = None
    not_after: datetime | None = None
    queue: bool | None = None  # None: wait if the pool queues; False: now or never; True: wait (or 400)
    priority_class: str | None = None  # None: the quota's class; else one at most as high
    requeue: bool = False  # if it is taken back (allocations/reclaim.py), wait in the queue again for the rest
    gpu_models: Sequence[str] | None = None  # the GPU models it accepts (None or empty: any; shapes.checked_gpu_models)


EARLIEST = "earliest"


@dataclass(frozen=True)
class _Timing:
    """When a create asks to run: a fixed window, as soon as it fits (`asap`), or the earliest window
    that fits, booked now (`earliest`)."""

    kind: str  # "window", "asap" or "earliest"
    starts_at: datetime
    ends_at: datetime
    duration: timedelta
    not_before: datetime | None = None
    not_after: datetime | None = None


def _validated_timing(request: ReservationRequest, now: datetime) -> _Timing:
    """Check the request's times, naming the field and the rule of the first that is wrong."""
    if request.duration is None:
        for name in ("not_before", "not_after"):
            if getattr(request, name) is not None:
                raise ValidationFailed(_("%(field)s goes with duration (a request that starts as soon as it fits).")
                                       % {"field": name}, field=name, rule="needs_duration")
        if request.starts_at == EARLIEST:
            raise ValidationFailed(_('starts_at "earliest" needs a duration.'), field="duration", rule="required")
        if request.ends_at is None:
            raise ValidationFailed(_("Give ends_at (a fixed window) or duration (as soon as it fits)."),
                                   field="ends_at", rule="required")
        starts_at = _validated_window(request.starts_at, request.ends_at, now)
        return _Timing("window", starts_at, request.ends_at, request.ends_at - starts_at)
    if request.ends_at is not None:
        raise ValidationFailed(_("Give ends_at or duration, not both."), field="duration", rule="exclusive_with")
    if request.starts_at is not None and request.starts_at != EARLIEST:
        raise ValidationFailed(_('A request with a duration starts as soon as it fits: leave starts_at out (or give '
                                 '"earliest"), or give starts_at with ends_at.'), field="starts_at",
                               rule="exclusive_with")
    duration = request.duration
    longest = min(settings.QUEUE_MAX_DURATION, settings.RESERVATION_MAX_DURATION)
    if duration <= timedelta(0):
        raise ValidationFailed(_("Say for how long: the duration must be longer than zero."), field="duration",
                               rule="min_value")
    if duration > longest:
        raise ValidationFailed(ngettext("A request may last at most %(days)d day.",
                                        "A request may last at most %(days)d days.", longest.days)
                               % {"days": longest.days}, field="duration", rule="max_value")
    not_before, not_after = request.not_before, request.not_after
    if not_after is not None and not_after <= now:
        raise ValidationFailed(_("The latest start (%(latest)s) has already passed.") % {"latest": instant(not_after)},
                               field="not_after", rule="in_past")
    if not_before is not None and not_after is not None and not_after < not_before:
        raise ValidationFailed(_("The latest start (%(latest)s) is before the earliest start (%(earliest)s).")
                               % {"latest": instant(not_after), "earliest": instant(not_before)},
                               field="not_after", rule="after_not_before")
    if not_before is not None and not_before - now > settings.RESERVATION_MAX_LEAD:
        days = settings.RESERVATION_MAX_LEAD.days
        raise ValidationFailed(ngettext("The earliest start may be at most %(days)d day ahead.",
                                        "The earliest start may be at most %(days)d days ahead.", days)
                               % {"days": days}, field="not_before", rule="max_lead")
    start = max(now, not_before or now)
    kind = "earliest" if request.starts_at == EARLIEST else "asap"
    return _Timing(kind, start, start + duration, duration, not_before, not_after)


@dataclass(frozen=True)
class _Asked:
    """A create's pool, team, the actor's role in the team and the team's quota in the pool."""

    pool: GpuPool
    team: Team
    role: str | None
    quota: quotas.QuotaLimits | None
    priority_class: str = ""  # the quota's class ("" : none, priority 0)
    priority: int = 0
    preemptible: bool = False  # the class is preemptible (allocations/reclaim.py)


def _lock_pool_for(request: ReservationRequest, actor: AbstractBaseUser) -> _Asked:
    """Lock the pool's row and read, in the same statement, the team, the actor's role in it and the
    team's quota in the pool. Everything placement decides on is read after this lock."""
    row = sql.fetch_one(
        "SELECT p.id, p.sharing_mode, p.sharing_config, p.placement_policy, p.queueing, p.backfill, p.borrowing, "
        "p.queue_ordering, t.id, m.role, q.max_ge, "
        "q.ge_hours_per_month, q.id IS NOT NULL, t.max_ge, pc.name, pc.value, q.max_borrow_ge, t.name, p.name, "
        "pc.preemptible "
        "FROM inventory_gpupool p JOIN teams_team t ON t.slug = %s "
        "LEFT JOIN teams_membership m ON m.team_id = t.id AND m.user_id = %s "
        "LEFT JOIN allocations_quota q ON q.team_id = t.id AND q.pool_id = p.id "
        "LEFT JOIN allocations_priorityclass pc ON pc.id = q.priority_class_id "
        "WHERE p.slug = %s" + sql.for_update_of("p"),
        [request.team, actor.pk, request.pool],
    )
    if row is None:
        pool_id, team_id = sql.fetch_one(
            "SELECT (SELECT id FROM inventory_gpupool WHERE slug = %s), (SELECT id FROM teams_team WHERE slug = %s)",
            [request.pool, request.team],
        )
        words = {"pool": _("There is no pool '%(slug)s'."), "team": _("There is no team '%(slug)s'.")}
        missing = [FieldError(field=name, rule="does_not_exist", message=words[name] % {"slug": slug})
                   for name, slug, found in (("pool", request.pool, pool_id), ("team", request.team, team_id))
                   if found is None]
        raise ValidationFailed(missing[0].message, errors=missing)
    (pool_id, sharing_mode, config, policy, queueing, backfill, borrowing, ordering, team_id, role, max_ge, ge_hours,
     has_quota, team_max_ge, class_name, class_value, max_borrow_ge, team_name, pool_name, preemptible) = row
    if not token_allows_team(actor, team_id):
        role = None
    # Partial instances: the columns read here are set, any other loads when first used.
    # from_db takes the values in the model's field order, whatever the order of the names.
    pool = GpuPool.from_db(DEFAULT_DB_ALIAS, ["id", "name", "slug", "sharing_mode", "sharing_config",
                                              "placement_policy", "queueing", "queue_ordering", "backfill", "borrowing"],
                           [pool_id, pool_name, request.pool, sharing_mode, sql.json_value(config) or {}, policy,
                            bool(queueing), ordering, bool(backfill), bool(borrowing)])
    team = Team.from_db(DEFAULT_DB_ALIAS, ["id", "slug", "name"], [team_id, request.team, team_name])
    quota = quotas.QuotaLimits.of(
        team_id=team_id, team_slug=request.team, pool_id=pool_id, pool_slug=request.pool, max_ge=max_ge,
        team_name=team_name, pool_name=pool_name,
        ge_hours_per_month=ge_hours, team_max_ge=team_max_ge, borrowing=bool(borrowing),
        max_borrow_ge=max_borrow_ge) if has_quota else None
    return _Asked(pool=pool, team=team, role=role, quota=quota, priority_class=class_name or "",
                  priority=class_value or 0, preemptible=bool(preemptible))


def _insert_row(*, asked: _Asked, actor: AbstractBaseUser, row: dict, starts_at: datetime, ends_at: datetime,
                state: str, now: datetime, requeue: bool = False) -> int:
    """INSERT the reservation's row (amount columns in `row`, as ReservationRow names them); its id."""
    (reservation_id,) = sql.fetch_one(
        "INSERT INTO allocations_reservation (team_id, pool_id, requested_by_id, mode, gpus, shares, mig_profile, "
        "mig_count, gpu_memory_mib, gpu_cores_pct, gpu_models, ge, borrowed_ge, requeue, priority, priority_class, "
        "preemptible, starts_at, ends_at, state, reason, ended_at, created_at, updated_at) "
        f"VALUES ({', '.join(['%s'] * 20)}, '', NULL, %s, %s) RETURNING id",
        [asked.team.pk, asked.pool.pk, actor.pk, row["mode"], row["gpus"], row["shares"], row["mig_profile"],
         row["mig_count"], row["gpu_memory_mib"], row["gpu_cores_pct"], json.dumps(list(row["gpu_models"])), row["ge"],
         row.get("borrowed_ge", 0.0),
         requeue, asked.priority,
         asked.priority_class, asked.preemptible, sql.db_datetime(starts_at), sql.db_datetime(ends_at), state,
         sql.db_datetime(now),
         sql.db_datetime(now)])
    return reservation_id


def _insert_reservation(*, asked: _Asked, actor: AbstractBaseUser, shape: booking.Shape,
                        grants: list[booking.NewGrant], starts_at: datetime, ends_at: datetime,
                        now: datetime, borrowed_ge: float = 0.0, requeue: bool = False) -> Reservation:
    """Write the reservation, its grants and its first event; return it as saved."""
    spans = len({grant.gpu_id for grant in grants})
    ge = sum(grant.ge for grant in grants)
    vgpu = shape.mode == SharingMode.VGPU
    row = dict(
        mode=shape.mode, gpus=spans, shares=shape.shares or None, mig_profile=shape.mig_profile,
        mig_count=shape.mig_count or None,
        gpu_memory_mib=(grants[0].memory_mib if vgpu else None), gpu_cores_pct=(shape.cores_pct if vgpu else None),
        gpu_models=list(shape.gpu_models), ge=ge, borrowed_ge=borrowed_ge)
    reservation_id = _insert_row(asked=asked, actor=actor, row=row, starts_at=starts_at, ends_at=ends_at,
                                 state=State.SCHEDULED, now=now, requeue=requeue)
    booking.grants_write(reservation_id=reservation_id, grants=grants, start=starts_at, end=ends_at)
    reservation = selectors.reservation_from_row(selectors.ReservationRow(
        id=reservation_id, **row, priority_class=asked.priority_class, preemptible=asked.preemptible, preempt_at=None,
        starts_at=starts_at,
        ends_at=ends_at, state=State.SCHEDULED, reason="", reason_message=None,
        ended_at=None, created_at=now, updated_at=now, team_id=asked.team.pk, team_slug=asked.team.slug,
        pool_id=asked.pool.pk, pool_slug=asked.pool.slug, requested_by_id=actor.pk,
        requested_by_username=actor.get_username()))
    reservation.team, reservation.pool, reservation.requested_by = asked.team, asked.pool, actor
    if borrowed_ge:
        reason = Msg(gettext_noop("%(asked)s placed (%(ge)s GE, %(borrowed)s GE of it borrowed beyond the quota)"),
                     asked=shape.in_words(), ge=f"{ge:.2f}", borrowed=f"{borrowed_ge:.2f}")
    else:
        reason = Msg(gettext_noop("%(asked)s placed (%(ge)s GE)"), asked=shape.in_words(), ge=f"{ge:.2f}")
    _record(reservation, from_state="", to_state=State.SCHEDULED, actor=actor, reason=reason, at=now)
    return reservation


# Refusals that waiting can cure: the request waits instead, or is offered alternatives.
_ROOM_RULES = frozenset({"insufficient_capacity", "fragmented", "promised_to_queue", "quota_exceeded",
                         "team_cap_exceeded", "cpu_memory", "mig_fragmented", "no_gpu_model", "too_large"})


@dataclass
class _Booked:
    """A booking just written, with what its answer shows."""

    reservation: Reservation
    snapshot: booking.PoolSnapshot
    grants: list[booking.NewGrant]
    shape: booking.Shape


def reservation_create(*, actor: AbstractBaseUser, request: ReservationRequest,
                       now: datetime | None = None) -> Reservation:
    """Place what the request asks for in the pool's unit, or refuse with the reason.

    A fixed window (`starts_at`/`ends_at`) is booked or refused (409, with `alternatives`: the
    earliest window of the same length that fits, the largest amount that fits in the window, the
    same request in another pool of the team). A `duration` starts now if it fits without delaying
    any request waiting in the pool's queue, else waits there (`pending`, with its place in the
    queue), unless `queue` is false. `starts_at: "earliest"` books the earliest window that fits.
    The answer carries `allocated_gpus` and `grants` (as selectors.with_allocated_gpus sets them)."""
    now = now or timezone.now()
    timing = _validated_timing(request, now)
    try:
        with transaction.atomic():
            asked = _lock_pool_for(request, actor)
            pool, team = asked.pool, asked.team
            if not (actor.is_staff or asked.role is not None):
                raise PermissionDenied(_("You are not a member of team %(team)s.") % {"team": team.name},
                                       field="team", rule="not_a_member")
            if asked.quota is None:
                raise PermissionDenied(_("Team %(team)s has no quota in pool %(pool)s.")
                                       % {"team": team.name, "pool": pool.name}, field="pool", rule="no_quota")
            asked = _with_priority(asked, request.priority_class)
            if request.queue and timing.kind == "asap" and not pool.queueing:
                raise ValidationFailed(_("Pool %(pool)s does not queue requests: ask with queue false, or for a "
                                         "fixed window.") % {"pool": pool.name}, field="queue", rule="queueing_off")
            promised = queue.promised_grants(pool.pk, now)
            if timing.kind == "window":
                booked = _book_or_offer(asked, actor, request, timing.starts_at, timing.ends_at, now, promised)
            elif timing.kind == "earliest":
                start = _earliest_start(asked, request, timing, now, promised)
                booked = _book(asked, actor, request, start, start + timing.duration, now, promised)
            else:
                booked = _book_asap(asked, actor, request, timing, now, promised)
            if isinstance(booked, Reservation):  # waiting in the queue
                return booked
    except IntegrityError as exc:
        # Only the database's guards can fire here (the exclusion constraint, the vgpu trigger), and
        # only if the lock above was bypassed.
        raise Conflict(_("Those GPUs were just taken; try again."), field="gpus", rule="gpus_busy") from exc
    # The answer's GPUs from what was just written: no query to read them back.
    reservation, snapshot, grants, shape = booked.reservation, booked.snapshot, booked.grants, booked.shape
    by_id = {gpu.id: gpu for gpu in snapshot.gpus}
    held = sorted(grants, key=lambda g: (by_id[g.gpu_id].node_id, by_id[g.gpu_id].index, g.mig_start or 0,
                                         g.share_from))
    selectors.set_grants([reservation], [
        selectors.HeldRow(reservation.pk, by_id[g.gpu_id].uuid, by_id[g.gpu_id].node_name, by_id[g.gpu_id].index,
                          by_id[g.gpu_id].model, reservation.starts_at, reservation.ends_at, g.mode, g.milli,
                          g.mig_profile, g.mig_start, g.memory_mib,
                          g.cores_pct, g.ge, by_id[g.gpu_id].mig_devices, shape.replicas or None)
        for g in held])
    return reservation


def _with_priority(asked: _Asked, name: str | None) -> _Asked:
    """The priority the request runs at: its quota's class, or the lower class it asks for."""
    if name is None or name == asked.priority_class:
        return asked
    chosen = PriorityClass.objects.filter(name=name).first()
    if chosen is None:
        known = ", ".join(PriorityClass.objects.values_list("name", flat=True)) or _("none")
        raise ValidationFailed(_("There is no priority class '%(name)s' (there are: %(known)s).")
                               % {"name": name, "known": known}, field="priority_class", rule="does_not_exist")
    if chosen.value > asked.priority:
        allowed = (f"{asked.priority_class} ({asked.priority})" if asked.priority_class
                   else _("priority %(value)d") % {"value": asked.priority})
        raise ValidationFailed(_("Team %(team)s's quota in pool %(pool)s allows at most %(allowed)s; %(class)s is "
                                 "%(value)s.") % {"team": asked.team.name, "pool": asked.pool.name, "allowed": allowed,
                                                  "class": chosen.name, "value": chosen.value},
                               field="priority_class", rule="above_quota_class")
    return dataclasses.replace(asked, priority_class=chosen.name, priority=chosen.value, preemptible=chosen.preemptible)


def _book(asked: _Asked, actor: AbstractBaseUser, request: ReservationRequest, starts_at: datetime,
          ends_at: datetime, now: datetime, promised: list[booking.Grant]) -> _Booked:
    """Book [starts_at, ends_at) around the bookings and the queue's promises, or refuse (Conflict)."""
    pool = asked.pool
    snapshot = booking.pool_snapshot(pool.pk, starts_at, ends_at)
    shape = shapes.shape_for(pool, request, snapshot)
    field = shapes.AMOUNT_FIELD[shape.mode]
    victims: list[Reservation] = []  # those given notice for this window
    try:
        grants = booking.choose(queue.with_promised(snapshot, promised), shape, policy=pool.placement_policy)
    except booking.BookingRefused as refused:
        victims = _reclaimed_for(asked, shape, starts_at, ends_at, now, promised)
        if victims:
            # The victims' grants now end at the window's start: book on the pool as it is now.
            snapshot = booking.pool_snapshot(pool.pk, starts_at, ends_at)
            grants = booking.choose(queue.with_promised(snapshot, promised), shape, policy=pool.placement_policy)
        elif promised and _fits(snapshot, shape, pool):
            raise Conflict(_("%(asked)s would be free for that window, but it is promised to requests waiting in "
                             "the queue of pool %(pool)s.") % {"asked": shape.in_words(), "pool": pool.name},
                           field=field, rule="promised_to_queue") from None
        else:
            raise Conflict(refused.message, field=field, rule=refused.code) from None
    borrowed = quotas.check(asked.quota, ge=sum(grant.ge for grant in grants), asked=shape.in_words(), field=field,
                            start=starts_at, end=ends_at, may_borrow=starts_at <= now,
                            promised=getattr(promised, "team_windows", {}).get(asked.quota.team_id, ()))
    reservation = _insert_reservation(asked=asked, actor=actor, shape=shape, grants=grants, starts_at=starts_at,
                                      ends_at=ends_at, now=now, borrowed_ge=borrowed,
                                      requeue=bool(request.requeue))
    if victims:
        reclaim.for_request_of(victims, reservation.pk)  # its notices stand while it needs their GPUs
    if starts_at <= now:
        enqueue_after_commit("allocations.tasks.activate_reservation", reservation.pk)
    return _Booked(reservation, snapshot, grants, shape)


def _reclaimed_for(asked: _Asked, shape: booking.Shape, starts_at: datetime, ends_at: datetime, now: datetime,
                   promised: list[booking.Grant]) -> list[Reservation]:
    """A future fixed window within its team's quota that does not fit: give notice to the borrowed and
    lower-priority preemptible bookings whose GPUs it needs, so that they are free when it opens
    (allocations/reclaim.py). The bookings it gave notice ([]: none)."""
    if starts_at <= now:
        return []
    victims = reclaim.make_room(
        pool=asked.pool, team_id=asked.team.pk, team_words=asked.quota.team_words, priority=asked.priority,
        quota=asked.quota, shape=shape, start=starts_at, end=ends_at, promised=promised,
        team_promised=getattr(promised, "team_windows", {}).get(asked.quota.team_id, ()), asked=shape.in_words(),
        now=now)
    if victims:
        queue.kick(asked.pool.pk)  # what the victims booked after the window is free now
    return victims


def _fits(snapshot: booking.PoolSnapshot, shape: booking.Shape, pool: GpuPool) -> bool:
    try:
        booking.choose(snapshot, shape, policy=pool.placement_policy)
        return True
    except booking.BookingRefused:
        return False


def _book_or_offer(asked: _Asked, actor: AbstractBaseUser, request: ReservationRequest, starts_at: datetime,
                   ends_at: datetime, now: datetime, promised: list[booking.Grant]) -> _Booked:
    """Book the fixed window, or refuse with the alternatives that would work."""
    try:
        return _book(asked, actor, request, starts_at, ends_at, now, promised)
    except Conflict as refused:
        if refused.errors[0].rule not in _ROOM_RULES:
            raise
        refused.extra = {"alternatives": alternatives.offers(
            team=asked.team, pool=asked.pool, request=request, quota=asked.quota, starts_at=starts_at,
            ends_at=ends_at, now=now, promised=promised)}
        raise


def _earliest_start(asked: _Asked, request: ReservationRequest, timing: _Timing, now: datetime,
                    promised: list[booking.Grant]) -> datetime:
    """The first start from max(now, not_before) where the request fits for its duration (409 if none)."""
    found = alternatives.earliest_window(pool=asked.pool, request=request, quota=asked.quota, team=asked.team,
                                         earliest=timing.starts_at, duration=timing.duration, now=now,
                                         promised=promised, latest=timing.not_after)
    if found is None:
        raise Conflict(_("No window of that length fits in the booking horizon before not_after.")
                       if timing.not_after else _("No window of that length fits in the booking horizon."),
                       field="starts_at", rule="no_window")
    return found


def _book_asap(asked: _Asked, actor: AbstractBaseUser, request: ReservationRequest, timing: _Timing,
               now: datetime, promised: list[booking.Grant]) -> _Booked | Reservation:
    """Start now when it fits around the bookings and the queue's promises; else wait in the queue."""
    pool = asked.pool
    may_wait = pool.queueing and request.queue is not False
    strict_and_waiting = not pool.backfill and queue.has_waiting(pool.pk)
    if strict_and_waiting and not may_wait:
        raise Conflict(_("Requests are waiting in pool %(pool)s, whose queue keeps strict order; queue is false.")
                       % {"pool": pool.name}, field="queue", rule="would_wait")
    if timing.starts_at <= now and not strict_and_waiting:
        if not may_wait:  # now or never: refused as a fixed window is, with its alternatives
            return _book_or_offer(asked, actor, request, now, now + timing.duration, now, promised)
        try:
            return _book(asked, actor, request, now, now + timing.duration, now, promised)
        except Conflict as refused:
            if refused.errors[0].rule not in _ROOM_RULES:
                raise
    elif not may_wait:
        raise Conflict(_("It cannot start now (not_before is later) and queue is false."), field="queue",
                       rule="would_wait")
    return _enqueue(asked, actor, request, timing, now)


def _enqueue(asked: _Asked, actor: AbstractBaseUser, request: ReservationRequest, timing: _Timing,
             now: datetime) -> Reservation:
    """Write the request as pending with its queue entry, then run the pool's pass (it may start it at once)."""
    pool = asked.pool
    empty = booking.pool_snapshot(pool.pk, timing.starts_at, timing.ends_at)
    shape = shapes.shape_for(pool, request, empty)
    field = shapes.AMOUNT_FIELD[shape.mode]
    # What could never start, however long it waited, is refused now: too big for the pool as it is
    # built, or for the team's quota on its own.
    try:
        alone = booking.choose(dataclasses.replace(empty, grants=()), shape, policy=pool.placement_policy)
    except booking.BookingRefused as refused:
        raise Conflict(_("It could never start in pool %(pool)s, even empty: %(why)s")
                       % {"pool": pool.name, "why": refused.message}, field=field, rule="never_fits") from None
    ge = sum(grant.ge for grant in alone)
    error = quotas.held_error(asked.quota, ge=ge, asked=shape.in_words(), field=field, start=timing.starts_at,
                              end=timing.ends_at, in_pool=())
    if error is not None:
        raise error
    vgpu = shape.mode == SharingMode.VGPU
    row = dict(mode=shape.mode, gpus=shape.gpus if shape.mode in (SharingMode.EXCLUSIVE, SharingMode.VGPU) else 1,
               shares=shape.shares or None, mig_profile=shape.mig_profile, mig_count=shape.mig_count or None,
               gpu_memory_mib=(shape.memory_mib or None) if vgpu else None,
               gpu_cores_pct=shape.cores_pct if vgpu else None, gpu_models=list(shape.gpu_models), ge=0)
    reservation_id = _insert_row(asked=asked, actor=actor, row=row, starts_at=timing.starts_at,
                                 ends_at=timing.ends_at, state=State.PENDING, now=now, requeue=bool(request.requeue))
    QueueEntry.objects.create(reservation_id=reservation_id, shape=queue.shape_data(shape), duration=timing.duration,
                              not_before=timing.not_before, not_after=timing.not_after, queued_at=now,
                              priority=asked.priority)
    reservation = Reservation.objects.select_related("team", "pool", "requested_by").get(pk=reservation_id)
    _record(reservation, from_state="", to_state=State.PENDING, actor=actor,
            reason=Msg(gettext_noop("%(asked)s for %(span)s asked; waiting for room in pool %(pool)s."),
                       asked=shape.in_words(), span=queue.span(timing.duration), pool=pool.name))
    queue.queue_pass(pool_id=pool.pk, now=now, quiet=[reservation_id], lock=False)
    reservation.refresh_from_db()
    return selectors.with_allocated_gpus([reservation])[0]


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
    if row is not None and not token_allows_team(actor, selectors.ReservationRow._make(columns).team_id):
        actor_role = None
    if row is None or not (actor.is_staff or actor_role is not None):
        raise NotFound(_("Reservation %(id)s does not exist.") % {"id": reservation_id}, field="id",
                       rule="does_not_exist")
    return selectors.reservation_from_row(columns)


@transaction.atomic
def reservation_release(*, actor: AbstractBaseUser, reservation_id: int, now: datetime | None = None
                        ) -> Reservation:
    """Release early (running) or cancel (not started). The GPUs are free again at once. One whose
    window is already over expires, as the sweep would have it."""
    now = now or timezone.now()
    reservation = _locked_reservation(reservation_id, actor)
    who = getattr(actor, "username", "system")
    if reservation.state == State.PENDING:
        # It holds nothing yet: out of the queue, and the requests behind it move up.
        _move(reservation, State.RELEASED, actor=actor, now=now,
              reason=Msg(gettext_noop("Withdrawn from the queue by %(who)s."), who=who))
        QueueEntry.objects.filter(pk=reservation.pk).update(position=None)
        queue.kick(reservation.pool_id)
        return reservation
    if reservation.state not in Reservation.LIVE_STATES:
        raise Conflict(_("A %(state)s reservation cannot be released.") % {"state": str(reservation.get_state_display()).lower()},
                       field="state", rule="not_live")
    queue.kick(reservation.pool_id)  # its GPUs are free from now: someone waiting may fit
    if ending_state(ends_at=reservation.ends_at, released_at=now) == State.EXPIRED:
        # The window is already over and the sweep has not got to it yet: do what the sweep would,
        # so it ends as expired (its GPUs were held to the end, not given back early).
        _undo(reservation, final_state=State.EXPIRED, actor=actor, reason=Msg(gettext_noop("Window ended.")),
              now=now)
        return reservation
    if reservation.starts_at > now:
        # Never used: every allocation shrinks to an empty window at its start.
        sql.execute("UPDATE allocations_allocation SET ends_at = starts_at WHERE reservation_id = %s",
                    [reservation.pk])
        _move(reservation, State.RELEASED, actor=actor, now=now,
              reason=Msg(gettext_noop("Cancelled before its start by %(who)s."), who=who))
        return reservation
    sql.execute("UPDATE allocations_allocation SET ends_at = %s WHERE reservation_id = %s AND ends_at > %s",
                [sql.db_datetime(now), reservation.pk, sql.db_datetime(now)])
    _undo(reservation, final_state=State.RELEASED, actor=actor, now=now,
          reason=Msg(gettext_noop("Released early by %(who)s."), who=who))
    return reservation


def waiting_ids(pool_id: int) -> set[int]:
    return set(Reservation.objects.filter(pool_id=pool_id, state=State.PENDING).values_list("pk", flat=True))


def _quota_limits(reservation: Reservation) -> quotas.QuotaLimits:
    """The quota binding a held reservation (403 when staff removed it since)."""
    team, pool = reservation.team, reservation.pool
    # order_by(): Quota's default ordering would join teams and pools for first().
    quota = Quota.objects.filter(team_id=reservation.team_id, pool_id=reservation.pool_id).order_by().first()
    if quota is None:
        raise PermissionDenied(_("Team %(team)s has no quota in pool %(pool)s.") % {"team": team.name, "pool": pool.name},
                               field="pool", rule="no_quota")
    return quotas.QuotaLimits.of(team_id=reservation.team_id, team_slug=team.slug, pool_id=reservation.pool_id,
                                 pool_slug=pool.slug, team_name=team.name, pool_name=pool.name,
                                 max_ge=quota.max_ge, ge_hours_per_month=quota.ge_hours_per_month,
                                 team_max_ge=reservation.team.max_ge)


@transaction.atomic
def reservation_extend(*, actor: AbstractBaseUser, reservation_id: int, ends_at: datetime,
                       now: datetime | None = None) -> Reservation:
    """Move ends_at later, keeping the same GPUs, when they stay free and the quota allows."""
    now = now or timezone.now()
    pool_id = Reservation.objects.filter(pk=reservation_id).values_list("pool_id", flat=True).first()
    if pool_id is None:
        raise NotFound(_("Reservation %(id)s does not exist.") % {"id": reservation_id}, field="id",
                       rule="does_not_exist")
    # Same lock order as reservation_create (pool, then reservation): no deadlock between the two.
    GpuPool.objects.select_for_update().get(pk=pool_id)
    reservation = _locked_reservation(reservation_id, actor)
    if reservation.state not in Reservation.LIVE_STATES:
        raise Conflict(_("A %(state)s reservation cannot be extended.") % {"state": str(reservation.get_state_display()).lower()},
                       field="state", rule="not_live")
    if reservation.preempt_at is not None:
        raise Conflict(_("It is being taken back at %(at)s (see its notice): it cannot be extended.")
                       % {"at": instant(reservation.preempt_at)}, field="ends_at", rule="being_reclaimed")
    old_end = reservation.ends_at
    if ends_at <= old_end:
        raise ValidationFailed(_("The new end must come after the current end, %(end)s.") % {"end": instant(old_end)},
                               field="ends_at", rule="after_current_end")
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
        if not broken.healthy:
            text = _("GPU %(gpu)s (%(uuid)s) is unhealthy; the reservation cannot be extended on it. Book again "
                     "for the extra time.")
        elif not broken.node.healthy:
            text = _("GPU %(gpu)s (%(uuid)s) is on an unhealthy node; the reservation cannot be extended on it. "
                     "Book again for the extra time.")
        else:
            text = _("GPU %(gpu)s (%(uuid)s) is on a node drained for new bookings; the reservation cannot be "
                     "extended on it. Book again for the extra time.")
        raise Conflict(text % {"gpu": selectors.gpu_label(broken.node.name, broken.index), "uuid": broken.uuid}, field="ends_at",
                       rule="gpus_unusable")
    # The extra time is booked like any other window: the same GPUs must be free for all of it.
    extra = queue.with_promised(booking.pool_snapshot(pool_id, old_end, ends_at, without_reservation=reservation.pk),
                           queue.promised_grants(pool_id, now))
    clash = booking.first_clash(extra, held)
    if clash is not None:
        uuid = next(gpu.uuid for gpu in extra.gpus if gpu.id == clash.gpu_id)
        if clash.reservation_id in waiting_ids(pool_id):
            text = _("GPU %(uuid)s is promised to a request waiting in the queue from %(at)s: the latest possible "
                     "end is %(at)s.")
        else:
            text = _("GPU %(uuid)s is booked by another reservation from %(at)s: the latest possible end is %(at)s.")
        raise Conflict(text % {"uuid": uuid, "at": instant(clash.starts_at)}, field="ends_at", rule="gpus_busy")
    quotas.check(_quota_limits(reservation), ge=sum(grant.ge for grant in held),
                 asked=Msg(gettext_noop("the extension")),
                 field="ends_at", start=old_end, end=ends_at, exclude_reservation=reservation.pk)
    reservation.allocations.filter(ends_at=old_end).update(ends_at=ends_at)
    reservation.ends_at = ends_at
    reservation.save(update_fields=["ends_at", "updated_at"])
    _record(reservation, from_state=reservation.state, to_state=reservation.state, actor=actor,
            reason=Msg(gettext_noop("Extended from %(old)s to %(new)s."), old=instant(old_end), new=instant(ends_at)))
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
    _move(reservation, State.APPLYING, reason=Msg(gettext_noop("Window started; applying on the cluster.")))
    if not jobs.jobs_create(reservation=reservation, action=ApplyJob.Action.APPLY, now=now):
        _move(reservation, State.FAILED, reason=Msg(gettext_noop("None of its GPUs belongs to a cluster any more.")),
              now=now)
    return True


def _undo(reservation: Reservation, *, final_state: str, reason: Msg, actor: AbstractBaseUser | None = None,
          now: datetime) -> None:
    """applying/active → releasing, with an undo job per cluster; scheduled (never applied) → final at once."""
    if reservation.state == State.SCHEDULED:
        _move(reservation, final_state, actor=actor, now=now,
              reason=Msg(gettext_noop("%(reason)s It had not been applied yet."), reason=reason))
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
        _move(reservation, final, reason=stored_reason(reservation), now=now)
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
        _move(reservation, State.FAILED, now=now, reason=Msg(gettext_noop(
            "Its window ended before it could be applied: no worker started it in time.")))
        return True
    _undo(reservation, final_state=State.EXPIRED, reason=Msg(gettext_noop("Window ended.")), now=now)
    queue.kick(reservation.pool_id)
    return True


@transaction.atomic
def reservation_preempt(*, reservation_id: int, now: datetime | None = None) -> int:
    """A victim's notice (allocations/reclaim.py) has run out: it and every other victim of its pool whose
    notice has run out go back through the normal undo path (the GE-hours they booked beyond the notice's
    end stopped counting against their budgets when their grants were cut to end there). Then the pool's
    pass starts the request they were taken for, and only then does each that asked `requeue` wait in the
    queue again, at its old place, for the rest of its time: at its old place it may be ordered ahead of
    that request (fcfs), and requeued first it would take its GPUs straight back. A notice whose request no
    longer needs the GPUs is withdrawn first (reclaim.call_off_needless), not carried out. Returns how many it
    released (0: none was due)."""
    now = now or timezone.now()
    pool_id = (Reservation.objects.filter(pk=reservation_id, state__in=Reservation.LIVE_STATES, preempt_at__lte=now)
               .values_list("pool_id", flat=True).first())
    if pool_id is None:
        return 0
    # The pool first, as creates, extensions and the pass lock (then reservations): no deadlock with them.
    GpuPool.objects.select_for_update().get(pk=pool_id)
    # Never take GPUs whose notice is no longer needed: the pass that would have withdrawn it may not have
    # run since the request it was given for ended or started elsewhere.
    reclaim.call_off_needless(pool_id, now)
    due = list(Reservation.objects.select_for_update(of=("self",)).select_related("team", "pool", "requested_by")
               .filter(pool_id=pool_id, state__in=Reservation.LIVE_STATES, preempt_at__lte=now).order_by("pk"))
    remaining = {}
    for reservation in due:
        remaining[reservation.pk] = reservation.ends_at - now
        sql.execute("UPDATE allocations_allocation SET ends_at = %s WHERE reservation_id = %s AND ends_at > %s",
                    [sql.db_datetime(now), reservation.pk, sql.db_datetime(now)])
        _undo(reservation, final_state=State.RELEASED, now=now,
              reason=Msg(gettext_noop("GPUs taken back after the notice: %(why)s"),
                         why=stored_reason(reservation, "preempt_reason")))
    if due:
        queue.queue_pass(pool_id=pool_id, now=now, lock=False)
    for reservation in due:
        if reservation.requeue and remaining[reservation.pk] > timedelta(0):
            queue.requeue_rest(reservation, remaining[reservation.pk], now=now)
    queue.kick(pool_id)
    return len(due)


@transaction.atomic
def reservation_warn_expiry(*, reservation_id: int, now: datetime | None = None) -> bool:
    """Mail the holders of a running reservation that its window ends within EXPIRY_WARNING, once.
    Returns whether it mailed."""
    now = now or timezone.now()
    claimed = Reservation.objects.filter(
        pk=reservation_id, state__in=Reservation.LIVE_STATES, expiry_warned_at__isnull=True, starts_at__lte=now,
        ends_at__gt=now, ends_at__lte=now + settings.EXPIRY_WARNING).update(expiry_warned_at=now)
    if not claimed:
        return False
    reservation = Reservation.objects.select_related("team", "pool", "requested_by").get(pk=reservation_id)
    left = reservation.ends_at - now
    notices.notify_owners(
        reservation, Msg(gettext_noop("Reservation #%(id)s ends in %(span)s"), id=reservation.pk, span=queue.span(left)),
        Msg(gettext_noop("Its window ends at %(end)s UTC; its GPUs go back to the pool then. To keep them longer, "
                         "extend it on its page (or POST .../extend/ with a later ends_at) while they stay free of "
                         "other bookings."), end=f"{reservation.ends_at:%Y-%m-%d %H:%M}"),
        event="reservation.expiring")
    return True


def due_reservation_ids(now: datetime | None = None) -> dict[str, list[int]]:
    """What the sweep should act on: due to start, due to end, releasing without an undo job, ending soon
    (a warning not yet sent; not for a booking shorter than the warning, which would be warned at its start)."""
    now = now or timezone.now()
    live = Reservation.objects.filter(state__in=Reservation.LIVE_STATES)
    return {
        "preempt": list(live.filter(preempt_at__lte=now).values_list("id", flat=True)[:1000]),
        "warn_expiry": list(
            live.filter(expiry_warned_at__isnull=True, starts_at__lte=now, ends_at__gt=now,
                        ends_at__lte=now + settings.EXPIRY_WARNING,
                        starts_at__lt=F("ends_at") - settings.EXPIRY_WARNING)
            .values_list("id", flat=True)[:1000]),
        "activate": list(
            Reservation.objects.filter(state=State.SCHEDULED, starts_at__lte=now, ends_at__gt=now)
            .values_list("id", flat=True)[:1000]
        ),
        "expire": list(live.filter(ends_at__lte=now).values_list("id", flat=True)[:1000]),
        "undo_again": jobs.releasing_without_undo_ids(),
    }



# --- idle reclaim (a pool's opt-in policy; monitoring.idle decides from the telemetry) -------------

@dataclass(frozen=True, kw_only=True)
class IdleEvidence:
    """What the telemetry says of a running reservation's GPUs (monitoring.idle.evidence): idle since
    `since` (all of them), with these peaks since then."""

    since: datetime
    peak_util: int  # %
    peak_memory_mib: int


def _evidence_msg(evidence: IdleEvidence, now: datetime) -> Msg:
    return Msg(gettext_noop("its GPUs have been idle since %(since)s (%(span)s): peak utilization %(util)d%%, "
                            "peak memory %(memory)d MiB, no process of its own"),
               since=instant(evidence.since), span=queue.span(now - evidence.since), util=evidence.peak_util,
               memory=evidence.peak_memory_mib)


@transaction.atomic
def reservation_idle_warn(*, reservation_id: int, evidence: IdleEvidence, release_at: datetime,
                          now: datetime | None = None) -> bool:
    """Warn the holders of a running reservation (mail, channels, a banner on its page) that it is released
    at `release_at` unless its GPUs are used or its team marks it keep. Once per idle spell (the claim is
    a conditional update). Returns whether it warned."""
    now = now or timezone.now()
    claimed = Reservation.objects.filter(
        pk=reservation_id, state=State.ACTIVE, idle_warned_at__isnull=True, keep_at__isnull=True,
        ends_at__gt=now).update(idle_warned_at=now, idle_since=evidence.since)
    if not claimed:
        return False
    reservation = Reservation.objects.select_related("team", "pool", "requested_by").get(pk=reservation_id)
    why = _evidence_msg(evidence, now)
    _record(reservation, from_state=reservation.state, to_state=reservation.state, actor=None, at=now,
            reason=Msg(gettext_noop("Idle warning: %(why)s. It is released at %(at)s unless it is used or kept."),
                       why=why, at=instant(release_at)))
    notices.notify_owners(
        reservation, Msg(gettext_noop("Reservation #%(id)s sits idle and will be released"), id=reservation.pk),
        Msg(gettext_noop("Pool %(pool)s takes back idle GPUs: %(why)s. It is released at %(at)s unless its GPUs "
                         "are used before then, or its team marks it keep (with a reason) on its page."),
            pool=reservation.pool.name, why=why, at=instant(release_at)),
        event="reservation.idle_warning")
    return True


@transaction.atomic
def reservation_idle_cancel(*, reservation_id: int, active_at: datetime | None, now: datetime | None = None) -> bool:
    """Activity (or a keep) after the idle warning: the pending release is called off, and recorded.
    Returns whether a warning was pending."""
    now = now or timezone.now()
    reservation = Reservation.objects.select_for_update().filter(
        pk=reservation_id, idle_warned_at__isnull=False).first()
    if reservation is None:
        return False
    Reservation.objects.filter(pk=reservation_id).update(idle_warned_at=None, idle_since=None)
    if active_at is not None:
        reason = Msg(gettext_noop("Its GPUs were used again at %(at)s: the idle release is called off."),
                     at=instant(active_at))
    else:
        reason = Msg(gettext_noop("Marked keep: the idle release is called off."))
    _record(reservation, from_state=reservation.state, to_state=reservation.state, actor=None, at=now, reason=reason)
    return True


@transaction.atomic
def reservation_idle_release(*, reservation_id: int, evidence: IdleEvidence, now: datetime | None = None) -> bool:
    """Release a warned reservation still idle, through the normal undo path, with the evidence as its
    reason. Not one that was kept, used again (the warning cleared) or has ended. Returns whether it acted."""
    now = now or timezone.now()
    reservation = (Reservation.objects.select_for_update(of=("self",)).select_related("team", "pool", "requested_by")
                   .filter(pk=reservation_id, state=State.ACTIVE, idle_warned_at__isnull=False,
                           keep_at__isnull=True, ends_at__gt=now).first())
    if reservation is None:
        return False
    sql.execute("UPDATE allocations_allocation SET ends_at = %s WHERE reservation_id = %s AND ends_at > %s",
                [sql.db_datetime(now), reservation.pk, sql.db_datetime(now)])
    reason = Msg(gettext_noop("Released as idle by pool %(pool)s's policy: %(why)s; warned at %(warned)s."),
                 pool=reservation.pool.slug, why=_evidence_msg(evidence, now),
                 warned=instant(reservation.idle_warned_at))
    _undo(reservation, final_state=State.RELEASED, now=now, reason=reason)
    notices.notify_owners(
        reservation, Msg(gettext_noop("Reservation #%(id)s was released as idle"), id=reservation.pk), reason,
        event="reservation.idle_released")
    queue.kick(reservation.pool_id)
    return True


@transaction.atomic
def reservation_keep(*, actor: AbstractBaseUser, reservation_id: int, keep: bool, reason: str = "",
                     now: datetime | None = None) -> Reservation:
    """Mark a live reservation "keep" (the idle reclaim leaves it alone), with a reason staff see, or unmark
    it. At most the pool's idle_keep_allowance of one team's live reservations are kept at once: the
    pool's row is locked while they are counted, so two requests cannot both take the last one."""
    now = now or timezone.now()
    reservation = _locked_reservation(reservation_id, actor)
    if not keep:
        if reservation.keep_at is not None:
            Reservation.objects.filter(pk=reservation.pk).update(keep_at=None, keep_by=None, keep_reason="")
            _record(reservation, from_state=reservation.state, to_state=reservation.state, actor=actor, at=now,
                    reason=Msg(gettext_noop("No longer kept, by %(who)s."), who=actor.get_username()))
        reservation.refresh_from_db()
        return reservation
    reason = (reason or "").strip()
    if not reason:
        raise ValidationFailed(_("Say why it is kept."), field="reason", rule="required")
    if reservation.state not in Reservation.LIVE_STATES:
        raise Conflict(_("A %(state)s reservation cannot be kept.") % {
            "state": str(reservation.get_state_display()).lower()}, field="state", rule="not_live")
    pool = GpuPool.objects.select_for_update().get(pk=reservation.pool_id)
    kept = (Reservation.objects.filter(team_id=reservation.team_id, pool_id=pool.pk, keep_at__isnull=False,
                                       state__in=Reservation.LIVE_STATES).exclude(pk=reservation.pk).count())
    if reservation.keep_at is None and kept >= pool.idle_keep_allowance:
        raise Conflict(_("Team %(team)s already keeps %(kept)d reservation(s) in pool %(pool)s, its allowance "
                         "there (%(allowance)d): unmark one first.") % {
            "team": reservation.team.name, "kept": kept, "pool": pool.name, "allowance": pool.idle_keep_allowance},
            field="keep", rule="keep_allowance")
    Reservation.objects.filter(pk=reservation.pk).update(keep_at=now, keep_by=actor, keep_reason=reason[:200])
    _record(reservation, from_state=reservation.state, to_state=reservation.state, actor=actor, at=now,
            reason=Msg(gettext_noop("Marked keep by %(who)s: %(reason)s"), who=actor.get_username(),
                       reason=reason[:200]))
    if reservation.idle_warned_at is not None:
        reservation_idle_cancel(reservation_id=reservation.pk, active_at=None, now=now)
    reservation.refresh_from_db()
    return reservation


# --- quotas (staff) ------------------------------------------------------------------------

@transaction.atomic
def quota_set(*, actor: AbstractBaseUser, team: Team, pool: GpuPool, max_ge: int,
              ge_hours_per_month: int | None, priority_class: PriorityClass | None = None,
              max_borrow_ge=None) -> Quota:
    """Create or change a team's quota in a pool. It binds the next reservation; held ones stay."""
    if not actor.is_staff:
        raise PermissionDenied(_("Only staff can change quotas."), field="quota", rule="staff_required")
    # Check the values before get_or_create writes them: a new quota is INSERTed there, so a value
    # beyond the column's range (ge_hours_per_month is an integer on PostgreSQL) failed in the
    # database as a 500 instead of a 400 naming the field. Uniqueness is get_or_create's to settle;
    # team and pool are rows the caller already read.
    Quota(team=team, pool=pool, max_ge=max_ge, ge_hours_per_month=ge_hours_per_month).full_clean(
        exclude=["team", "pool"], validate_unique=False, validate_constraints=False)
    quota, _created = Quota.objects.select_for_update().get_or_create(
        team=team, pool=pool, defaults={"max_ge": max_ge, "ge_hours_per_month": ge_hours_per_month,
                                        "priority_class": priority_class, "max_borrow_ge": max_borrow_ge}
    )
    quota.max_borrow_ge = max_borrow_ge
    quota.max_ge = max_ge
    quota.ge_hours_per_month = ge_hours_per_month
    quota.priority_class = priority_class
    quota.full_clean()
    quota.save()
    queue.kick(pool.pk)  # more quota may let a waiting request start; less moves promises
    return quota
