"""Closing clock hours into the usage ledger (accounting.models), as reservations run.

Every USAGE_CLOSE_SECONDS the beat runs `ledger_close`: each finished hour (UTC) since the last
one closed is closed once, provisionally, USAGE_CLOSE_DELAY_SECONDS after it ends (the minute
rollups of its last minutes are in by then), and a second and last time USAGE_LATE_TELEMETRY_SECONDS
after it ends, so telemetry that arrived late (an agent resending after an outage) is counted.
Closing an hour writes one LedgerEntry per grant that held its GPU during the hour, by an upsert on
(grant, hour): running it again rewrites the same rows, never adds any; a row whose grant no longer
overlaps the hour (its window was cut back by hand) is deleted. A grant cut short (released, failed
over) has its allocation's `ends_at` cut back already, so it counts only its real span.

The figures of each grant come from the database in one query per hour: the overlap of the grant
with the hour, and from the GPU's minute rollups (monitoring.MinuteRollup) the seconds of that
overlap inside minutes with data, and inside busy minutes. Then the hour's day is summed again
into LedgerDay, and its month into LedgerMonth.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta

from django.conf import settings
from django.db import connection, models, transaction
from django.db.models import F, FloatField, OuterRef, Q, Subquery, Sum, Value
from django.db.models.functions import Coalesce, Greatest, Least
from django.utils import timezone

from accounting.models import ClosedHour, LedgerDay, LedgerEntry, LedgerMonth
from allocations.models import Allocation
from monitoring.idle import busy_minute
from monitoring.models import MinuteRollup

logger = logging.getLogger(__name__)

HOUR = timedelta(hours=1)
# A first run (or one after a long stop) closes at most this many hours; the next runs catch up.
MAX_HOURS_PER_RUN = 48
# pg_try_advisory_lock key: one closing run at a time (two would rebuild a day's summary together).
LOCK_KEY = 0x6C656467  # "ledg"
ENTRY_FIELDS = ["reservation_id", "team_id", "user_id", "pool_id", "gpu_id", "gpu_model", "mode", "ge", "milli",
                "seconds", "booked_ge_hours", "used_ge_hours", "no_data_ge_hours", "gpu_hours", "closed_at"]


class Epoch(models.Func):
    """A datetime as epoch seconds (double precision), the unit of the telemetry's buckets."""

    output_field = FloatField()

    def as_postgresql(self, compiler, conn, **extra):
        return self.as_sql(compiler, conn, template="CAST(EXTRACT(EPOCH FROM %(expressions)s) AS double precision)",
                           **extra)

    def as_sqlite(self, compiler, conn, **extra):  # to the millisecond, as SQLite keeps datetimes
        return self.as_sql(compiler, conn, template="ROUND((julianday(%(expressions)s) - 2440587.5) * 86400.0, 3)", **extra)


def hour_floor(value: datetime) -> datetime:
    return value.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _busy() -> Q:
    """A minute in which the GPU was in use: utilization above the idle threshold, or memory in use (the one
    rule, monitoring.idle.busy_minute, which the idle reclaim reads too)."""
    return busy_minute()


def _seconds_in_minutes(h0: int, busy: bool) -> Subquery:
    """Seconds of the outer grant's overlap [s_ep, e_ep) that fall in minutes of its GPU with telemetry
    (busy ones only, with `busy`), summed by the database."""
    minutes = (MinuteRollup.objects.filter(gpu_id=OuterRef("gpu_id"), bucket__gte=h0, bucket__lt=h0 + 3600)
               .filter(bucket__gt=OuterRef("s_ep") - 60, bucket__lt=OuterRef("e_ep")))
    if busy:
        minutes = minutes.filter(_busy())
    part = Least(F("bucket") + 60, OuterRef("e_ep"), output_field=FloatField()) - Greatest(
        F("bucket"), OuterRef("s_ep"), output_field=FloatField())
    return Subquery(minutes.order_by().values("gpu_id").annotate(s=Sum(part, output_field=FloatField()))
                    .values("s")[:1], output_field=FloatField())


def _grant_rows(hour: datetime):
    """Per grant holding its GPU during `hour`: who, where, what, and its seconds held, with data and busy."""
    end = hour + HOUR
    h0 = int(hour.timestamp())
    start_v, end_v = Value(hour, output_field=models.DateTimeField()), Value(end, output_field=models.DateTimeField())
    return (Allocation.objects.booked_during(hour, end).order_by()
            .annotate(s_ep=Epoch(Greatest("starts_at", start_v)), e_ep=Epoch(Least("ends_at", end_v)))
            .annotate(data_s=Coalesce(_seconds_in_minutes(h0, busy=False), 0.0),
                      busy_s=Coalesce(_seconds_in_minutes(h0, busy=True), 0.0))
            .values_list("pk", "reservation_id", "reservation__team_id", "reservation__requested_by_id",
                         "reservation__pool_id", "gpu_id", "gpu__model_name", "mode", "ge", "milli", "s_ep", "e_ep",
                         "data_s", "busy_s"))


def _hour_write(hour: datetime, final: bool, now: datetime) -> int:
    """Write one clock hour's entries and its ClosedHour (in the caller's transaction), not the sums."""
    entries = []
    for (grant, reservation, team, user, pool, gpu, model, mode, ge, milli, s_ep, e_ep, data_s,
         busy_s) in _grant_rows(hour):
        # To the millisecond: SQLite's julianday() is a double of days, off by some microseconds.
        seconds = round(max(0.0, e_ep - s_ep), 3)
        data_s, busy_s = round(min(data_s, seconds), 3), round(min(busy_s, data_s, seconds), 3)
        entries.append(LedgerEntry(
            allocation_id=grant, hour=hour, reservation_id=reservation, team_id=team, user_id=user, pool_id=pool,
            gpu_id=gpu, gpu_model=model, mode=mode, ge=ge, milli=milli, seconds=seconds,
            booked_ge_hours=ge * seconds / 3600, used_ge_hours=ge * busy_s / 3600,
            no_data_ge_hours=ge * (seconds - data_s) / 3600, gpu_hours=milli / 1000 * seconds / 3600,
            closed_at=now))
    LedgerEntry.objects.bulk_create(entries, batch_size=2000, update_conflicts=True,
                                    unique_fields=["allocation", "hour"], update_fields=ENTRY_FIELDS)
    (LedgerEntry.objects.filter(hour=hour, allocation__isnull=False)
     .exclude(allocation_id__in=[e.allocation_id for e in entries]).delete())
    ClosedHour.objects.update_or_create(hour=hour, defaults={"closed_at": now, "final": final,
                                                             "entries": len(entries)})
    return len(entries)


def ledger_hour_close(*, hour: datetime, final: bool, now: datetime | None = None) -> int:
    """Write the ledger's entries of one clock hour (idempotent); returns how many grants it holds."""
    return ledger_hours_close(hours=[(hour, final)], now=now)


def ledger_hours_close(*, hours: list[tuple[datetime, bool]], now: datetime | None = None) -> int:
    """Close several (hour, final) at once, in one transaction: each hour's entries, then each day and month
    they touch summed again once (a backfill of many hours: the demo's history). Returns the entries written."""
    now = now or timezone.now()
    written = 0
    with transaction.atomic():
        floors = sorted({hour_floor(hour): final for hour, final in hours}.items())
        for hour, final in floors:
            written += _hour_write(hour, final, now)
        for day in sorted({hour.date() for hour, _ in floors}):
            ledger_day_refresh(day=day)
        for month in sorted({hour.date().replace(day=1) for hour, _ in floors}):
            ledger_month_refresh(month=month)
    return written


# What the day and month sums are kept per (accounting.models.UsageGroup).
GROUP = ("team_id", "user_id", "pool_id", "gpu_model", "mode")


def _resum(source, target, **period) -> int:
    """Replace `target`'s rows of `period` with `source` summed per GROUP (in the caller's transaction)."""
    sums = (source.order_by().values(*GROUP)
            .annotate(b=Sum("booked_ge_hours"), u=Sum("used_ge_hours"), n=Sum("no_data_ge_hours"), g=Sum("gpu_hours")))
    rows = [target(**period, **{key: r[key] for key in GROUP}, booked_ge_hours=r["b"], used_ge_hours=r["u"],
                   no_data_ge_hours=r["n"], gpu_hours=r["g"]) for r in sums]
    target.objects.filter(**period).delete()
    target.objects.bulk_create(rows, batch_size=2000)
    return len(rows)


def ledger_day_refresh(*, day: date) -> int:
    """Sum the day's entries again into LedgerDay (in the caller's transaction); returns the rows written."""
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return _resum(LedgerEntry.objects.filter(hour__gte=start, hour__lt=start + timedelta(days=1)), LedgerDay, day=day)


def ledger_month_refresh(*, month: date) -> int:
    """Sum the month's day sums again into LedgerMonth (in the caller's transaction); returns the rows written."""
    month = month.replace(day=1)
    following = (month + timedelta(days=32)).replace(day=1)
    return _resum(LedgerDay.objects.filter(day__gte=month, day__lt=following), LedgerMonth, month=month)


@contextmanager
def _one_run_at_a_time():
    """True while this run holds the ledger's lock (PostgreSQL advisory lock; SQLite: one process)."""
    if connection.vendor != "postgresql":
        yield True
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [LOCK_KEY])
        (held,) = cursor.fetchone()
    try:
        yield held
    finally:
        if held:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [LOCK_KEY])


def hours_due(now: datetime) -> list[tuple[datetime, bool]]:
    """(hour, final) for each hour to close now: new finished hours after the last closed one (from the
    first grant's hour on a first run), then provisional ones whose grace has passed."""
    finished_before = hour_floor(now - timedelta(seconds=settings.USAGE_CLOSE_DELAY_SECONDS))
    grace = timedelta(seconds=settings.USAGE_LATE_TELEMETRY_SECONDS)
    last = ClosedHour.objects.order_by("-hour").values_list("hour", flat=True).first()
    if last is not None:
        first_new = last + HOUR
    else:
        first_start = Allocation.objects.filter(ends_at__gt=F("starts_at")).order_by("starts_at").values_list(
            "starts_at", flat=True).first()
        first_new = hour_floor(first_start) if first_start is not None else finished_before
    due = []
    hour = first_new
    while hour < finished_before and len(due) < MAX_HOURS_PER_RUN:
        due.append((hour, hour + HOUR + grace <= now))
        hour += HOUR
    for hour in ClosedHour.objects.filter(final=False, hour__lte=now - grace - HOUR).order_by("hour").values_list(
            "hour", flat=True)[:MAX_HOURS_PER_RUN]:
        due.append((hour, True))
    return due


def ledger_close(*, now: datetime | None = None) -> dict[str, int]:
    """Close every hour due (see the module's docstring); returns how many hours and entries it wrote."""
    now = now or timezone.now()
    hours = entries = 0
    with _one_run_at_a_time() as held:
        if not held:
            return {"hours": 0, "entries": 0, "skipped": 1}
        for hour, final in hours_due(now):
            entries += ledger_hour_close(hour=hour, final=final, now=now)
            hours += 1
    if hours:
        logger.info("usage ledger: closed %d hours (%d entries)", hours, entries)
    return {"hours": hours, "entries": entries}
