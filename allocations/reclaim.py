"""Taking GPUs back, after a notice, for a request within its team's quota that cannot be placed otherwise.

Two kinds of booking may be taken back (the victims), and only bookings of other teams:

- **borrowed**: it holds GE beyond its team's quota (`borrowed_ge`, booked on idle GPUs of a pool that
  lends); any request within its quota may reclaim it, whatever the priorities;
- **preemptible**: it runs at a priority class staff marked `preemptible` (copied onto the booking when
  it is asked, `Reservation.preemptible`); only a request of a strictly higher priority may take it.

Candidates are tried in the order Kueue's preemption uses: borrowed ones first, then the lowest priority,
then the youngest. The fewest come first: one victim when one alone frees the room (the first such in that
order); else the first candidates that together free it, less any the room turns out not to need (tried
from the end of the order back), which leaves none that could be spared (Kueue's minimal set, not a search
of every combination, which a pass cannot afford).

A victim is never taken from a booking that had not run PREEMPTION_MIN_RUNTIME when its notice begins:
its GPUs are taken back at `at`, and it must have started by at - PREEMPTION_NOTICE - PREEMPTION_MIN_RUNTIME.
For the queue's reclaim `at` is now + PREEMPTION_NOTICE, so it must have run the minimum by now; for a future
fixed window `at` is the window's start, so a booking that will have run the minimum before the notice would
have begun may be told now, and is told earlier than the notice requires.

The notice (give_notice) is the same for both callers: `preempt_at`, the reason (why, and for which team,
never which person) on its page and in a ReservationEvent, and a mail to its holders; its grants are cut to
end at `at` in the database at once, so the exclusion constraints on grants keep guarding the GPUs it hands
over and the GE-hours it will not use stop counting against its team's monthly budget. When the notice
runs out the sweep releases it through the normal undo path (services.reservation_preempt), and one that
asked `requeue` waits in the queue again at its old place for the rest of its time.

The queue's pass (allocations/queue.py) reclaims for a waiting request; a fixed-window create
(services.reservation_create) reclaims ahead of its window with make_room. Each notice records the request it
was given for (`preempted_for`).

A notice is withdrawn (call_off_needless) when that request no longer needs the GPUs before they are taken:
it ended without them (cancelled, failed, released, deleted) or was placed on other GPUs. Its grants are
given back their old end, if nothing else holds those GPUs by then, and its holders are told once. One the
queue has promised to another waiting request that could have taken it itself stands for that request
from then on: its reason names that request's team, and an event says why it changed. The
queue's pass runs it for its pool (after every release, cancel and create), and the sweep before it takes
any GPUs back.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils.translation import gettext_noop

from allocations import booking, notices, quotas, selectors
from allocations.messages import Msg
from allocations.models import QueueEntry, Reservation
from allocations.transitions import record
from common import sql
from common.errors import Conflict, instant
from inventory.models import GpuPool


def earliest_takeback(now: datetime) -> datetime:
    """The soonest GPUs can be taken back from anyone: a full notice from now."""
    return now + settings.PREEMPTION_NOTICE


def candidates(pool_id: int, at: datetime) -> list[Reservation]:
    """Live bookings of the pool that some request may take back at `at` (borrowed, or of a preemptible
    class), still holding GPUs then, not under a notice already, and old enough (the module's rule), in
    the order they are tried (for_request filters them per request)."""
    found = list(Reservation.objects.filter(
        Q(borrowed_ge__gt=0) | Q(preemptible=True), pool_id=pool_id, state__in=Reservation.LIVE_STATES,
        preempt_at__isnull=True, ends_at__gt=at,
        starts_at__lte=at - settings.PREEMPTION_NOTICE - settings.PREEMPTION_MIN_RUNTIME,
    ).select_related("team", "pool", "requested_by"))
    # Borrowed first, then the lowest priority, then the youngest (Kueue's order of preemption candidates).
    found.sort(key=lambda r: (r.borrowed_ge <= 0, r.priority, -r.starts_at.timestamp(), -r.pk))
    return found


def may_take(victim: Reservation, *, team_id: int, priority: int) -> bool:
    """Whether a request of team `team_id` at `priority`, within its quota, may take `victim` back."""
    if victim.team_id == team_id:
        return False  # a team's own bookings are its own to release
    return victim.borrowed_ge > 0 or (victim.preemptible and victim.priority < priority)


def for_request(found: Sequence[Reservation], *, team_id: int, priority: int) -> list[Reservation]:
    return [r for r in found if may_take(r, team_id=team_id, priority=priority)]


def choose(found: Sequence[Reservation], fits: Callable[[set[int]], bool]) -> list[Reservation]:
    """The victims among `found` (in the order they are tried): the first that makes `fits({its id})` true
    alone; else the first ones that together make `fits(their ids)` true, less any the room does not need
    after all (dropped from the end of the order back); [] when even all of them do not."""
    for victim in found:
        if fits({victim.pk}):
            return [victim]
    taken: list[Reservation] = []
    for victim in found:
        taken.append(victim)
        if fits({r.pk for r in taken}):
            break
    else:
        return []
    for victim in reversed(list(taken)):
        rest = [r for r in taken if r.pk != victim.pk]
        if rest and fits({r.pk for r in rest}):
            taken = rest
    return taken


def _when(at: datetime, now: datetime) -> str:
    """The take-back time as a mail's subject says it: the hour today, the date and hour further off."""
    return f"{at:%H:%M}" if at - now < timedelta(hours=12) else f"{at:%Y-%m-%d %H:%M}"


def give_notice(victims: Sequence[Reservation], *, at: datetime, team_words: str, priority: int,
                window_start: datetime | None = None, beneficiary_id: int | None, now: datetime) -> None:
    """Tell each victim its GPUs are taken back at `at`, why, and for which team (`team_words`; a request
    at `priority`; `window_start`: for a booking that starts then, else for a request waiting in the
    queue), and cut its grants to end then. `beneficiary_id`: the request they are taken for (None only
    while a fixed window's row is not written yet: its create sets it with for_request_of before it commits)."""
    for victim in victims:
        headline, why = _notice_words(victim, at=at, team_words=team_words, priority=priority,
                                      window_start=window_start, now=now)
        # Only while it is live: a release that won the row's lock before this has ended it already (its
        # grants end earlier, which leaves the room free all the same).
        if not Reservation.objects.filter(pk=victim.pk, state__in=Reservation.LIVE_STATES).update(
                preempt_at=at, preempt_reason=why.english(), preempt_message=why.data(),
                preempted_for_id=beneficiary_id):
            continue
        # Its grants end at `at` from now on: the database guards the GPUs it hands over as any other.
        sql.execute("UPDATE allocations_allocation SET ends_at = CASE WHEN starts_at > %s THEN starts_at ELSE %s END "
                    "WHERE reservation_id = %s AND ends_at > %s",
                    [sql.db_datetime(at), sql.db_datetime(at), victim.pk, sql.db_datetime(at)])
        victim.preempt_at = at
        record(victim, from_state=victim.state, to_state=victim.state, actor=None,
               reason=Msg(gettext_noop("Reclaim notice: %(why)s"), why=why), at=now)
        notices.notify_owners(victim, headline, why, event="reservation.preempted")


def _notice_words(victim: Reservation, *, at: datetime, team_words: str, priority: int,
                  window_start: datetime | None, now: datetime) -> tuple[Msg, Msg]:
    """A notice's headline and its reason (why, and for which team), as give_notice's docstring says."""
    if window_start is None:
        whom = Msg(gettext_noop("team %(team)s, which asks within its quota"), team=team_words)
    else:
        whom = Msg(gettext_noop("a booking of team %(team)s within its quota from %(start)s"), team=team_words,
                   start=instant(window_start))
    pool = victim.pool.name
    if victim.borrowed_ge > 0:
        cause = Msg(gettext_noop("Its %(ge)s GE borrowed beyond team %(team)s's quota in pool %(pool)s are needed "
                                 "by %(whom)s."), ge=f"{victim.borrowed_ge:.2f}", team=victim.team.name, pool=pool,
                    whom=whom)
        headline = Msg(gettext_noop("Reservation #%(id)s: borrowed GPUs taken back at %(at)s UTC"), id=victim.pk,
                       at=_when(at, now))
    else:
        cause = Msg(gettext_noop("It runs at priority class %(name)s (%(value)s), which may be preempted, and its "
                                 "GPUs in pool %(pool)s are needed by %(whom)s, at the higher priority "
                                 "%(higher)s."), name=victim.priority_class, value=victim.priority,
                    pool=pool, whom=whom, higher=priority)
        headline = Msg(gettext_noop("Reservation #%(id)s: preempted at %(at)s UTC for a higher priority"),
                       id=victim.pk, at=_when(at, now))
    if victim.requeue:
        then = Msg(gettext_noop("They are taken back at %(at)s and it waits in the queue again for the rest of its "
                                "time."), at=instant(at))
    else:
        then = Msg(gettext_noop("They are taken back at %(at)s."), at=instant(at))
    return headline, Msg(gettext_noop("%(cause)s %(then)s"), cause=cause, then=then)


def make_room(*, pool, team_id: int, team_words: str, priority: int, quota: quotas.QuotaLimits,
              shape: booking.Shape, start: datetime, end: datetime, promised: Sequence[booking.Grant],
              team_promised: Sequence[quotas.Window], asked, now: datetime) -> list[Reservation]:
    """For a fixed window [start, end) that does not fit: give notice to the victims whose GPUs let it fit
    within its team's quota (and around what the queue was promised), timed to end at its start. Only for
    a window that opens a full notice from now or later (a notice is never shorter). Returns the victims it
    gave notice ([]: none; the caller books again on the snapshot read anew, then names its booking as the
    notices' beneficiary with for_request_of). Refuses (Conflict) a window that would go over the team's
    monthly budget before anything is taken."""
    if start < earliest_takeback(now):
        return []
    found = for_request(candidates(pool.pk, start), team_id=team_id, priority=priority)
    if not found:
        return []
    snapshot = booking.pool_snapshot(pool.pk, start, end)
    in_pool = [*selectors.team_windows(team_id, pool.pk, start, end), *team_promised]
    everywhere = ([*selectors.team_windows(team_id, None, start, end), *team_promised]
                  if quota.team_max_ge is not None else [])
    inside = [g for g in promised if g.starts_at < end and g.ends_at > start]
    chosen_ge: dict[frozenset, float] = {}

    def fits(without: set[int]) -> bool:
        grants = (*(g for g in snapshot.grants if g.reservation_id not in without), *inside)
        try:
            chosen = booking.choose(booking.PoolSnapshot(start=start, end=end, gpus=snapshot.gpus, grants=grants,
                                                         profile=snapshot.profile),
                                    shape, policy=pool.placement_policy)
        except booking.BookingRefused:
            return False
        ge = sum(g.ge for g in chosen)
        chosen_ge[frozenset(without)] = ge
        return quotas.held_error(quota, ge=ge, asked="", field="", start=start, end=end, in_pool=in_pool,
                                 everywhere=everywhere) is None

    victims = choose(found, fits)
    if not victims:
        return []
    quotas.check_month_budget(quota, ge=chosen_ge[frozenset(r.pk for r in victims)], asked=asked, start=start,
                              end=end)
    # The window's own row is written only once it is booked on the GPUs these free: for_request_of names it.
    give_notice(victims, at=start, team_words=team_words, priority=priority, window_start=start, beneficiary_id=None,
                now=now)
    return victims


def for_request_of(victims: Sequence[Reservation], beneficiary_id: int) -> None:
    """Record that the notices make_room just gave (in the same transaction) are for `beneficiary_id`."""
    Reservation.objects.filter(pk__in=[v.pk for v in victims], preempt_at__isnull=False).update(
        preempted_for_id=beneficiary_id)


# --- calling a notice off -----------------------------------------------------------------------------

# A live booking under a notice (queue.kick and the backstop pass such a pool too).
NOTICE_STANDS = Q(state__in=Reservation.LIVE_STATES, preempt_at__isnull=False)


def has_notices(pool_id: int) -> bool:
    """Whether a live booking of the pool is under a notice."""
    return Reservation.objects.filter(NOTICE_STANDS, pool_id=pool_id).exists()


def call_off_needless(pool_id: int, now: datetime) -> int:
    """Withdraw the pool's notices whose request no longer needs the GPUs: it ended without them
    (cancelled, failed, released, deleted) or holds grants that use none of the victim's GPUs from the
    notice's end on (placed elsewhere). A notice that has run out but was not carried out yet is judged
    the same: the sweep runs this before it takes GPUs back. Under the pool's lock (taken here; the pass
    and the sweep hold it already), so two callers never withdraw one notice twice. Returns how many it
    withdrew."""
    if not has_notices(pool_id):
        return 0  # most passes: no notice in the pool, one cheap query
    list(GpuPool.objects.select_for_update().filter(pk=pool_id).values_list("pk", flat=True))
    noticed = list(Reservation.objects.select_for_update(of=("self",))
                   .select_related("team", "pool", "requested_by", "preempted_for__team")
                   .filter(NOTICE_STANDS, pool_id=pool_id).order_by("pk"))
    promises: list[_Promise] | None = None
    withdrawn = 0
    for victim in noticed:
        why = _needless_because(victim)
        if why is None:
            continue
        held = list(victim.allocations.filter(ends_at=victim.preempt_at, starts_at__lt=victim.preempt_at))
        gpu_ids = {grant.gpu_id for grant in held}
        if promises is None:
            promises = _promises(pool_id)
        # The last pass may have promised a waiting request those GPUs from the notice's end (they were free
        # in its plan then). One that could have taken them itself keeps the notice: withdrawn, its promise
        # would move later, which only a request ordered ahead or lost capacity may do (allocations/queue.py).
        kept_for = next((promise for promise in promises
                         if promise.gpus & gpu_ids and promise.start < victim.ends_at
                         and promise.end > victim.preempt_at
                         and may_take(victim, team_id=promise.team_id, priority=promise.priority)), None)
        if kept_for is not None:
            _stand_for(victim, kept_for, why, now=now)
            continue
        if not _give_back_grants(victim, held):
            continue
        _withdraw(victim, why, now=now)
        withdrawn += 1
    return withdrawn


def _needless_because(victim: Reservation) -> Msg | None:
    """Why the request `victim`'s notice was given for no longer needs its GPUs, or None while it does."""
    beneficiary = victim.preempted_for
    if beneficiary is None:
        # Unknown: a notice given before notices recorded their request (migration 0019), or one whose request
        # staff deleted. It stands: withdrawing every such notice on the first pass after an upgrade would
        # hand GPUs back that a waiting request may still need.
        return None
    if beneficiary.state == Reservation.State.PENDING:
        return None  # still waiting for them
    team = beneficiary.team.name
    if beneficiary.state not in Reservation.LIVE_STATES:
        return Msg(gettext_noop("the request of team %(team)s that it was given for has ended without needing them"),
                   team=team)
    # The GPUs it holds up to the notice's end, not those a failover moved it off before then.
    freed = victim.allocations.filter(ends_at__gte=victim.preempt_at).values("gpu_id")
    if beneficiary.allocations.filter(gpu_id__in=freed, ends_at__gt=victim.preempt_at).exists():
        return None  # booked on them from the notice's end
    return Msg(gettext_noop("the request of team %(team)s that it was given for was placed on other GPUs"),
               team=team)


@dataclass(frozen=True)
class _Promise:
    """What the last pass promised a waiting request: its GPUs over [start, end)."""

    reservation_id: int
    team_id: int
    team_words: str
    priority: int
    start: datetime
    end: datetime
    gpus: frozenset[int]


def _promises(pool_id: int) -> list[_Promise]:
    """What the last pass promised each waiting request of the pool, in the queue's order."""
    return [_Promise(reservation_id=pk, team_id=team_id, team_words=name or slug, priority=priority, start=start_by,
                     end=start_by + duration, gpus=frozenset(gpus or ()))
            for pk, team_id, name, slug, priority, start_by, duration, gpus in QueueEntry.objects.filter(
                reservation__pool_id=pool_id, reservation__state=Reservation.State.PENDING, start_by__isnull=False,
            ).order_by(F("position").asc(nulls_last=True), "pk").values_list(
                "pk", "reservation__team_id", "reservation__team__name", "reservation__team__slug", "priority",
                "start_by", "duration", "planned_gpus")]


def _stand_for(victim: Reservation, promise: _Promise, was: Msg, *, now: datetime) -> None:
    """Let the victim's notice stand for the request `promise` was made to, whose team its reason names from
    now on (never the person), and record the change and why (`was`: why its first request needs it no more).
    The time it is taken back does not change: its holders are not mailed again."""
    _headline, why = _notice_words(victim, at=victim.preempt_at, team_words=promise.team_words,
                                   priority=promise.priority, window_start=None, now=now)
    Reservation.objects.filter(pk=victim.pk).update(preempt_reason=why.english(), preempt_message=why.data(),
                                                    preempted_for_id=promise.reservation_id)
    record(victim, from_state=victim.state, to_state=victim.state, actor=None,
           reason=Msg(gettext_noop("Reclaim notice kept for another request (%(was)s): %(why)s"), was=was, why=why),
           at=now)


def _give_back_grants(victim: Reservation, held: Sequence) -> bool:
    """Let the grants the notice cut (`held`) run to the victim's own end again, when nothing else holds
    those GPUs (or those parts of them) by then and its team may hold them again. Whether it did."""
    if not held:
        return True  # nothing was cut (it held nothing beyond the notice's end)
    at, end = victim.preempt_at, victim.ends_at
    # Its team may have booked more since, counting on losing these (its quota and its monthly budget no
    # longer counted them): what comes back must fit as a booking would, or the notice stands. A borrowed
    # booking may borrow again as far as the pool still lends.
    limits = quotas.limits_for(team=victim.team, pool=victim.pool)
    if limits is not None:
        try:
            quotas.check(limits, ge=sum(a.ge for a in held), asked="", field="", start=at, end=end,
                         exclude_reservation=victim.pk, may_borrow=victim.borrowed_ge > 0)
        except Conflict:
            return False
    own = [booking.NewGrant(gpu_id=a.gpu_id, ge=a.ge, mode=a.mode, share_from=a.share_from, share_to=a.share_to,
                            milli=a.milli, mig_profile=a.mig_profile, mig_start=a.mig_start, memory_mib=a.memory_mib,
                            cores_pct=a.cores_pct) for a in held]
    # The rule placement books by (as an extension checks its extra time): a booking made on the GPUs the
    # notice freed keeps them, and the notice stands.
    if booking.first_clash(booking.pool_snapshot(victim.pool_id, at, end, without_reservation=victim.pk), own):
        return False
    try:
        # The database's exclusion constraint guards the same on PostgreSQL: if it refuses, the notice stands
        # and nothing of this attempt is kept.
        with transaction.atomic():
            victim.allocations.filter(pk__in=[a.pk for a in held]).update(ends_at=end)
    except IntegrityError:
        return False
    return True


def _withdraw(victim: Reservation, why: Msg, *, now: datetime) -> None:
    """Clear the victim's notice, record why in its history, and tell its holders once."""
    Reservation.objects.filter(pk=victim.pk).update(preempt_at=None, preempt_reason="", preempt_message=None,
                                                    preempted_for=None)
    reason = Msg(gettext_noop("Its GPUs in pool %(pool)s are not taken back after all, and it keeps them until "
                              "%(end)s: %(why)s."), pool=victim.pool.name, end=instant(victim.ends_at), why=why)
    victim.preempt_at = None
    record(victim, from_state=victim.state, to_state=victim.state, actor=None,
           reason=Msg(gettext_noop("Reclaim notice withdrawn: %(why)s"), why=reason), at=now)
    notices.notify_owners(victim, Msg(gettext_noop("Reservation #%(id)s: GPUs no longer taken back"), id=victim.pk),
                          reason, event="reservation.notice_withdrawn")
