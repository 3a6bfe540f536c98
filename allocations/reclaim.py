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
(services.reservation_create) reclaims ahead of its window with make_room.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils.translation import gettext_noop

from allocations import booking, notices, quotas, selectors
from allocations.messages import Msg
from allocations.models import Reservation
from allocations.transitions import record
from common import sql
from common.errors import instant


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
                window_start: datetime | None = None, now: datetime) -> None:
    """Tell each victim its GPUs are taken back at `at`, why, and for which team (`team_words`; a request
    at `priority`; `window_start`: for a booking that starts then, else for a request waiting in the
    queue), and cut its grants to end then."""
    for victim in victims:
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
        why = Msg(gettext_noop("%(cause)s %(then)s"), cause=cause, then=then)
        # Only while it is live: a release that won the row's lock before this has ended it already (its
        # grants end earlier, which leaves the room free all the same).
        if not Reservation.objects.filter(pk=victim.pk, state__in=Reservation.LIVE_STATES).update(
                preempt_at=at, preempt_reason=why.english(), preempt_message=why.data()):
            continue
        # Its grants end at `at` from now on: the database guards the GPUs it hands over as any other.
        sql.execute("UPDATE allocations_allocation SET ends_at = CASE WHEN starts_at > %s THEN starts_at ELSE %s END "
                    "WHERE reservation_id = %s AND ends_at > %s",
                    [sql.db_datetime(at), sql.db_datetime(at), victim.pk, sql.db_datetime(at)])
        victim.preempt_at = at
        record(victim, from_state=victim.state, to_state=victim.state, actor=None,
               reason=Msg(gettext_noop("Reclaim notice: %(why)s"), why=why), at=now)
        notices.notify_owners(victim, headline, why, event="reservation.preempted")


def make_room(*, pool, team_id: int, team_words: str, priority: int, quota: quotas.QuotaLimits,
              shape: booking.Shape, start: datetime, end: datetime, promised: Sequence[booking.Grant],
              team_promised: Sequence[quotas.Window], asked, now: datetime) -> bool:
    """For a fixed window [start, end) that does not fit: give notice to the victims whose GPUs let it fit
    within its team's quota (and around what the queue was promised), timed to end at its start. Only for
    a window that opens a full notice from now or later (a notice is never shorter). Returns whether it
    gave notice (the caller books again on the snapshot read anew). Refuses (Conflict) a window that would
    go over the team's monthly budget before anything is taken."""
    if start < earliest_takeback(now):
        return False
    found = for_request(candidates(pool.pk, start), team_id=team_id, priority=priority)
    if not found:
        return False
    snapshot = booking.pool_snapshot(pool.pk, start, end)
    in_pool = [*selectors.team_windows(team_id, pool.pk, start, end), *team_promised]
    everywhere = ([*selectors.team_windows(team_id, None, start, end), *team_promised]
                  if quota.team_max_ge is not None else [])
    inside = [g for g in promised if g.starts_at < end and g.ends_at > start]
    chosen_ge: dict[frozenset, float] = {}

    def fits(without: set[int]) -> bool:
        grants = (*(g for g in snapshot.grants if g.reservation_id not in without), *inside)
        try:
            chosen = booking.choose(booking.PoolSnapshot(start=start, end=end, gpus=snapshot.gpus, grants=grants),
                                    shape, policy=pool.placement_policy)
        except booking.BookingRefused:
            return False
        ge = sum(g.ge for g in chosen)
        chosen_ge[frozenset(without)] = ge
        return quotas.held_error(quota, ge=ge, asked="", field="", start=start, end=end, in_pool=in_pool,
                                 everywhere=everywhere) is None

    victims = choose(found, fits)
    if not victims:
        return False
    quotas.check_month_budget(quota, ge=chosen_ge[frozenset(r.pk for r in victims)], asked=asked, start=start,
                              end=end)
    give_notice(victims, at=start, team_words=team_words, priority=priority, window_start=start, now=now)
    return True
