"""The pool's workload profile (allocations/profiles.py): built from its recent reservations' shapes and the
models they accept, bounded, cached per pool, and handed to the placement engine wherever booking places."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from allocations import booking, profiles, queue
from allocations.models import Reservation
from allocations.placement.api import WindowPlacer
from allocations.placement.workload import TaskKey
from tests.allocations.test_gpu_models import A100, H100, mixed  # noqa: F401 - the fixture
from tests.factories import window

URL = "/api/v1/reservations/"


def history(pool, team, user, count: int, *, gpus=1, models=(), ended=True):
    """`count` past reservations of `gpus` GPUs in `pool`, accepting `models` (written directly: the profile reads
    what was asked, not what ran)."""
    start = timezone.now() - timedelta(days=2)
    Reservation.objects.bulk_create([
        Reservation(team=team, pool=pool, requested_by=user, mode="exclusive", gpus=gpus, gpu_models=list(models),
                    starts_at=start, ends_at=start + timedelta(hours=1),
                    state="released" if ended else "scheduled") for _ in range(count)])


def test_a_pool_with_little_history_gets_the_engines_default_mix(world):
    history(world.pool, world.team, world.member, profiles.PROFILE_MIN_RESERVATIONS - 1)
    assert profiles.pool_profile(world.pool.pk) is None


def test_the_profile_counts_shapes_and_the_models_they_accept(world, mixed):
    history(mixed, world.team, world.member, 30, gpus=2, models=[H100])
    history(mixed, world.team, world.member, 10, gpus=1)
    profile = profiles.pool_profile(mixed.pk)
    counts = {(key.num_gpu, key.allowed): count for key, count in profile.task_counts.items()}
    # In thousandths of the demands: three quarters 2 × H100-only, a quarter 1 × any model.
    assert counts == {(2, frozenset({H100})): 750, (1, frozenset()): 250}
    key = next(k for k in profile.task_counts if k.num_gpu == 2)
    assert key == TaskKey(frozenset({H100}), cpu_milli=24_000, memory_mib=96_000, num_gpu=2, milli=1000)


def test_the_profile_reads_only_the_newest_reservations(world, mixed, monkeypatch):
    monkeypatch.setattr(profiles, "PROFILE_RESERVATIONS", 25)
    history(mixed, world.team, world.member, 40, gpus=4)  # older
    history(mixed, world.team, world.member, 25, gpus=1, models=[A100])  # the newest 25
    profile = profiles.pool_profile(mixed.pk)
    assert {(k.num_gpu, k.allowed) for k in profile.task_counts} == {(1, frozenset({A100}))}


def test_the_profile_is_read_once_per_pool_while_fresh_and_kept_while_the_mix_reads_the_same(
        world, mixed, monkeypatch, django_assert_num_queries):
    history(mixed, world.team, world.member, 40, gpus=2, models=[H100])
    with django_assert_num_queries(1):
        first = profiles.pool_profile(mixed.pk)
    with django_assert_num_queries(0):
        assert profiles.pool_profile(mixed.pk) is first
    clock = [1e9]
    monkeypatch.setattr(profiles.time, "monotonic", lambda: clock[0])
    profiles.forget()
    first = profiles.pool_profile(mixed.pk)
    history(mixed, world.team, world.member, 40, gpus=2, models=[H100])  # more of the same mix
    clock[0] += profiles.PROFILE_TTL_SECONDS + 1
    with django_assert_num_queries(1):
        assert profiles.pool_profile(mixed.pk) is first  # read again, the same object (the policies' caches)
    history(mixed, world.team, world.member, 80, gpus=1)
    clock[0] += profiles.PROFILE_TTL_SECONDS - 1
    assert profiles.pool_profile(mixed.pk) is first  # still fresh: the cache is not bypassed
    clock[0] += 2
    changed = profiles.pool_profile(mixed.pk)
    assert changed is not first and {k.num_gpu for k in changed.task_counts} == {1, 2}


def test_a_mix_that_drifts_a_little_keeps_its_profile_and_small_drifts_add_up(world, mixed, monkeypatch):
    """A new profile object costs the policies their per-profile work again (portal's guard: most of a second on
    a large pool) in the create that first uses it, so a few new reservations must not make one."""
    clock = [1e9]
    monkeypatch.setattr(profiles.time, "monotonic", lambda: clock[0])
    history(mixed, world.team, world.member, 100, gpus=2, models=[H100])
    first = profiles.pool_profile(mixed.pk)
    history(mixed, world.team, world.member, 4, gpus=1)  # 4 of 104: under 5 % of the mix
    clock[0] += profiles.PROFILE_TTL_SECONDS + 1
    assert profiles.pool_profile(mixed.pk) is first
    history(mixed, world.team, world.member, 3, gpus=1)  # 7 of 107 since it was built: over 5 %
    clock[0] += profiles.PROFILE_TTL_SECONDS + 1
    again = profiles.pool_profile(mixed.pk)
    assert again is not first and {k.num_gpu for k in again.task_counts} == {1, 2}


def test_drift_is_the_share_of_the_demands_that_differ():
    a, b = profiles._Demand(gpus=1), profiles._Demand(gpus=2)
    assert profiles._drift(((a, 1000),), ((a, 1000),)) == 0
    assert profiles._drift(((a, 1000),), ((b, 1000),)) == 1
    assert profiles._drift(((a, 600), (b, 400)), ((a, 500), (b, 500))) == 0.1


def test_shares_mig_and_vgpu_reservations_become_their_demands():
    demand, times = profiles._demand_of("time_slicing", 1, 3, "", 1, None, 4, ())
    assert (demand, times) == (profiles._Demand(milli=750), 1)
    assert profiles._demand_of("mps", 1, 4, "", 1, None, 4, ())[0] == profiles._Demand(gpus=1)
    assert profiles._demand_of("mig", 1, 1, "3g.40gb", 20, None, 1, (H100,)) == (
        profiles._Demand(mig_profile="3g.40gb", allowed=(H100,)), 20)
    assert profiles._demand_of("vgpu", 2, 1, "", 1, 30, 1, ()) == (profiles._Demand(milli=300), 2)
    assert profiles._Demand(mig_profile="3g.40gb").request().mig_profile == "3g.40gb"


def test_booking_hands_the_pools_profile_to_the_engine_on_create_and_in_the_queue(world, api, mixed, monkeypatch):
    history(mixed, world.team, world.member, 40, gpus=1, models=[H100])
    expected = profiles.pool_profile(mixed.pk)
    assert expected is not None
    seen = []
    real_place = booking.place

    def spy(state, request, policy, *, profile=None, **kwargs):
        seen.append(profile)
        return real_place(state, request, policy, profile=profile, **kwargs)

    monkeypatch.setattr(booking, "place", spy)
    # The queue's board places through a WindowPlacer (place() on kept arrays): it must be handed the profile too.
    real_window_place = WindowPlacer.place

    def window_spy(self, request, policy, *, profile=None):
        seen.append(profile)
        return real_window_place(self, request, policy, profile=profile)

    monkeypatch.setattr(WindowPlacer, "place", window_spy)
    start, end = window(0, 2)
    created = api(world.member).post(URL, {"pool": "mixed", "team": "ml", "gpus": 1, "gpu_models": [H100],
                                           "ends_at": end.isoformat()}, format="json")
    assert created.status_code == 201, created.content
    assert seen and all(profile is expected for profile in seen)
    # The queue's plan (a pinned request: the walk) decides with it too.
    seen.clear()
    assert api(world.outsider).post(URL, {"pool": "mixed", "team": "infra", "gpus": 4, "gpu_models": [H100],
                                          "ends_at": end.isoformat()}, format="json").status_code == 409
    assert api(world.outsider).post(URL, {"pool": "mixed", "team": "infra", "gpus": 3, "gpu_models": [H100],
                                          "ends_at": end.isoformat()}, format="json").status_code == 201
    waiting = api(world.member).post(URL, {"pool": "mixed", "team": "ml", "gpus": 2, "gpu_models": [H100],
                                           "duration": "1h"}, format="json").json()
    assert waiting["state"] == "pending"
    seen.clear()
    queue.queue_pass(pool_id=mixed.pk)
    assert seen and all(profile is expected for profile in seen)


@pytest.mark.parametrize("pinned_history, lands_on", [(False, H100), (True, A100)])
def test_a_history_of_h100_only_work_steers_unpinned_work_off_the_h100s(world, api, mixed, pinned_history, lands_on):
    """fgd scores a node by what it leaves for the usual work: with no history (the neutral mix, any model) two
    GPUs fill a 2-H100 node exactly; when the pool's work is mostly 2 × H100-only, taking an H100 node takes
    what that work needs, and two of the four A100s are the better choice."""
    mixed.placement_policy = "fgd"
    mixed.save()
    if pinned_history:
        history(mixed, world.team, world.member, 50, gpus=2, models=[H100])
    start, end = window(0, 2)
    response = api(world.member).post(URL, {"pool": "mixed", "team": "ml", "gpus": 2, "ends_at": end.isoformat()},
                                      format="json")
    assert response.status_code == 201, response.content
    assert {g["model_name"] for g in response.json()["grants"]} == {lands_on}


@pytest.mark.parametrize("policy", ["portal", "fgd"])
def test_a_pool_with_a_profile_still_places_every_request_on_its_models(world, api, mixed, policy):
    mixed.placement_policy = policy
    mixed.save()
    history(mixed, world.team, world.member, 50, gpus=2, models=[H100])
    start, end = window(0, 2)
    for gpus, models in ((2, [H100]), (2, []), (2, [A100]), (2, [])):
        body = {"pool": "mixed", "team": "ml", "gpus": gpus, "ends_at": end.isoformat()}
        if models:
            body["gpu_models"] = models
        response = api(world.member).post(URL, body, format="json")
        assert response.status_code == 201, response.content
        if models:
            assert {g["model_name"] for g in response.json()["grants"]} == set(models)
