"""What to offer when a fixed window does not fit: each offer is a request body that would book now.

1. `earliest_window`: the same amount, the earliest window of the same length that fits (from now);
2. `smaller`: the largest amount of the same kind that fits in the window asked;
3. `other_pool`: the same request in another pool of the same sharing mode where the team has a
   quota and it fits for the window; whole GPUs are converted through the model weights (2 × A100
   at 0.6 GE asks 2 × 0.6 / 1.0 → 2 H100 at 1.0, rounded up), shares keep their count.

Each offer is checked the way the create checks it (the same choose, around the queue's promises,
and the team's quota), read under the lock the create holds on the asked pool; another pool is
read without its lock, so an offer there may be taken by the time it is accepted (the create then
refuses as usual).
"""
from __future__ import annotations

import dataclasses
import math
from datetime import datetime, timedelta

from django.conf import settings

from django.utils.translation import gettext as _

from allocations import booking, queue, quotas, shapes
from allocations.models import Quota
from common.errors import ApplicationError, instant
from inventory.models import GpuPool
from inventory.sharing import REPLICA_MODES, SharingMode
from teams.models import Team

MAX_OTHER_POOLS = 5


def earliest_window(*, pool: GpuPool, request: shapes.Amounts, quota: quotas.QuotaLimits, team: Team,
                    earliest: datetime, duration: timedelta, now: datetime, promised: list[booking.Grant],
                    latest: datetime | None = None) -> datetime | None:
    """The first start at or after `earliest` (and at most `latest`) where the request fits for
    `duration` around the bookings and the queue's promises, within the team's quota."""
    horizon = now + settings.RESERVATION_MAX_LEAD
    latest = min(horizon, latest) if latest else horizon
    snapshot = booking.pool_snapshot(pool.pk, earliest, latest + duration)
    shape = shapes.shape_for(pool, request, snapshot)
    start, _grants, _why = queue.earliest_fit(
        gpus=snapshot.gpus, grants=[*snapshot.grants, *promised], shape=shape, duration=duration, earliest=earliest,
        latest=latest, policy=pool.placement_policy, team=queue.team_holding(quota, earliest, latest + duration),
        profile=snapshot.profile)
    return start


def _amount_field(shape: booking.Shape) -> str:
    return shapes.AMOUNT_FIELD[shape.mode]


def _amount(shape: booking.Shape) -> int:
    if shape.mode in REPLICA_MODES:
        return shape.shares
    if shape.mode == SharingMode.MIG:
        return shape.mig_count
    return shape.gpus


def _with_amount(shape: booking.Shape, amount: int) -> booking.Shape:
    if shape.mode in REPLICA_MODES:
        return dataclasses.replace(shape, shares=amount)
    if shape.mode == SharingMode.MIG:
        return dataclasses.replace(shape, mig_count=amount)
    return dataclasses.replace(shape, gpus=amount)


def _fits(snapshot: booking.PoolSnapshot, shape: booking.Shape, pool: GpuPool, team: queue.TeamHolding) -> bool:
    try:
        grants = booking.choose(snapshot, shape, policy=pool.placement_policy)
    except booking.BookingRefused:
        return False
    return quotas.held_error(team.quota, ge=sum(g.ge for g in grants), asked="", field="", start=snapshot.start,
                             end=snapshot.end, in_pool=team.in_pool, everywhere=team.everywhere) is None


def _body(team: Team, pool: GpuPool, request: shapes.Amounts, start: datetime, end: datetime, **amounts) -> dict:
    """An offer's request body: the request as asked (its amounts and the models it accepts), moved."""
    models = getattr(request, "gpu_models", None)
    return {"team": team.slug, "pool": pool.slug, **request.amounts(), **amounts,
            **({"gpu_models": sorted(models)} if models else {}),
            "starts_at": start.isoformat(), "ends_at": end.isoformat()}


def offers(*, team: Team, pool: GpuPool, request: shapes.Amounts, quota: quotas.QuotaLimits, starts_at: datetime,
           ends_at: datetime, now: datetime, promised: list[booking.Grant]) -> list[dict]:
    """The alternatives to a refused [starts_at, ends_at) in `pool` (the caller holds its lock)."""
    found: list[dict] = []
    duration = ends_at - starts_at
    start = earliest_window(pool=pool, request=request, quota=quota, team=team, earliest=now, duration=duration,
                            now=now, promised=promised)
    if start is not None and start != starts_at:
        found.append({"kind": "earliest_window", "message": _("The same from %(start)s.") % {"start": instant(start)},
                      "request": _body(team, pool, request, start, start + duration)})
    snapshot = booking.pool_snapshot(pool.pk, starts_at, ends_at)
    shape = shapes.shape_for(pool, request, snapshot)
    around = queue.with_promised(snapshot, promised)
    holding = queue.team_holding(quota, starts_at, ends_at)
    asked = _amount(shape)
    most = min(asked - 1, booking.room(around, shape).most_together)
    for amount in range(most, 0, -1):
        smaller = _with_amount(shape, amount)
        if _fits(around, smaller, pool, holding):
            found.append({"kind": "smaller",
                          "message": _("%(asked)s for the same window.") % {"asked": smaller.in_words()},
                          "request": _body(team, pool, request, starts_at, ends_at,
                                           **{_amount_field(shape): amount})})
            break
    found.extend(_other_pools(team=team, pool=pool, request=request, shape=shape, snapshot=snapshot,
                              starts_at=starts_at, ends_at=ends_at, now=now))
    return found


def _mean_weight(snapshot: booking.PoolSnapshot) -> float:
    usable = [gpu.weight for gpu in snapshot.gpus if gpu.usable] or [1.0]
    return sum(usable) / len(usable)


def _other_pools(*, team: Team, pool: GpuPool, request: shapes.Amounts, shape: booking.Shape,
                 snapshot: booking.PoolSnapshot, starts_at: datetime, ends_at: datetime, now: datetime) -> list[dict]:
    found = []
    others = (Quota.objects.filter(team=team, pool__sharing_mode=pool.sharing_mode).exclude(pool=pool)
              .select_related("pool").order_by("pool__slug")[:MAX_OTHER_POOLS])
    for other in others:
        there = booking.pool_snapshot(other.pool_id, starts_at, ends_at)
        if not there.gpus:
            continue
        amounts = {}
        if shape.mode == SharingMode.EXCLUSIVE:
            # The same GE: whole GPUs converted through the mean weight of each pool's usable GPUs (of the models
            # the request accepts: a pool without them refuses it below).
            amounts["gpus"] = max(1, math.ceil(shape.gpus * _mean_weight(snapshot.of_models(shape.gpu_models))
                                               / _mean_weight(there.of_models(shape.gpu_models)) - 1e-9))
        converted = dataclasses.replace(request, **amounts) if amounts else request
        limits = quotas.QuotaLimits.of(team_id=team.pk, team_slug=team.slug, pool_id=other.pool_id,
                                       pool_slug=other.pool.slug, team_name=team.name, pool_name=other.pool.name,
                                       max_ge=other.max_ge,
                                       ge_hours_per_month=other.ge_hours_per_month, team_max_ge=team.max_ge)
        try:
            other_shape = shapes.shape_for(other.pool, converted, there)
            promised = queue.promised_grants(other.pool_id, now)
        except ApplicationError:
            continue
        around = queue.with_promised(there, promised)
        if _fits(around, other_shape, other.pool, queue.team_holding(limits, starts_at, ends_at)):
            found.append({"kind": "other_pool",
                          "message": _("%(asked)s in pool %(pool)s.") % {"asked": other_shape.in_words(),
                                                                        "pool": other.pool.name},
                          "request": _body(team, other.pool, converted, starts_at, ends_at)})
    return found
