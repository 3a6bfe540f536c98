"""The availability timeline for a team: each slot says how many of the unit its quota (and its team-wide
cap) still allows, and a request over it does not fit there, however free the pool is."""
from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from allocations import quotas, selectors, services
from allocations.shapes import Amounts


def _book(world, gpus: int, start_hour: int, end_hour: int, team: str = "ml", actor=None):
    base = timezone.now().replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    return services.reservation_create(actor=actor or world.member, request=services.ReservationRequest(
        team=team, pool="a100", gpus=gpus, starts_at=base + timedelta(hours=start_hour),
        ends_at=base + timedelta(hours=end_hour)))


def _timeline(world, gpus: int, quota):
    start = timezone.now().replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    return selectors.availability(world.pool, start, start + timedelta(hours=4), timedelta(hours=1),
                                  Amounts(gpus=gpus), quota=quota).slots


def test_each_slot_counts_what_the_teams_quota_still_allows(world):
    _book(world, 4, 0, 2)  # ml holds 4 of its 6 GE for the first two hours
    quota = quotas.limits_for(team=world.team, pool=world.pool)
    slots = _timeline(world, 3, quota)
    assert [s.free for s in slots] == [4, 4, 8, 8]
    assert [s.quota_left for s in slots] == [2, 2, 6, 6]
    assert [s.bookable for s in slots] == [2, 2, 6, 6]
    assert [(s.over_quota, s.fits) for s in slots] == [(True, False), (True, False), (False, True), (False, True)]
    # Without a team the timeline counts the pool alone, as the API's does.
    assert [(s.quota_left, s.fits) for s in _timeline(world, 3, None)] == [(None, True)] * 4


def test_the_team_wide_cap_counts_too(world):
    world.other_team.max_ge = 3
    world.other_team.save()
    _book(world, 2, 1, 3, team="infra", actor=world.outsider)
    slots = _timeline(world, 2, quotas.limits_for(team=world.other_team, pool=world.pool))
    assert [s.quota_left for s in slots] == [3, 1, 1, 3]
    assert [s.fits for s in slots] == [True, False, False, True]


def test_a_team_without_a_quota_in_the_pool_has_none(world):
    assert quotas.limits_for(team=world.team, pool=world.other_pool) is None
