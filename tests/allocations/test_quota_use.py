"""Quota use as the team page and the monthly GPU-hours check read it: summed by the database,
equal to adding up the allocation windows by hand. Whole GPUs of weight 1.0 here, so GE are GPUs
and GE-hours GPU-hours (tests/allocations/test_ge_use.py weighs shares, slices and models)."""
from __future__ import annotations

import pytest
from django.utils import timezone

from allocations import quota_math, selectors
from allocations.models import Allocation
from tests.allocations.test_reservation_lifecycle import reserve


def by_hand(team, pool, month):
    windows = list(Allocation.objects.filter(reservation__team=team, reservation__pool=pool)
                   .values_list("starts_at", "ends_at"))
    return windows, sum(quota_math.overlap_hours(window, month) for window in windows)


def test_quota_use_counts_held_now_and_this_months_hours_like_the_windows_do(world, api):
    client = api(world.member)
    reserve(client, gpus=2, hours=3.0)  # held now
    reserve(client, gpus=1, hours_from_now=5, hours=1.5)  # later
    cancelled = reserve(client, gpus=1, hours_from_now=8)
    client.post(f"/api/v1/reservations/{cancelled['id']}/release/")  # an empty window: no hours
    now = timezone.now()
    month = (quota_math.month_start(now), quota_math.next_month(quota_math.month_start(now)))
    [use] = [u for u in selectors.quota_use(world.team, now=now) if u.pool.slug == "a100"]
    windows, hours = by_hand(world.team, use.quota.pool, month)
    assert use.held_now == 2 == sum(1 for a, b in windows if a <= now < b)
    assert use.ge_hours_this_month == pytest.approx(hours)
    assert 0 < hours <= 2 * 3.0 + 1.5
    # The create's and the extension's monthly check reads the same sum.
    assert selectors.month_ge_hours(world.team.pk, use.quota.pool_id, month) == pytest.approx(hours)


def test_a_team_with_nothing_booked_uses_nothing(world):
    assert [(u.held_now, u.ge_hours_this_month) for u in selectors.quota_use(world.team)] == [(0, 0.0)] * len(
        selectors.quota_use(world.team))
