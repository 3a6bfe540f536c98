"""The usage ledger: one entry per grant and clock hour, booked = GE x hours held, used from the GPU's
minute telemetry, closed idempotently by the periodic task and closed again for late telemetry."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounting.ledger import ledger_close, ledger_hour_close
from accounting.models import ClosedHour, LedgerDay, LedgerEntry, LedgerMonth
from accounting.selectors import UsageQuery, usage_totals
from accounting.tasks import close_usage_hours
from allocations.models import Allocation
from allocations.services import reservation_release
from tests.accounting.history import H, grant, minutes

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)
LATER = H + timedelta(days=1)  # every hour of the histories below is finished and past its grace


def _booked(allocation_id: int) -> float:
    return LedgerEntry.objects.filter(allocation_id=allocation_id).aggregate(s=Sum("booked_ge_hours"))["s"] or 0.0


# Random histories: up to 5 grants on distinct GPUs, starting within 6 hours of H at any second, held up to
# 9 hours, each with a GE of a whole GPU or a share, some cut short by a release at a random moment.
GRANTS = st.lists(st.tuples(st.integers(0, 6 * 3600), st.integers(1, 9 * 3600),
                            st.sampled_from([1.0, 2.0, 0.25, 3 / 7, 0.4]), st.none() | st.floats(0.0, 1.0)),
                  min_size=1, max_size=5)


@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(history=GRANTS)
def test_the_ledger_sums_each_grants_hours(world, history):
    gpus = list(world.pool.gpus.order_by("pk"))
    with transaction.atomic():
        made = []
        for (offset, length, ge, cut), gpu in zip(history, gpus):
            start = H + timedelta(seconds=offset)
            end = start + timedelta(seconds=length)
            if cut is not None:  # released early: the grant's end is cut back to the release
                end = start + timedelta(seconds=int(length * cut))
            made.append((grant(world.team, world.pool, gpu, start, end, ge=ge, milli=int(min(ge, 1) * 1000)),
                         ge * (end - start).total_seconds() / 3600))
        ledger_close(now=LATER)
        for allocation, expected in made:
            assert _booked(allocation.pk) == pytest.approx(expected, abs=1e-9)
            entries = LedgerEntry.objects.filter(allocation=allocation)
            # One entry per clock hour the grant overlaps (a cancelled, empty grant has none).
            first, last = allocation.starts_at, allocation.ends_at
            hours = 0 if last == first else int(((last - timedelta(microseconds=1)).replace(minute=0, second=0,
                                                 microsecond=0) - first.replace(minute=0, second=0)) / HOUR) + 1
            assert entries.count() == hours
            assert all(e.no_data_ge_hours == pytest.approx(e.booked_ge_hours) and e.used_ge_hours == 0
                       for e in entries)  # no telemetry at all: nothing counts as used
        total = sum(expected for _, expected in made)
        for summary in (LedgerDay, LedgerMonth):
            assert (summary.objects.aggregate(s=Sum("booked_ge_hours"))["s"] or 0.0) == pytest.approx(total, abs=1e-9)
        # A report over whole days (the day summary) and one over hours (the entries) agree.
        whole = usage_totals(UsageQuery(H.replace(hour=0), H.replace(hour=0) + timedelta(days=2), (), None))
        hourly = usage_totals(UsageQuery(H, H + timedelta(hours=16), (), None))
        assert whole["booked_ge_hours"] == hourly["booked_ge_hours"] == pytest.approx(total, abs=1e-3)
        transaction.set_rollback(True)


def test_used_and_no_data_come_from_the_minute_rollups(world, settings):
    settings.TELEMETRY_IDLE_UTIL_PCT = 1.0
    settings.USAGE_BUSY_MEMORY_MIB = 64
    gpu = world.pool.gpus.order_by("pk").first()
    whole = grant(world.team, world.pool, gpu, H, H + HOUR)
    minutes(gpu, H, 20, util=60)                                        # busy
    minutes(gpu, H + timedelta(minutes=20), 10, util=0, mem_used=4000)  # idle compute, memory held: busy
    minutes(gpu, H + timedelta(minutes=30), 15, util=0.5)               # idle
    # the last 15 minutes: no telemetry
    ledger_hour_close(hour=H, final=True)
    entry = LedgerEntry.objects.get(allocation=whole)
    assert entry.booked_ge_hours == pytest.approx(1.0)
    assert entry.used_ge_hours == pytest.approx(30 / 60)
    assert entry.no_data_ge_hours == pytest.approx(15 / 60)
    assert entry.gpu_hours == pytest.approx(1.0)
    assert (entry.team_id, entry.pool_id, entry.gpu_model, entry.mode) == (
        world.team.pk, world.pool.pk, gpu.model_name, "exclusive")


def test_a_share_counts_its_busy_seconds_times_its_ge(world):
    gpu = world.pool.gpus.order_by("pk").first()
    # A quarter of the GPU from 10:00:30 to 10:02:30: half of the first minute, the second, half of the third.
    share = grant(world.team, world.pool, gpu, H + timedelta(seconds=30), H + timedelta(seconds=150), ge=0.25,
                  milli=250, mode="time_slicing", share=(0, 250))
    minutes(gpu, H, 2, util=90)  # 10:00 and 10:01 busy; 10:02 without data
    ledger_hour_close(hour=H, final=True)
    entry = LedgerEntry.objects.get(allocation=share)
    assert entry.seconds == pytest.approx(120)
    assert entry.booked_ge_hours == pytest.approx(0.25 * 120 / 3600)
    assert entry.used_ge_hours == pytest.approx(0.25 * 90 / 3600)
    assert entry.no_data_ge_hours == pytest.approx(0.25 * 30 / 3600)
    assert entry.gpu_hours == pytest.approx(0.25 * 120 / 3600)


def test_closing_is_idempotent_and_late_telemetry_closes_the_hour_again(world, settings):
    settings.USAGE_CLOSE_DELAY_SECONDS = 180
    settings.USAGE_LATE_TELEMETRY_SECONDS = 7200
    gpu = world.pool.gpus.order_by("pk").first()
    whole = grant(world.team, world.pool, gpu, H, H + HOUR)
    minutes(gpu, H, 30, util=50)
    first = ledger_close(now=H + HOUR + timedelta(minutes=5))
    assert first == {"hours": 1, "entries": 1}
    hour = ClosedHour.objects.get(hour=H)
    assert not hour.final
    entry = LedgerEntry.objects.get(allocation=whole)
    assert (entry.used_ge_hours, entry.no_data_ge_hours) == (pytest.approx(0.5), pytest.approx(0.5))

    # Nothing more is due: running again (or the beat's task) changes and adds nothing.
    assert ledger_close(now=H + HOUR + timedelta(minutes=10)) == {"hours": 0, "entries": 0}
    # Closing the same hour by hand again rewrites the same row, never a second one.
    ledger_hour_close(hour=H, final=False)
    ledger_hour_close(hour=H, final=False)
    assert LedgerEntry.objects.count() == 1 and LedgerDay.objects.count() == 1

    # The other half arrives late (an agent resends after an outage); once the grace is over the hour is
    # closed for good, counting it.
    minutes(gpu, H + timedelta(minutes=30), 30, util=50)
    assert ledger_close(now=H + HOUR + timedelta(minutes=30))["hours"] == 0
    assert LedgerEntry.objects.get(allocation=whole).used_ge_hours == pytest.approx(0.5)
    assert ledger_close(now=H + 3 * HOUR + timedelta(minutes=5))["hours"] == 3  # 11:00 and 12:00 new, 10:00 again
    entry = LedgerEntry.objects.get(allocation=whole)
    assert (entry.used_ge_hours, entry.no_data_ge_hours) == (pytest.approx(1.0), pytest.approx(0.0))
    assert ClosedHour.objects.get(hour=H).final
    assert LedgerEntry.objects.count() == 1
    assert LedgerDay.objects.get().used_ge_hours == pytest.approx(1.0)


def test_an_hour_whose_grant_was_cut_back_by_hand_loses_its_entry(world):
    gpu = world.pool.gpus.order_by("pk").first()
    held = grant(world.team, world.pool, gpu, H, H + 2 * HOUR)
    ledger_hour_close(hour=H + HOUR, final=False)
    assert LedgerEntry.objects.filter(allocation=held).count() == 1
    Allocation.objects.filter(pk=held.pk).update(ends_at=H + HOUR)
    ledger_hour_close(hour=H + HOUR, final=True)
    assert not LedgerEntry.objects.filter(allocation=held).exists()
    assert not LedgerDay.objects.exists()


def test_a_released_reservation_counts_only_its_real_span(world, api):
    start = timezone.now()
    booked = api(world.member).post("/api/v1/reservations/", {
        "pool": "a100", "team": "ml", "gpus": 2, "ends_at": (start + 3 * HOUR).isoformat()})
    assert booked.status_code == 201, booked.content
    reservation = reservation_release(actor=world.member, reservation_id=booked.json()["id"],
                                      now=start + timedelta(minutes=70))
    held = [a.ends_at - a.starts_at for a in reservation.allocations.all()]
    assert len(held) == 2 and all(abs(h - timedelta(minutes=70)) < timedelta(seconds=5) for h in held)
    ledger_close(now=start + timedelta(days=1))
    total = LedgerEntry.objects.filter(reservation_id=reservation.pk).aggregate(s=Sum("booked_ge_hours"))["s"]
    # To the millisecond (the ledger's unit), with real instants' microseconds.
    assert total == pytest.approx(sum(h.total_seconds() for h in held) / 3600, abs=1e-6)
    entries = LedgerEntry.objects.filter(reservation_id=reservation.pk)
    assert {e.user_id for e in entries} == {world.member.pk}


def test_the_beat_closes_the_ledger():
    from config.celery import PERIODIC_TASKS

    assert ("USAGE_CLOSE_SECONDS", "accounting.tasks.close_usage_hours",
            "close finished hours into the usage ledger") in PERIODIC_TASKS
    assert close_usage_hours.run() == {"hours": 0, "entries": 0, "statements": 0}
