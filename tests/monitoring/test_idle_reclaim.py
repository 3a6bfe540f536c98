"""Idle reclaim (monitoring.idle): on telemetry recorded through the ingest and rolled up as in production,
the sweep warns (a real mail through aiosmtpd), then releases through the undo path with the evidence;
activity after the warning calls it off; a kept reservation is left alone, within the pool's allowance;
a pool without the policy is never touched."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from allocations.models import Allocation, Reservation, ReservationEvent
from monitoring.idle import idle_reclaim_sweep
from monitoring.ingest import telemetry_ingest
from monitoring.rollup import telemetry_rollup
from tests.monitoring.conftest import batch, payload, sample

pytestmark = pytest.mark.django_db

MIN = timedelta(minutes=1)


@pytest.fixture
def t0():
    """A start four hours ago, on a minute: the test's telemetry is written for the past, as an agent sends it."""
    now = timezone.now() - timedelta(hours=4)
    return now.replace(second=0, microsecond=0)


def _reclaiming(world, warn=30, release=20, allowance=1):
    pool = world.pool
    pool.idle_reclaim, pool.idle_warn_minutes, pool.idle_release_minutes = True, warn, release
    pool.idle_keep_allowance = allowance
    pool.save()
    return pool


def _booking(world, gpus, t0, user=None):
    reservation = Reservation.objects.create(team=world.team, pool=world.pool, requested_by=user or world.member,
                                             gpus=len(gpus), starts_at=t0, ends_at=t0 + timedelta(hours=10),
                                             state="active")
    for gpu in gpus:
        Allocation.objects.create(reservation=reservation, gpu=gpu, starts_at=t0, ends_at=reservation.ends_at)
    return reservation


def _record(host, gpus, start, end, util=0, memory=3, busy=()):
    """One sample per GPU per minute in [start, end) (those in `busy` at 60 % with a 9 GiB process), through
    the agent ingest at the time they were taken, then rolled up into minutes as beat does."""
    t = start
    while t < end:
        samples = []
        for gpu in gpus:
            u, m = (60, 9000) if gpu in busy else (util, memory)
            samples.append(sample(gpu.uuid, util=u, memory_used_mib=m,
                                  processes=[] if u == 0 else [{"pid": 7, "used_memory_mib": m}]))
        result = telemetry_ingest(token=host.token, payload=payload(batch(samples, t=t.timestamp())),
                                  now=t.timestamp() + 1)
        assert result.accepted == len(gpus), result.as_dict()
        t += MIN
    telemetry_rollup(now=end.timestamp() + 60)


def _reasons(reservation):
    return [e.reason for e in ReservationEvent.objects.filter(reservation=reservation).order_by("id")]


def test_an_idle_booking_is_warned_then_released_with_its_evidence(world, host, smtp, t0,
                                                                  django_capture_on_commit_callbacks):
    _reclaiming(world)
    reservation = _booking(world, host.gpus[:2], t0)
    _record(host, host.gpus[:2], t0, t0 + 32 * MIN)
    with django_capture_on_commit_callbacks(execute=True):
        assert idle_reclaim_sweep(now=t0 + 33 * MIN) == {"warned": 1}
    reservation.refresh_from_db()
    assert reservation.idle_warned_at == t0 + 33 * MIN and reservation.idle_since == t0
    assert "Idle warning" in _reasons(reservation)[-1]
    assert sorted(a for to, _ in smtp.messages for a in to) == ["member@example.test", "owner@example.test"]
    assert all(f"Reservation #{reservation.pk} sits idle" in s for s in smtp.subjects())
    assert idle_reclaim_sweep(now=t0 + 40 * MIN) == {}  # warned once; not yet due

    _record(host, host.gpus[:2], t0 + 32 * MIN, t0 + 54 * MIN)
    with django_capture_on_commit_callbacks(execute=True):
        assert idle_reclaim_sweep(now=t0 + 54 * MIN) == {"released": 1}
    reservation.refresh_from_db()
    assert reservation.state in ("releasing", "released")
    assert set(reservation.allocations.values_list("ends_at", flat=True)) == {t0 + 54 * MIN}
    why = _reasons(reservation)[-1]
    assert "Released as idle by pool a100's policy" in why
    assert f"idle since {t0.isoformat(timespec='minutes')}" in why and "peak utilization 0%" in why
    assert "peak memory 3 MiB" in why
    assert any(f"Reservation #{reservation.pk} was released as idle" in s for s in smtp.subjects())


def test_activity_after_the_warning_calls_the_release_off(world, host, t0):
    _reclaiming(world)
    reservation = _booking(world, host.gpus[:1], t0)
    _record(host, host.gpus[:1], t0, t0 + 31 * MIN)
    assert idle_reclaim_sweep(now=t0 + 31 * MIN) == {"warned": 1}
    _record(host, host.gpus[:1], t0 + 31 * MIN, t0 + 36 * MIN, util=80, memory=20000)
    _record(host, host.gpus[:1], t0 + 36 * MIN, t0 + 55 * MIN)
    assert idle_reclaim_sweep(now=t0 + 55 * MIN) == {"called_off": 1}
    reservation.refresh_from_db()
    assert reservation.state == "active" and reservation.idle_warned_at is None
    assert "used again" in _reasons(reservation)[-1]
    # Idle again since the activity: only 19 minutes, short of the 30 before a new warning.
    assert idle_reclaim_sweep(now=t0 + 56 * MIN) == {}


def test_one_busy_gpu_of_two_keeps_a_booking_and_missing_telemetry_is_no_evidence(world, host, t0):
    _reclaiming(world)
    both = _booking(world, host.gpus[:2], t0)
    silent = _booking(world, host.gpus[2:3], t0)  # its GPU sends nothing
    _record(host, host.gpus[:2], t0, t0 + 40 * MIN, busy=host.gpus[1:2])
    assert idle_reclaim_sweep(now=t0 + 40 * MIN) == {"no_data": 1}
    assert Reservation.objects.filter(pk__in=[both.pk, silent.pk], idle_warned_at__isnull=True).count() == 2


def test_keep_prevents_the_release_within_the_pools_allowance(world, host, t0, api):
    _reclaiming(world, allowance=1)
    first, second = _booking(world, host.gpus[:1], t0), _booking(world, host.gpus[1:2], t0)
    _record(host, host.gpus[:2], t0, t0 + 31 * MIN)
    assert idle_reclaim_sweep(now=t0 + 31 * MIN) == {"warned": 2}

    member = api(world.member)
    kept = member.post(f"/api/v1/reservations/{first.pk}/keep/", {"reason": "debugging tonight"}, format="json")
    assert kept.status_code == 200, kept.content
    assert kept.json()["keep_reason"] == "debugging tonight" and kept.json()["keep_by"] == "member"
    assert kept.json()["idle_warned_at"] is None  # keeping it called the pending release off
    over = member.post(f"/api/v1/reservations/{second.pk}/keep/", {"reason": "also"}, format="json")
    assert over.status_code == 409 and over.json()["errors"][0]["rule"] == "keep_allowance", over.content
    assert "allowance" in over.json()["errors"][0]["message"]
    assert member.post(f"/api/v1/reservations/{second.pk}/keep/", {}, format="json").status_code == 400
    unknown = member.post(f"/api/v1/reservations/{second.pk}/keep/", {"reason": "x", "until": 1}, format="json")
    assert unknown.status_code == 400 and unknown.json()["errors"][0]["rule"] == "unknown_field"
    outsider = api(world.outsider).post(f"/api/v1/reservations/{first.pk}/keep/", {"reason": "x"}, format="json")
    assert outsider.status_code == 404

    _record(host, host.gpus[:2], t0 + 31 * MIN, t0 + 52 * MIN)
    assert idle_reclaim_sweep(now=t0 + 52 * MIN) == {"released": 1}
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.state == "active" and second.state in ("releasing", "released")
    assert any("Marked keep by member: debugging tonight" in r for r in _reasons(first))
    # Staff see it (the API's detail) and the team may unmark it.
    assert api(world.staff).get(f"/api/v1/reservations/{first.pk}/").json()["keep_reason"] == "debugging tonight"
    assert member.delete(f"/api/v1/reservations/{first.pk}/keep/").json()["keep_at"] is None


def test_a_pool_without_idle_reclaim_is_never_touched(world, host, t0):
    reservation = _booking(world, host.gpus[:1], t0)
    _record(host, host.gpus[:1], t0, t0 + 40 * MIN)
    events = ReservationEvent.objects.count()
    assert idle_reclaim_sweep(now=t0 + 3 * 60 * MIN) == {}
    reservation.refresh_from_db()
    assert (reservation.state, reservation.idle_warned_at, ReservationEvent.objects.count()) == ("active", None, events)


def test_the_reservation_page_shows_the_warning_and_keeps_it(world, host, t0, client):
    _reclaiming(world)
    reservation = _booking(world, host.gpus[:1], t0)
    _record(host, host.gpus[:1], t0, t0 + 31 * MIN)
    Reservation.objects.filter(pk=reservation.pk).update(ends_at=timezone.now() + timedelta(hours=2))
    assert idle_reclaim_sweep(now=t0 + 31 * MIN) == {"warned": 1}
    client.force_login(world.member)
    page = client.get(f"/reservations/{reservation.pk}/").content.decode()
    assert 'id="idle-notice"' in page and 'id="keep"' in page
    client.post(f"/reservations/{reservation.pk}/keep/", {"reason": "demo at 9"})
    page = client.get(f"/reservations/{reservation.pk}/").content.decode()
    assert 'id="idle-notice"' not in page and "demo at 9" in page.split('id="kept"')[1].split("</dd>")[0]


def test_staff_set_the_policy_through_the_pool_api(world, api):
    answer = api(world.staff).patch("/api/v1/pools/a100/", {"idle_reclaim": True, "idle_warn_minutes": 45,
                                                            "idle_keep_allowance": 2}, format="json")
    assert answer.status_code == 200, answer.content
    assert (answer.json()["idle_reclaim"], answer.json()["idle_warn_minutes"]) == (True, 45)
    bad = api(world.staff).patch("/api/v1/pools/a100/", {"idle_warn_minutes": 0}, format="json")
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "idle_warn_minutes"
    assert api(world.member).patch("/api/v1/pools/a100/", {"idle_reclaim": False}, format="json").status_code == 403
