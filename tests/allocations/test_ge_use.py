"""Use in GPU-equivalents: the selectors, GET /api/v1/teams/{slug}/usage/ and the quota's figures sum
exactly what the grant rows were charged (every sharing mode), split by mode and model."""
from __future__ import annotations

import pytest
from django.utils import timezone

from allocations import selectors
from tests.allocations.grants import A100, H100, L4, by_hand, mixed_grants


@pytest.fixture
def grants(world):
    now = timezone.now()
    return now, mixed_grants(world, now)


def test_the_selectors_sum_the_charged_ge_of_every_grant_by_pool_mode_and_model(world, grants):
    now, rows = grants
    use = selectors.team_use(world.team, now=now)
    assert use.held_now == pytest.approx(by_hand(rows, world.team.pk, now)[0])
    assert use.held_now == pytest.approx(2 * 2.0 + 3 * 0.125 + 3 / 7 + 0.4)
    assert use.ge_hours_this_month == pytest.approx(by_hand(rows, world.team.pk, now)[1])
    pools = {p.pool.slug: p for p in use.pools}
    assert set(pools) == {"a100", "l4-ts", "a100-mig", "a100-vgpu"}
    for slug, pool_use in pools.items():
        held, hours = by_hand(rows, world.team.pk, now, pool=slug)
        assert (pool_use.held_now, pool_use.ge_hours_this_month) == (pytest.approx(held), pytest.approx(hours))
        for share in pool_use.breakdown:
            held, hours = by_hand(rows, world.team.pk, now, pool=slug, mode=share.mode, model=share.model)
            assert (share.held_now, share.ge_hours_this_month) == (pytest.approx(held), pytest.approx(hours))
    assert [(s.mode, s.model) for s in use.breakdown] == [
        ("exclusive", H100), ("mig", A100), ("time_slicing", L4), ("vgpu", A100)]
    assert pools["l4-ts"].held_now == pytest.approx(0.375)
    assert pools["l4-ts"].held_pct == round(100 * 0.375 / 2.5)
    # quota_use is the same figures for the pools with a quota.
    assert [(u.pool.slug, u.held_now) for u in selectors.quota_use(world.team, now=now)] == [
        (p.pool.slug, p.held_now) for p in use.pools]


def test_pools_and_the_fleet_in_ge(world, grants):
    now, rows = grants
    ge = {p.pool.slug: p for p in selectors.pools_ge(selectors.GpuPool.objects.all(), now=now)}
    assert ge["a100"].capacity == pytest.approx(8 * 2.0)  # eight H100 at weight 2
    assert ge["a100"].held_now == pytest.approx(3 * 2.0)  # ml's two and infra's one
    assert ge["l4-ts"].capacity == pytest.approx(0.5) and ge["l4-ts"].held_now == pytest.approx(0.375)
    assert ge["a100-mig"].held_now == pytest.approx(3 / 7)
    held = {(h.team, h.pool, h.mode, h.model): h.ge for h in selectors.ge_held_now(now)}
    assert held[("ml", "a100", "exclusive", H100)] == pytest.approx(4.0)
    assert held[("infra", "a100", "exclusive", H100)] == pytest.approx(2.0)
    assert sum(v for (team, *_), v in held.items() if team == "ml") == pytest.approx(
        by_hand(rows, world.team.pk, now)[0])


@pytest.mark.parametrize("who", ["owner", "member", "staff"])
def test_members_and_staff_read_a_teams_usage(world, grants, api, who):
    now, rows = grants
    response = api(getattr(world, who)).get("/api/v1/teams/ml/usage/")
    assert response.status_code == 200, response.content
    body = response.json()
    held, hours = by_hand(rows, world.team.pk, timezone.now())
    assert body["team"] == "ml" and body["max_ge"] is None
    assert body["held_now"] == pytest.approx(held)
    assert body["ge_hours_this_month"] == pytest.approx(hours, rel=1e-3)
    pools = {p["pool"]: p for p in body["pools"]}
    assert pools["l4-ts"]["max_ge"] == 2.5 and pools["l4-ts"]["ge_hours_per_month"] == 100.0
    assert pools["l4-ts"]["breakdown"] == [{"mode": "time_slicing", "model": L4, "held_now": 0.375,
                                            "ge_hours_this_month": pools["l4-ts"]["ge_hours_this_month"]}]
    assert sum(p["held_now"] for p in body["pools"]) == pytest.approx(body["held_now"])


def test_outsiders_and_strangers_get_no_usage(world, grants, api):
    assert api(world.outsider).get("/api/v1/teams/ml/usage/").status_code == 404
    assert api(world.staff).get("/api/v1/teams/nope/usage/").status_code == 404
    assert api().get("/api/v1/teams/ml/usage/").status_code == 401
    assert api(world.outsider).get("/api/v1/teams/infra/usage/").json()["held_now"] == pytest.approx(2.0)


def test_a_team_with_nothing_booked_uses_nothing_in_ge(world, api):
    body = api(world.member).get("/api/v1/teams/ml/usage/").json()
    assert (body["held_now"], body["ge_hours_this_month"]) == (0, 0)
    assert [(p["pool"], p["held_now"], p["breakdown"]) for p in body["pools"]] == [("a100", 0, [])]
