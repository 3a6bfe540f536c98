"""The quota rules a booking must keep: a team's GE at once in a pool (its quota), across pools (its
team-wide cap), and its GE-hours per calendar month in the pool. Create, extend and the queue's
pass all check through `check`."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.utils.translation import gettext_noop

from allocations import quota_math, selectors, units
from allocations.messages import Msg, month_words, refusal
from allocations.models import Quota
from common.errors import Conflict, instant


@dataclass(frozen=True)
class QuotaLimits:
    """A team's quota in a pool (and its team-wide cap), with the slugs and the names (what its refusals
    say to people; the slug where no name was read) of the team and the pool."""

    team_id: int
    team_slug: str
    pool_id: int
    pool_slug: str
    max_ge: float
    ge_hours_per_month: float | None
    team_max_ge: float | None = None
    # GE the team may hold beyond max_ge in a booking that starts now on idle GPUs (borrowed); 0 where the
    # pool does not lend, infinite where it lends without a cap for the team.
    borrow: float = 0.0
    team_name: str = ""
    pool_name: str = ""

    @property
    def team_words(self) -> str:
        return self.team_name or self.team_slug

    @property
    def pool_words(self) -> str:
        return self.pool_name or self.pool_slug

    @classmethod
    def of(cls, *, max_ge, ge_hours_per_month, team_max_ge, borrowing: bool = False, max_borrow_ge=None,
           **names) -> QuotaLimits:
        """From the database's decimals (the checks add floats to them), with the ids and slugs in `names`.
        `borrowing`: the pool lends idle GPUs; `max_borrow_ge` the team's cap on what it borrows there."""
        borrow = 0.0 if not borrowing else (math.inf if max_borrow_ge is None else float(max_borrow_ge))
        return cls(**names, max_ge=float(max_ge),
                   ge_hours_per_month=None if ge_hours_per_month is None else float(ge_hours_per_month),
                   team_max_ge=None if team_max_ge is None else float(team_max_ge), borrow=borrow)


def limits_for(*, team, pool) -> QuotaLimits | None:
    """`team`'s quota in `pool` with its team-wide cap (None: it has none there)."""
    # order_by(): Quota's default ordering would join teams and pools for first().
    quota = Quota.objects.filter(team_id=team.pk, pool_id=pool.pk).order_by().first()
    if quota is None:
        return None
    return QuotaLimits.of(team_id=team.pk, team_slug=team.slug, team_name=team.name, pool_id=pool.pk,
                          pool_slug=pool.slug, pool_name=pool.name, max_ge=quota.max_ge,
                          ge_hours_per_month=quota.ge_hours_per_month, team_max_ge=team.max_ge,
                          borrowing=pool.borrowing, max_borrow_ge=quota.max_borrow_ge)


def headroom(quota: QuotaLimits, *, start: datetime, end: datetime, in_pool: Sequence[Window],
             everywhere: Sequence[Window] = ()) -> float:
    """GE the team may still add for all of [start, end) without going over its quota in the pool or its
    team-wide cap (held_error's arithmetic, asked the other way round; borrowing aside). Pure."""
    left = quota.max_ge - units.peak(in_pool, start, end).amount
    if quota.team_max_ge is not None:
        left = min(left, quota.team_max_ge - units.peak(everywhere, start, end).amount)
    return max(0.0, left)


def _ge(value: float) -> str:
    return f"{value:.2f}"


Window = tuple[datetime, datetime, float]


def beyond(quota: QuotaLimits, *, ge: float, start: datetime, end: datetime, in_pool: Sequence[Window]) -> float:
    """GE the team would hold beyond its quota in the pool at the peak of [start, end) with `ge` more (0: none)."""
    return max(0.0, units.peak(in_pool, start, end).amount + ge - quota.max_ge)


def held_error(quota: QuotaLimits, *, ge: float, asked: Msg | str, field: str, start: datetime, end: datetime,
               in_pool: Sequence[Window], everywhere: Sequence[Window] = (),
               may_borrow: bool = False) -> Conflict | None:
    """The refusal when the team would hold more GE than its quota in the pool at some instant of
    [start, end), or more than its team-wide cap across pools; None when it may. `in_pool` and
    `everywhere` are what it holds (selectors.team_windows: (start, end, GE) each), `ge` what the new
    grants are charged, `asked` the request in its own unit, for the message; `field` the request
    field a refusal names; `may_borrow`: a booking that starts now may go up to quota.borrow beyond the
    quota. Pure, so the queue's plan asks it of windows it has not written yet."""
    team, pool = quota.team_words, quota.pool_words
    peak, peak_at = units.peak(in_pool, start, end)
    over = peak + ge - quota.max_ge
    if over > 1e-9 and not (may_borrow and over <= quota.borrow + 1e-9):
        numbers = dict(team=team, total=_ge(peak + ge), pool=pool, quota=_ge(quota.max_ge),
                       over=_ge(peak + ge - quota.max_ge), asked=asked, ge=_ge(ge), held=_ge(peak))
        if peak:
            msg = Msg(gettext_noop("Over quota: team %(team)s would hold %(total)s GE in pool %(pool)s at %(at)s "
                                   "(quota %(quota)s, %(over)s over): %(asked)s is %(ge)s GE and it holds "
                                   "%(held)s."), at=instant(peak_at), **numbers)
        else:
            msg = Msg(gettext_noop("Over quota: team %(team)s would hold %(total)s GE in pool %(pool)s (quota "
                                   "%(quota)s, %(over)s over): %(asked)s is %(ge)s GE and it holds %(held)s."),
                      **numbers)
        return refusal(Conflict, msg, field=field, rule="quota_exceeded")
    if quota.team_max_ge is not None:
        peak, peak_at = units.peak(everywhere, start, end)
        if peak + ge > quota.team_max_ge + 1e-9:
            numbers = dict(team=team, total=_ge(peak + ge), cap=_ge(quota.team_max_ge),
                           over=_ge(peak + ge - quota.team_max_ge), asked=asked, ge=_ge(ge))
            if peak:
                msg = Msg(gettext_noop("Over the team-wide cap: team %(team)s would hold %(total)s GE across all "
                                       "pools at %(at)s (cap %(cap)s, %(over)s over): %(asked)s is %(ge)s GE."),
                          at=instant(peak_at), **numbers)
            else:
                msg = Msg(gettext_noop("Over the team-wide cap: team %(team)s would hold %(total)s GE across all "
                                       "pools (cap %(cap)s, %(over)s over): %(asked)s is %(ge)s GE."), **numbers)
            return refusal(Conflict, msg, field=field, rule="team_cap_exceeded")
    return None


def check(quota: QuotaLimits, *, ge: float, asked: Msg | str, field: str, start: datetime, end: datetime,
          exclude_reservation: int | None = None, may_borrow: bool = False, promised: Sequence[Window] = ()) -> float:
    """Refuse (Conflict) what held_error refuses, reading what the team holds, and more GE-hours in a
    calendar month than the pool's monthly budget. Returns the GE it borrows beyond the quota (0: none).
    `promised`: windows the queue promises the team's waiting requests in the pool; they count as held."""
    in_pool = selectors.team_windows(quota.team_id, quota.pool_id, start, end, exclude_reservation)
    everywhere = ([*selectors.team_windows(quota.team_id, None, start, end, exclude_reservation), *promised]
                  if quota.team_max_ge is not None else ())
    error = held_error(quota, ge=ge, asked=asked, field=field, start=start, end=end, in_pool=[*in_pool, *promised],
                       everywhere=everywhere, may_borrow=may_borrow)
    if error is not None:
        raise error
    check_month_budget(quota, ge=ge, asked=asked, start=start, end=end)
    return beyond(quota, ge=ge, start=start, end=end, in_pool=in_pool)


def check_month_budget(quota: QuotaLimits, *, ge: float, asked: Msg | str, start: datetime, end: datetime) -> None:
    """Refuse booking more GE-hours in a calendar month (UTC) than the team's monthly budget in the pool."""
    if quota.ge_hours_per_month is None:
        return
    for month in quota_math.months_between(start, end):
        # Not excluding the reservation being extended: its booked hours count, and [start, end) is
        # only the extension, which its allocations do not cover yet.
        used = selectors.month_ge_hours(quota.team_id, quota.pool_id, month)
        wanted = ge * quota_math.overlap_hours((start, end), month)
        if used + wanted > quota.ge_hours_per_month + 1e-6:
            over = used + wanted - quota.ge_hours_per_month
            raise refusal(Conflict, Msg(gettext_noop(
                "Over the monthly GE-hours of team %(team)s in pool %(pool)s for %(month)s (UTC): %(used)s booked + "
                "%(wanted)s asked (%(asked)s) > %(budget)s (%(over)s over)."), team=quota.team_words,
                pool=quota.pool_words, month=month_words(month[0]), used=f"{used:.1f}", wanted=f"{wanted:.1f}",
                asked=asked, budget=f"{quota.ge_hours_per_month:g}", over=f"{over:.1f}"),
                field="ends_at", rule="ge_hours_exceeded")
