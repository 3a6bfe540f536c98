"""The pool's queue: requests that wait for room, the plan that promises each a start, and the pass
that starts them.

A request may ask for a shape and a duration, to start as soon as it fits. If it does not fit
now it waits (`pending`, with a QueueEntry). A scheduling pass, under the same pool lock as a
create, orders the waiting requests by the pool's ordering (fcfs, sjf, priority, fair share) and
plans them one after the other on the pool's bookings as they are booked: each gets the earliest
start where booking.choose finds room for its whole duration and its team stays within quota,
and what it would hold there is added to the plan before the next one is planned. This is
conservative backfill: a later request starts now only where it takes nothing a request ahead
of it was planned on, so nobody ahead is delayed. Without backfill a request never starts
before one ahead of it.

The plan's start is the **promise** (`start_by`): it holds if every booking runs to its booked
end, and only a request ordered ahead later (a higher priority, a smaller fair share) or lost
capacity (a failover) can move it. New fixed-window bookings and extensions see the plan's
holdings as taken, so they cannot break it. The **estimate** (`likely_start`) is the same plan
with each booking ending when the pool's bookings usually end: the conditional median of how
much of their booked window the pool's ended bookings really used, given what this one has
already run.

The pass runs after every event that frees capacity or adds a waiting request (`kick`,
coalesced) and periodically as a backstop (the sweep).
"""
from __future__ import annotations

import bisect
import dataclasses
import logging
import math
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext_noop

from allocations import booking, notices, quotas, selectors
from allocations.messages import Msg, json_param, msg_of, stored, stored_reason
from allocations.models import QueueEntry, Quota, Reservation
from allocations.placement.queueing import ORDERINGS, QueuedItem, order_queue
from allocations.transitions import move, record
from common import dispatch, sql
from common.dispatch import enqueue_after_commit
from common.errors import Conflict, instant
from inventory.models import GpuPool
from inventory.sharing import SharingMode

log = logging.getLogger(__name__)
State = Reservation.State

# Why a request waits, by the code the plan gives (the engine's where it has one), in words.
REASONS = {
    "not_enough": gettext_noop("Not enough of the pool is free for it now."),
    "fragmented": gettext_noop("Enough is free in total, but not together on one GPU or node."),
    "over_quota": gettext_noop("Its team would go over its quota in the pool."),
    "held_for_queue": gettext_noop("What is free now is promised to requests ahead of it in the queue."),
    "behind": gettext_noop("Requests ahead of it start first: this pool's queue keeps strict order."),
    "not_before": gettext_noop("It asked not to start before its not_before time."),
    "no_model": gettext_noop("No usable GPU in the pool can take it now (unhealthy or drained)."),
    "no_start": gettext_noop("No start fits within the booking horizon, even if every booking ends on time."),
}
_ENGINE_CODES = {"insufficient_capacity": "not_enough", "no_gpu_model": "no_model", "too_large": "not_enough",
                 "mig_fragmented": "fragmented", "cpu_memory": "not_enough"}


def reason_words(code: str) -> Msg:
    """Why a request waits, for its code (str() of it: in the active language)."""
    return Msg(REASONS.get(code, gettext_noop("It does not fit now.")))


# --- durations ---------------------------------------------------------------------------------

_SHORT = re.compile(r"^\s*(?:(\d+)d)?\s*(?:(\d+)h)?\s*(?:(\d+)m)?\s*(?:(\d+)s)?\s*$")
_ISO = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?$")


def parse_duration(text: str) -> timedelta | None:
    """'4h', '30m', '1d12h', '90s' or an ISO 8601 duration of days, hours, minutes and seconds
    ('PT4H', 'P1DT2H'); None when it is neither."""
    text = str(text).strip()
    match = _ISO.match(text.upper()) if text.upper().startswith("P") else _SHORT.match(text.lower())
    if not match or not any(match.groups()) or text.upper() in ("P", "PT"):
        return None
    days, hours, minutes, seconds = (int(group or 0) for group in match.groups())
    return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)


# --- the plan (no database) ----------------------------------------------------------------------

@dataclass(frozen=True)
class Waiting:
    """A waiting request as the plan sees it."""

    reservation_id: int
    team_id: int
    shape: booking.Shape
    duration: timedelta
    queued_at: datetime
    not_before: datetime | None = None
    not_after: datetime | None = None
    priority: int = 0


@dataclass
class TeamHolding:
    """A team's quota in the pool and what it holds (its grants' windows, then the plan's), in GE."""

    quota: quotas.QuotaLimits
    in_pool: list[quotas.Window]
    everywhere: list[quotas.Window]


@dataclass(frozen=True)
class Planned:
    """Where the plan puts a waiting request: its start (None: nowhere before its not_after or the
    horizon) and the grants it would get there; `reason` says why it does not start now ('' if it does)."""

    waiting: Waiting
    start: datetime | None
    grants: tuple[booking.NewGrant, ...]
    reason: str

    def starts_now(self, now: datetime) -> bool:
        return self.start is not None and self.start <= now


def _overlapping(grants: Sequence[booking.Grant], start: datetime, end: datetime) -> tuple[booking.Grant, ...]:
    return tuple(g for g in grants if g.starts_at < end and g.ends_at > start and g.ends_at > g.starts_at)


def _whole_gpus_short(gpus: Sequence[booking.PoolGpu], grants: Sequence[booking.Grant], count: int,
                      start: datetime, end: datetime) -> str:
    """Why `count` whole GPUs cannot be free for [start, end) ('' when they could): on one node when one
    node has that many usable GPUs, else in total (booking.choose_whole_gpus's rule). Counted in plain
    Python so the plan runs the engine only at starts where it can succeed: a pass tries many starts,
    and each choose builds the pool's arrays anew (12 ms for 400 GPUs here, 2 ms for this)."""
    busy = {g.gpu_id for g in grants if g.starts_at < end and g.ends_at > start and g.ends_at > g.starts_at}
    usable: dict[int, int] = defaultdict(int)
    free: dict[int, int] = defaultdict(int)
    for gpu in gpus:
        if gpu.usable:
            usable[gpu.node_id] += 1
            free[gpu.node_id] += gpu.id not in busy
    if sum(free.values()) < count:
        return "not_enough"
    if count <= max(usable.values(), default=0) and max(free.values(), default=0) < count:
        return "fragmented"
    return ""


def _try(gpus, grants, shape, start, end, policy) -> tuple[list[booking.NewGrant] | None, str]:
    short = _whole_gpus_short(gpus, grants, shape.gpus, start, end) if shape.mode == SharingMode.EXCLUSIVE else ""
    if short:
        return None, short
    snapshot = booking.PoolSnapshot(start=start, end=end, gpus=gpus, grants=_overlapping(grants, start, end))
    try:
        return booking.choose(snapshot, shape, policy=policy), ""
    except booking.BookingRefused as refused:
        return None, _ENGINE_CODES.get(refused.code, refused.code)


def earliest_fit(*, gpus: Sequence[booking.PoolGpu], grants: Sequence[booking.Grant], shape: booking.Shape,
                 duration: timedelta, earliest: datetime, latest: datetime, policy: str,
                 team: TeamHolding | None = None, borrow_at: datetime | None = None
                 ) -> tuple[datetime | None, list[booking.NewGrant], str]:
    """The first start in [earliest, latest] where `shape` fits for `duration` among `grants` (and the
    team stays within its quota, or borrows within its limit when it starts at `borrow_at`: now), the
    grants it gets there, and why it did not fit at `earliest` ('' when it did). Room only grows where
    a grant ends, so those are the only starts to try."""
    candidates = {earliest}
    candidates.update(g.ends_at for g in grants if earliest < g.ends_at <= latest)
    if team is not None:
        candidates.update(end for _, end, _ in team.in_pool if earliest < end <= latest)
        candidates.update(end for _, end, _ in team.everywhere if earliest < end <= latest)
    first_reason = ""
    for start in sorted(candidates):
        end = start + duration
        chosen, reason = _try(gpus, grants, shape, start, end, policy)
        if chosen is not None and team is not None:
            error = quotas.held_error(team.quota, ge=sum(g.ge for g in chosen), asked=shape.in_words(),
                                      field="", start=start, end=end, in_pool=team.in_pool,
                                      everywhere=team.everywhere, may_borrow=start == borrow_at)
            if error is not None:
                chosen, reason = None, "over_quota"
        if chosen is not None:
            return start, chosen, first_reason
        first_reason = first_reason or reason
    return None, [], first_reason or "no_start"


def _as_grants(reservation_id: int, chosen: Sequence[booking.NewGrant], start: datetime,
               end: datetime) -> list[booking.Grant]:
    return [booking.Grant(gpu_id=g.gpu_id, reservation_id=reservation_id, starts_at=start, ends_at=end,
                          milli=g.milli, mig_profile=g.mig_profile, mig_start=g.mig_start, mode=g.mode,
                          share_from=g.share_from, share_to=g.share_to, memory_mib=g.memory_mib,
                          cores_pct=g.cores_pct) for g in chosen]


def plan(*, gpus: Sequence[booking.PoolGpu], grants: Sequence[booking.Grant], waiting: Sequence[Waiting],
         now: datetime, horizon: datetime, policy: str, backfill: bool, teams: dict[int, TeamHolding],
         hold_for: Callable[[Waiting], timedelta] | None = None) -> list[Planned]:
    """Plan `waiting` (in queue order) one after the other, each at its earliest fit among `grants`
    and the plan's holdings of the requests before it. `hold_for` is how long a planned request
    holds what it gets (its duration unless given: the estimate shortens it). `teams` is updated
    with the plan's holdings."""
    taken = list(grants)
    latest_planned = now
    planned: list[Planned] = []
    for item in waiting:
        earliest = max(now, item.not_before or now)
        if not backfill:
            earliest = max(earliest, latest_planned)  # strict order: never before one ahead of it
        latest = min(horizon, item.not_after) if item.not_after else horizon
        team = teams.get(item.team_id)
        start, chosen, reason = earliest_fit(gpus=gpus, grants=taken, shape=item.shape, duration=item.duration,
                                             earliest=earliest, latest=latest, policy=policy, team=team)
        if start is not None and start > now:
            reason = _why_later(item, now, reason, gpus, grants, policy, backfill, earliest)
        elif start is None:
            reason = reason or "no_start"
        if start is not None:
            end = start + (hold_for(item) if hold_for else item.duration)
            taken.extend(_as_grants(item.reservation_id, chosen, start, end))
            ge = sum(g.ge for g in chosen)
            if team is not None:
                team.in_pool.append((start, end, ge))
                team.everywhere.append((start, end, ge))
            latest_planned = max(latest_planned, start)
        planned.append(Planned(waiting=item, start=start, grants=tuple(chosen), reason=reason))
    return _borrow_idle(planned, taken, gpus=gpus, now=now, policy=policy, teams=teams, hold_for=hold_for)


def _borrow_idle(planned: list[Planned], taken: list[booking.Grant], *, gpus, now: datetime, policy: str,
                 teams: dict[int, TeamHolding], hold_for) -> list[Planned]:
    """Where the pool lends idle GPUs, a request held back only by its team's quota starts now on what
    nobody's plan holds (borrowing within its team's limit): after everyone is planned without
    borrowing, so borrowing never takes room a request within its quota was planned on."""
    for index, entry in enumerate(planned):
        item, team = entry.waiting, teams.get(entry.waiting.team_id)
        if (team is None or team.quota.borrow <= 0 or entry.starts_now(now) or entry.reason != "over_quota"
                or (item.not_before and item.not_before > now)):
            continue
        others = [g for g in taken if g.reservation_id != item.reservation_id]
        start, chosen, _ = earliest_fit(gpus=gpus, grants=others, shape=item.shape, duration=item.duration,
                                        earliest=now, latest=now, policy=policy, team=team, borrow_at=now)
        if start is None:
            continue
        end = now + (hold_for(item) if hold_for else item.duration)
        taken[:] = [*others, *_as_grants(item.reservation_id, chosen, now, end)]
        team.in_pool.append((now, end, sum(g.ge for g in chosen)))
        planned[index] = Planned(waiting=item, start=now, grants=tuple(chosen), reason="")
    return planned


def _why_later(item: Waiting, now: datetime, reason: str, gpus, grants, policy, backfill, earliest) -> str:
    """The reason a request planned later than now waits, in the plan's terms."""
    if item.not_before and item.not_before > now:
        return "not_before"
    if not backfill and earliest > now:
        return "behind"
    if reason in ("not_enough", "fragmented", ""):
        # Room now among the bookings alone, but not among the plan's holdings: promised ahead.
        chosen, _ = _try(gpus, grants, item.shape, now, now + item.duration, policy)
        if chosen is not None:
            return "held_for_queue"
    return reason or "not_enough"


# --- when bookings really end (the estimate) ------------------------------------------------------

@dataclass(frozen=True)
class EarlyRelease:
    """How much of its booked window each of the pool's recent ended bookings used (0-1, ascending)."""

    used: tuple[float, ...]

    MIN_HISTORY = 10

    def expected_end(self, start: datetime, end: datetime, now: datetime) -> datetime:
        """When a booking of [start, end) is likely to end, given it runs at `now`: the median of the
        used shares above what it has run so far (the conditional median), never before now."""
        if len(self.used) < self.MIN_HISTORY or end <= start:
            return end
        ran = max(0.0, (now - start) / (end - start))
        later = self.used[bisect.bisect_right(self.used, ran):]
        if not later:
            return end
        share = later[(len(later) - 1) // 2]
        return min(end, max(now, start + (end - start) * share))

    def expected_duration(self, duration: timedelta) -> timedelta:
        if len(self.used) < self.MIN_HISTORY:
            return duration
        return duration * max(self.used[(len(self.used) - 1) // 2], 0.01)


def early_release(pool_id: int, now: datetime) -> EarlyRelease:
    """The pool's last QUEUE_HISTORY ended bookings, each as the share of its booked window it used."""
    rows = sql.fetch_all(
        "SELECT starts_at, ends_at, ended_at FROM allocations_reservation "
        "WHERE pool_id = %s AND state IN ('released', 'expired') AND ended_at IS NOT NULL AND ended_at > starts_at "
        "AND ends_at > starts_at AND ended_at <= %s ORDER BY ended_at DESC LIMIT %s",
        [pool_id, sql.db_datetime(now), settings.QUEUE_HISTORY])
    used = sorted(min(1.0, (sql.aware(ended) - sql.aware(start)) / (sql.aware(end) - sql.aware(start)))
                  for start, end, ended in rows)
    return EarlyRelease(tuple(used))


# --- reading a pool's queue -------------------------------------------------------------------------

@dataclass
class PoolQueue:
    """A locked pool with its waiting requests (in queue order) and what the plan needs to plan them."""

    pool: GpuPool
    now: datetime
    horizon: datetime
    snapshot: booking.PoolSnapshot
    waiting: list[Waiting]
    entries: dict[int, QueueEntry]
    teams: dict[int, TeamHolding]

    def promise(self) -> list[Planned]:
        return plan(gpus=self.snapshot.gpus, grants=self.snapshot.grants, waiting=self.waiting,
                    now=self.now, horizon=self.horizon, policy=self.pool.placement_policy,
                    backfill=self.pool.backfill, teams=self._fresh_teams())

    def estimate(self) -> list[Planned]:
        history = early_release(self.pool.pk, self.now)
        grants = [dataclasses.replace(g, ends_at=history.expected_end(g.starts_at, g.ends_at, self.now))
                  for g in self.snapshot.grants]
        return plan(gpus=self.snapshot.gpus, grants=grants, waiting=self.waiting, now=self.now, horizon=self.horizon,
                    policy=self.pool.placement_policy, backfill=self.pool.backfill, teams=self._fresh_teams(),
                    hold_for=lambda item: history.expected_duration(item.duration))

    def _fresh_teams(self) -> dict[int, TeamHolding]:
        return {team_id: TeamHolding(quota=t.quota, in_pool=list(t.in_pool), everywhere=list(t.everywhere))
                for team_id, t in self.teams.items()}


def shape_data(shape: booking.Shape) -> dict:
    """A Shape as its QueueEntry keeps it (JSON)."""
    data = dataclasses.asdict(shape)
    data["mig_layout"] = shape.mig_layout if isinstance(shape.mig_layout, str) else list(shape.mig_layout)
    return data


def shape_from(data: dict) -> booking.Shape:
    layout = data.get("mig_layout", ())
    return booking.Shape(**{**data, "mig_layout": layout if isinstance(layout, str) else tuple(layout)})


def read(pool_id: int, now: datetime, *, lock: bool = True) -> PoolQueue:
    """The pool (locked FOR UPDATE unless `lock` is False: the caller holds it) with its waiting requests."""
    pools = GpuPool.objects.filter(pk=pool_id)
    pool = (pools.select_for_update() if lock else pools).get()
    horizon = now + settings.RESERVATION_MAX_LEAD + settings.RESERVATION_MAX_DURATION
    pending = list(Reservation.objects.filter(pool_id=pool_id, state=State.PENDING)
                   .select_related("queue_entry", "team").order_by("pk"))
    entries = {r.pk: r.queue_entry for r in pending}
    waiting = [Waiting(reservation_id=r.pk, team_id=r.team_id, shape=shape_from(r.queue_entry.shape),
                       duration=r.queue_entry.duration, queued_at=r.queue_entry.queued_at,
                       not_before=r.queue_entry.not_before, not_after=r.queue_entry.not_after,
                       priority=r.queue_entry.priority) for r in pending]
    snapshot = booking.pool_snapshot(pool_id, now, horizon) if waiting else booking.PoolSnapshot(
        start=now, end=horizon, gpus=(), grants=())
    snapshot = _cut_at_notice(snapshot, pool_id)
    teams = _team_holdings(pool, {r.team for r in pending}, now, horizon)
    waiting = _ordered(waiting, pool, now, teams)
    return PoolQueue(pool=pool, now=now, horizon=horizon, snapshot=snapshot, waiting=waiting, entries=entries,
                     teams=teams)


def _cut_at_notice(snapshot: booking.PoolSnapshot, pool_id: int) -> booking.PoolSnapshot:
    """The snapshot with the grants of reservations under a reclaim notice ending when the notice does."""
    notice = dict(Reservation.objects.filter(pool_id=pool_id, preempt_at__isnull=False,
                                             state__in=Reservation.LIVE_STATES).values_list("pk", "preempt_at"))
    if not notice:
        return snapshot
    return dataclasses.replace(snapshot, grants=tuple(
        dataclasses.replace(g, ends_at=min(g.ends_at, max(g.starts_at, notice[g.reservation_id])))
        if g.reservation_id in notice else g for g in snapshot.grants))


def team_holding(quota: quotas.QuotaLimits, start: datetime, end: datetime) -> TeamHolding:
    """The team's quota with what it holds over [start, end): in the pool, and across pools where a
    team-wide cap makes that count."""
    return TeamHolding(
        quota=quota, in_pool=selectors.team_windows(quota.team_id, quota.pool_id, start, end),
        everywhere=(selectors.team_windows(quota.team_id, None, start, end) if quota.team_max_ge is not None else []))


def with_promised(snapshot: booking.PoolSnapshot, promised: Sequence[booking.Grant]) -> booking.PoolSnapshot:
    """The snapshot with what the plan promises (promised_grants) inside its window taken too."""
    inside = tuple(g for g in promised if g.starts_at < snapshot.end and g.ends_at > snapshot.start)
    return dataclasses.replace(snapshot, grants=(*snapshot.grants, *inside)) if inside else snapshot


def _team_holdings(pool: GpuPool, teams, now: datetime, horizon: datetime) -> dict[int, TeamHolding]:
    quotas_by_team = {q.team_id: q for q in Quota.objects.filter(pool=pool, team__in=teams)}
    held = {}
    for team in teams:
        quota = quotas_by_team.get(team.pk)
        if quota is None:
            continue  # its quota was removed while it waited: the pass fails it
        limits = quotas.QuotaLimits.of(team_id=team.pk, team_slug=team.slug, pool_id=pool.pk, pool_slug=pool.slug,
                                       team_name=team.name, pool_name=pool.name,
                                       max_ge=quota.max_ge, ge_hours_per_month=quota.ge_hours_per_month,
                                       team_max_ge=team.max_ge, borrowing=pool.borrowing,
                                       max_borrow_ge=quota.max_borrow_ge)
        held[team.pk] = team_holding(limits, now, horizon)
    return held


def _ordered(waiting: list[Waiting], pool: GpuPool, now: datetime, teams: dict[int, TeamHolding]) -> list[Waiting]:
    """`waiting` in the pool's queue order (allocations.placement.queueing.order_queue)."""
    ordering = pool.queue_ordering if pool.queue_ordering in ORDERINGS else "fcfs"
    items = [QueuedItem(key=w.reservation_id, team=str(w.team_id), submitted=w.queued_at.timestamp(),
                        duration=w.duration.total_seconds(), priority=w.priority, payload=w) for w in waiting]
    if ordering != "fairshare":
        return [item.payload for item in order_queue(items, ordering)]
    shares = fair_shares(pool.pk, now, {w.team_id: teams[w.team_id].quota.max_ge if w.team_id in teams else 1.0
                                        for w in waiting})
    return sorted(waiting, key=lambda w: (shares.get(w.team_id, 0.0), w.queued_at, w.reservation_id))


def fair_shares(pool_id: int, now: datetime, quota_ge: dict[int, float]) -> dict[int, float]:
    """Each team's decayed GE use of the pool divided by its quota: the dominant share in GE (one
    resource), past use fading with QUEUE_FAIRSHARE_HALF_LIFE. A team that held its quota all along
    has a share near 1; one that held nothing, 0. Teams with a smaller share go first."""
    tau = settings.QUEUE_FAIRSHARE_HALF_LIFE.total_seconds() / math.log(2)
    since = now - settings.QUEUE_FAIRSHARE_HALF_LIFE * 10  # older use weighs under 0.1 %
    rows = sql.fetch_all(
        "SELECT r.team_id, a.starts_at, a.ends_at, a.ge FROM allocations_allocation a "
        "JOIN allocations_reservation r ON r.id = a.reservation_id "
        "WHERE r.pool_id = %s AND a.starts_at < %s AND a.ends_at > %s AND a.ends_at > a.starts_at "
        f"AND r.team_id IN ({', '.join(['%s'] * len(quota_ge)) or 'NULL'})",
        [pool_id, sql.db_datetime(now), sql.db_datetime(since), *quota_ge])
    use: dict[int, float] = defaultdict(float)
    for team_id, start, end, ge in rows:
        start, end = max(sql.aware(start), since), min(sql.aware(end), now)
        # The average of GE held, weighted by exp(-age / tau): what this grant adds to it.
        use[team_id] += ge * (math.exp(-(now - end).total_seconds() / tau)
                              - math.exp(-(now - start).total_seconds() / tau))
    return {team_id: use[team_id] / max(ge, 1e-9) for team_id, ge in quota_ge.items()}


# --- the pass ---------------------------------------------------------------------------------------

def kick(pool_id: int) -> None:
    """Run a pass over the pool's queue after the current transaction commits, if anyone waits there.
    Coalesced: while one is queued and not yet started, more kicks add nothing."""
    if not has_waiting(pool_id):
        return

    def send() -> None:
        try:
            first = cache.add(f"queue-pass:{pool_id}", 1, timeout=settings.QUEUE_PASS_COALESCE_SECONDS)
        except Exception:  # noqa: BLE001 - the cache away: send the pass anyway; two passes are safe
            first = True
        if first:
            # Looked up on the module when called, so a stand-in for the broker (the queue benchmark's) sees it.
            dispatch.enqueue("allocations.tasks.run_queue", pool_id)

    transaction.on_commit(send)


def has_waiting(pool_id: int, *, besides: int | None = None) -> bool:
    return Reservation.objects.filter(pool_id=pool_id, state=State.PENDING).exclude(pk=besides).exists()


def pools_waiting_ids() -> list[int]:
    return list(Reservation.objects.filter(state=State.PENDING).order_by().values_list("pool_id", flat=True)
                .distinct())


@transaction.atomic
def queue_pass(*, pool_id: int, now: datetime | None = None, quiet: Sequence[int] = (),
               lock: bool = True) -> dict[str, int]:
    """One scheduling pass over the pool's queue: fail what ran out of time, start what the plan starts
    now, and write every other waiting request's position, reason, promise and estimate. `quiet`:
    reservations not to mail when they start (one placed in the call that created it). Returns counts."""
    now = now or timezone.now()
    try:
        cache.delete(f"queue-pass:{pool_id}")  # kicks from now on queue another pass
    except Exception:  # noqa: BLE001
        pass
    state = read(pool_id, now, lock=lock)
    counts = {"started": 0, "failed": 0, "waiting": 0}
    if not state.waiting:
        return counts
    locked = {r.pk: r for r in Reservation.objects.select_for_update(of=("self",)).filter(
        pk__in=[w.reservation_id for w in state.waiting], state=State.PENDING).select_related("team", "requested_by")}
    for item in list(state.waiting):
        entry, reservation = state.entries[item.reservation_id], locked.get(item.reservation_id)
        if reservation is None:
            state.waiting.remove(item)  # cancelled meanwhile
        elif item.team_id not in state.teams:
            _fail(reservation, Msg(gettext_noop("Team %(team)s no longer has a quota in pool %(pool)s."),
                                   team=reservation.team.name, pool=state.pool.name), now=now)
            state.waiting.remove(item)
            counts["failed"] += 1
        elif entry.not_after is not None and entry.not_after < now:
            _fail(reservation, Msg(gettext_noop("It could not start by its latest start, %(latest)s."),
                                   latest=instant(entry.not_after)), now=now)
            state.waiting.remove(item)
            counts["failed"] += 1
    promised = state.promise()
    started_grants: list[booking.Grant] = []
    for planned in promised:
        if not planned.starts_now(now):
            continue
        reservation = locked[planned.waiting.reservation_id]
        error = _start(reservation, planned, state, now=now, notify=reservation.pk not in quiet)
        if error:
            _fail(reservation, error, now=now)
            counts["failed"] += 1
        else:
            counts["started"] += 1
        state.waiting.remove(planned.waiting)
        started_grants.extend(_as_grants(reservation.pk, planned.grants, now, now + planned.waiting.duration))
    if counts["started"] or counts["failed"]:
        # What started now holds its grants for real; plan the rest again around them.
        # (_start added each to its team's holdings.)
        state.snapshot = dataclasses.replace(state.snapshot, grants=(*state.snapshot.grants, *started_grants))
        promised = state.promise()
    if _reclaim(state, promised, now=now):
        state.snapshot = _cut_at_notice(state.snapshot, state.pool.pk)
        promised = state.promise()
        counts["reclaiming"] = 1
    likely = {p.waiting.reservation_id: p.start for p in state.estimate()}
    for position, planned in enumerate(promised, start=1):
        reservation = locked[planned.waiting.reservation_id]
        if planned.start is None and planned.waiting.not_after is not None:
            _fail(reservation, Msg(gettext_noop(
                "It cannot start by its not_after time, even if every booking ends on time.")), now=now)
            counts["failed"] += 1
            continue
        _write_entry(state.entries[reservation.pk], reservation, planned, likely.get(reservation.pk),
                     position=position, now=now)
        counts["waiting"] += 1
    return counts


def _start(reservation: Reservation, planned: Planned, state: PoolQueue, *, now: datetime,
           notify: bool) -> Msg | None:
    """Book a waiting request from now for its duration on the plan's grants; None or why it cannot."""
    end = now + planned.waiting.duration
    ge = sum(g.ge for g in planned.grants)
    team = state.teams[reservation.team_id]
    quota = team.quota
    borrowed = quotas.beyond(quota, ge=ge, start=now, end=end, in_pool=team.in_pool)
    try:
        quotas.check_month_budget(quota, ge=ge, asked=planned.waiting.shape.in_words(), start=now, end=end)
    except Conflict as refused:
        return msg_of(refused)
    booking.grants_write(reservation_id=reservation.pk, grants=planned.grants, start=now, end=end)
    gpus = len({g.gpu_id for g in planned.grants})
    memory = planned.grants[0].memory_mib if reservation.mode == SharingMode.VGPU else reservation.gpu_memory_mib
    sql.execute("UPDATE allocations_reservation SET starts_at = %s, ends_at = %s, gpus = %s, ge = %s, "
                "gpu_memory_mib = %s, borrowed_ge = %s WHERE id = %s",
                [sql.db_datetime(now), sql.db_datetime(end), gpus, ge, memory, borrowed, reservation.pk])
    team.in_pool.append((now, end, ge))
    team.everywhere.append((now, end, ge))
    reservation.starts_at, reservation.ends_at, reservation.gpus, reservation.ge = now, end, gpus, ge
    waited = now - state.entries[reservation.pk].queued_at
    move(reservation, State.SCHEDULED, now=now,
         reason=Msg(gettext_noop("%(asked)s placed (%(ge)s GE) after waiting %(span)s."),
                    asked=planned.waiting.shape.in_words(), ge=f"{ge:.2f}", span=span(waited)))
    QueueEntry.objects.filter(pk=reservation.pk).update(position=None, reason="", reason_text="",
                                                        reason_text_message=None, planned_at=now)
    enqueue_after_commit("allocations.tasks.activate_reservation", reservation.pk)
    if notify:
        notices.notify_owners(reservation, Msg(gettext_noop("Reservation #%(id)s started"), id=reservation.pk),
                              Msg(gettext_noop("It waited %(span)s in the queue of pool %(pool)s and now holds "
                                               "%(asked)s until %(end)s."), span=span(waited), pool=state.pool.name,
                                  asked=planned.waiting.shape.in_words(), end=instant(end)),
                              event="reservation.queued_started")
    return None


def _fail(reservation: Reservation, why: Msg, *, now: datetime) -> None:
    move(reservation, State.FAILED, reason=why, now=now)
    QueueEntry.objects.filter(pk=reservation.pk).update(position=None, planned_at=now)
    notices.notify_owners(reservation, Msg(gettext_noop("Reservation #%(id)s did not start"), id=reservation.pk),
                          why, event="reservation.not_started")


def _write_entry(entry: QueueEntry, reservation: Reservation, planned: Planned, likely: datetime | None, *,
                 position: int, now: datetime) -> None:
    start_by = planned.start
    if likely is not None and start_by is not None:
        likely = min(max(likely, now), start_by)
    moved_why = stored_reason(entry, "moved_why")
    if entry.start_by is not None and start_by is not None and start_by > entry.start_by + timedelta(seconds=1):
        ahead_before = entry.position or position
        moved_why = (Msg(gettext_noop("Requests ordered ahead of it joined the queue (position %(before)s → "
                                      "%(after)s)."), before=ahead_before, after=position)
                     if position > ahead_before else
                     Msg(gettext_noop("The plan changed under it: requests ahead started sooner than planned, on GPUs "
                                      "it was planned on, or the pool lost capacity (a node or GPU failed or was "
                                      "drained).")))
        record(reservation, from_state=State.PENDING, to_state=State.PENDING, actor=None,
               reason=Msg(gettext_noop("Promised start moved from %(old)s to %(new)s: %(why)s"),
                          old=instant(entry.start_by), new=instant(start_by), why=moved_why),
               at=now)
    moved_text, moved_message = stored(moved_why)
    why_text, why_message = stored(reason_words(planned.reason))
    QueueEntry.objects.filter(pk=entry.pk).update(
        position=position, reason=planned.reason, reason_text=why_text, reason_text_message=why_message,
        previous_start_by=entry.start_by, previous_likely_start=entry.likely_start,
        start_by=start_by, likely_start=likely,
        first_start_by=entry.first_start_by or start_by, first_likely_start=entry.first_likely_start or likely,
        moved_why=moved_text, moved_why_message=moved_message, planned_at=now)
    # The reservation's window follows the plan, so lists sorted by start show it where it would run.
    start = start_by or now
    sql.execute("UPDATE allocations_reservation SET starts_at = %s, ends_at = %s, reason = %s, reason_message = %s "
                "WHERE id = %s",
                [sql.db_datetime(start), sql.db_datetime(start + entry.duration), why_text, json_param(why_message),
                 reservation.pk])


def span(delta: timedelta) -> Msg:
    """A length of time as people read it: "45 min", "3 h 20 min", "2 d 4 h" (to the nearest minute; str() of
    it: in the active language)."""
    minutes = round(abs(delta.total_seconds()) / 60)
    if minutes < 1:
        return Msg(gettext_noop("under a minute"))
    if minutes < 60:
        return Msg(gettext_noop("%(minutes)d min"), minutes=minutes)
    if minutes < 48 * 60:
        if minutes % 60:
            return Msg(gettext_noop("%(hours)d h %(minutes)02d min"), hours=minutes // 60, minutes=minutes % 60)
        return Msg(gettext_noop("%(hours)d h"), hours=minutes // 60)
    return Msg(gettext_noop("%(days)d d %(hours)d h"), days=minutes // 1440, hours=(minutes % 1440) // 60)


# --- taking borrowed GPUs back -------------------------------------------------------------------

def _reclaim(state: PoolQueue, promised: list[Planned], *, now: datetime) -> bool:
    """Give notice to borrowers whose GPUs the first waiting request within its quota needs, if reclaiming
    them lets it start when the notice ends (sooner than its plan). The victims are borrowed bookings of
    other teams that ran at least PREEMPTION_MIN_RUNTIME, the fewest and youngest that free the room.
    Returns whether it gave notice."""
    at = now + settings.PREEMPTION_NOTICE
    lenders = [r for r in Reservation.objects.filter(
        pool_id=state.pool.pk, state__in=Reservation.LIVE_STATES, borrowed_ge__gt=0, preempt_at__isnull=True,
        starts_at__lte=now - settings.PREEMPTION_MIN_RUNTIME, ends_at__gt=at).select_related("team").order_by(
        "-starts_at", "-pk")]
    if not lenders:
        return False
    ahead: list[booking.Grant] = []
    for planned in promised:
        item = planned.waiting
        team = state.teams.get(item.team_id)
        starts_anyway = planned.start is not None and planned.start <= at
        if team is not None and not starts_anyway:
            victims = _victims(state, item, team, [r for r in lenders if r.team_id != item.team_id], ahead, at)
            if victims:
                _give_notice(victims, item, state, at=at, now=now)
                return True
        if planned.start is not None:
            ahead.extend(_as_grants(item.reservation_id, planned.grants, planned.start, planned.start + item.duration))
    return False


def _victims(state: PoolQueue, item: Waiting, team: TeamHolding, lenders: list[Reservation],
             ahead: list[booking.Grant], at: datetime) -> list[Reservation]:
    """The fewest, youngest of `lenders` whose grants, taken back at `at`, let `item` start then within its
    quota (no borrowing for it), or [] when none do."""
    end = at + item.duration

    def fits(without: set[int]) -> bool:
        grants = [g for g in (*state.snapshot.grants, *ahead) if g.reservation_id not in without]
        chosen, _ = _try(state.snapshot.gpus, grants, item.shape, at, end, state.pool.placement_policy)
        return chosen is not None and quotas.held_error(
            team.quota, ge=sum(g.ge for g in chosen), asked="", field="", start=at, end=end,
            in_pool=team.in_pool, everywhere=team.everywhere) is None

    taken: list[Reservation] = []
    for lender in lenders:  # youngest first
        taken.append(lender)
        if fits({r.pk for r in taken}):
            break
    else:
        return []
    # The fewest: drop any the room does not need after all, oldest first.
    for lender in reversed(list(taken)):
        rest = [r for r in taken if r.pk != lender.pk]
        if rest and fits({r.pk for r in rest}):
            taken = rest
    return taken


def _give_notice(victims: list[Reservation], item: Waiting, state: PoolQueue, *, at: datetime,
                 now: datetime) -> None:
    waiting_team = state.teams[item.team_id].quota.team_words
    for victim in victims:
        words = dict(ge=f"{victim.borrowed_ge:.2f}", team=victim.team.name, pool=state.pool.name,
                     waiting_team=waiting_team, at=instant(at))
        if victim.requeue:
            why = Msg(gettext_noop("Its %(ge)s GE borrowed beyond team %(team)s's quota in pool %(pool)s are needed by "
                                   "team %(waiting_team)s, which asks within its quota. They are taken back at %(at)s "
                                   "and it waits in the queue again for the rest of its time."), **words)
        else:
            why = Msg(gettext_noop("Its %(ge)s GE borrowed beyond team %(team)s's quota in pool %(pool)s are needed by "
                                   "team %(waiting_team)s, which asks within its quota. They are taken back at "
                                   "%(at)s."), **words)
        Reservation.objects.filter(pk=victim.pk).update(preempt_at=at, preempt_reason=why.english(),
                                                        preempt_message=why.data())
        record(victim, from_state=victim.state, to_state=victim.state, actor=None,
               reason=Msg(gettext_noop("Reclaim notice: %(why)s"), why=why), at=now)
        notices.notify_owners(victim, Msg(gettext_noop("Reservation #%(id)s: borrowed GPUs taken back at %(at)s UTC"),
                                          id=victim.pk, at=f"{at:%H:%M}"), why, event="reservation.preempted")


# --- what creates and extensions must leave alone ---------------------------------------------------

def promised_grants(pool_id: int, now: datetime, *, without: int | None = None) -> list[booking.Grant]:
    """What the queue's plan holds in the pool from now (the caller holds the pool's lock): a new
    fixed-window booking or an extension must fit around it, so the promises stay kept."""
    if not has_waiting(pool_id, besides=without):
        return []
    state = read(pool_id, now, lock=False)
    state.waiting = [w for w in state.waiting if w.reservation_id != without]
    return [grant for planned in state.promise() if planned.start is not None
            for grant in _as_grants(planned.waiting.reservation_id, planned.grants, planned.start,
                                    planned.start + planned.waiting.duration)]
