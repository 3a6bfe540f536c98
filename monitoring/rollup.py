"""Rollups raw → 1 minute → 1 hour (avg and max of each metric), and pruning by retention.

A level is done up to a mark (RollupMark): each run aggregates the buckets between the
mark and "now minus a grace" with one GROUP BY in the database and upserts the result,
so running twice is harmless. Samples that arrive for a bucket already done (an agent
resending after an outage) mark it dirty (ingest.py), and the next run recomputes it.
Hour averages are weighted by the number of samples, so an hour's avg equals the
average of its raw samples.
"""
from __future__ import annotations

import time
from collections.abc import Iterable

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import Avg, Count, F, Max, Q, Sum

from monitoring.models import HourRollup, MinuteRollup, RollupMark, Sample

MINUTE, HOUR = 60, 3600
# A bucket is rolled up this long after it ends (samples of the last seconds still arriving).
GRACE = {MINUTE: 30, HOUR: 120}
UPDATE_FIELDS = ["pool_id", "n", "util_avg", "util_max", "mem_util_avg", "mem_util_max", "mem_used_avg",
                 "mem_used_max", "mem_total", "temp_avg", "temp_max", "power_avg", "power_max", "sm_clock_avg",
                 "sm_clock_max", "ecc_corrected_max", "ecc_uncorrected_max"]
DIRTY_KEY = "tm:dirty:{level}:{bucket}"
# How far back a late sample can make a bucket dirty (longer outages stay in raw only).
DIRTY_LOOKBACK = 6 * HOUR


def mark_dirty(minutes: Iterable[int]) -> None:
    keys = {}
    for minute in minutes:
        keys[DIRTY_KEY.format(level="minute", bucket=minute)] = 1
        keys[DIRTY_KEY.format(level="hour", bucket=minute - minute % HOUR)] = 1
    cache.set_many(keys, timeout=DIRTY_LOOKBACK + HOUR)


def _minute_rows(start: int, end: int, buckets: set[int] | None = None) -> list[MinuteRollup]:
    qs = Sample.objects.filter(ts__gte=start, ts__lt=end).annotate(bucket=F("ts") - F("ts") % MINUTE)
    if buckets is not None:
        qs = qs.filter(bucket__in=buckets)
    agg = qs.values("gpu_id", "bucket").annotate(
        pool=Max("pool_id"), n=Count("ts"), util_avg=Avg("util"), util_max=Max("util"), mem_util_avg=Avg("mem_util"),
        mem_util_max=Max("mem_util"), mem_used_avg=Avg("mem_used"), mem_used_max=Max("mem_used"),
        mem_total_=Max("mem_total"), temp_avg=Avg("temp"), temp_max=Max("temp"), power_avg=Avg("power"),
        power_max=Max("power"), sm_clock_avg=Avg("sm_clock"), sm_clock_max=Max("sm_clock"),
        ecc_corrected_max=Max("ecc_corrected"), ecc_uncorrected_max=Max("ecc_uncorrected"))
    return [MinuteRollup(gpu_id=r["gpu_id"], pool_id=r["pool"], bucket=r["bucket"], n=r["n"], util_avg=r["util_avg"],
                         util_max=r["util_max"], mem_util_avg=r["mem_util_avg"], mem_util_max=r["mem_util_max"],
                         mem_used_avg=r["mem_used_avg"], mem_used_max=r["mem_used_max"], mem_total=r["mem_total_"],
                         temp_avg=r["temp_avg"], temp_max=r["temp_max"], power_avg=r["power_avg"],
                         power_max=r["power_max"], sm_clock_avg=r["sm_clock_avg"], sm_clock_max=r["sm_clock_max"],
                         ecc_corrected_max=r["ecc_corrected_max"], ecc_uncorrected_max=r["ecc_uncorrected_max"])
            for r in agg]


def _hour_rows(start: int, end: int, buckets: set[int] | None = None) -> list[HourRollup]:
    qs = MinuteRollup.objects.filter(bucket__gte=start, bucket__lt=end).annotate(hour=F("bucket") - F("bucket") % HOUR)
    if buckets is not None:
        qs = qs.filter(hour__in=buckets)
    agg = qs.values("gpu_id", "hour").annotate(
        pool=Max("pool_id"), total=Sum("n"), util_sum=Sum(F("util_avg") * F("n")), util_max_=Max("util_max"),
        mem_util_sum=Sum(F("mem_util_avg") * F("n")), mem_util_max_=Max("mem_util_max"),
        mem_used_sum=Sum(F("mem_used_avg") * F("n")), mem_used_max_=Max("mem_used_max"), mem_total_=Max("mem_total"),
        temp_sum=Sum(F("temp_avg") * F("n")), temp_max_=Max("temp_max"), power_sum=Sum(F("power_avg") * F("n")),
        power_max_=Max("power_max"), sm_clock_sum=Sum(F("sm_clock_avg") * F("n")),
        sm_clock_n=Sum("n", filter=Q(sm_clock_avg__isnull=False)), sm_clock_max_=Max("sm_clock_max"),
        ecc_corrected_max_=Max("ecc_corrected_max"), ecc_uncorrected_max_=Max("ecc_uncorrected_max"))
    return [HourRollup(gpu_id=r["gpu_id"], pool_id=r["pool"], bucket=r["hour"], n=r["total"],
                       util_avg=r["util_sum"] / r["total"], util_max=r["util_max_"],
                       mem_util_avg=r["mem_util_sum"] / r["total"], mem_util_max=r["mem_util_max_"],
                       mem_used_avg=r["mem_used_sum"] / r["total"], mem_used_max=r["mem_used_max_"],
                       mem_total=r["mem_total_"], temp_avg=r["temp_sum"] / r["total"], temp_max=r["temp_max_"],
                       power_avg=r["power_sum"] / r["total"], power_max=r["power_max_"],
                       sm_clock_avg=r["sm_clock_sum"] / r["sm_clock_n"] if r["sm_clock_n"] else None,
                       sm_clock_max=r["sm_clock_max_"], ecc_corrected_max=r["ecc_corrected_max_"],
                       ecc_uncorrected_max=r["ecc_uncorrected_max_"]) for r in agg]


def _upsert(model, rows) -> int:
    model.objects.bulk_create(rows, batch_size=2000, update_conflicts=True, unique_fields=["gpu_id", "bucket"],
                              update_fields=UPDATE_FIELDS)
    return len(rows)


def _dirty(level: str, before: int, step: int) -> set[int]:
    first = before - DIRTY_LOOKBACK
    first -= first % step
    keys = {DIRTY_KEY.format(level=level, bucket=b): b for b in range(first, before, step)}
    found = cache.get_many(list(keys))
    if found:
        cache.delete_many(list(found))
    return {keys[k] for k in found}


def _level(level: str, step: int, source_first, build, model, now: int) -> int:
    """Roll up one level from its mark to the last finished bucket, plus dirty buckets; returns rows written."""
    mark = RollupMark.objects.select_for_update().filter(level=level).first()
    until = now - GRACE[step]
    until -= until % step
    if mark is None:
        first = source_first()
        if first is None:
            return 0
        mark = RollupMark.objects.create(level=level, done_until=first - first % step)
    written = 0
    dirty = {b for b in _dirty(level, mark.done_until, step) if b < mark.done_until}
    if dirty:
        written += _upsert(model, build(min(dirty), max(dirty) + step, dirty))
    if until > mark.done_until:
        # Chunks of at most a day, so a first run over a long backlog stays bounded.
        start = mark.done_until
        while start < until:
            end = min(until, start + 86400)
            written += _upsert(model, build(start, end, None))
            start = end
        RollupMark.objects.filter(pk=mark.pk).update(done_until=until)
    return written


def telemetry_rollup(*, now: float | None = None) -> dict[str, int]:
    """Roll raw samples up into minutes and minutes into hours, then prune each level past its retention."""
    now = int(time.time() if now is None else now)
    with transaction.atomic():
        minutes = _level("minute", MINUTE, lambda: Sample.objects.order_by("ts").values_list("ts", flat=True).first(),
                         _minute_rows, MinuteRollup, now)
    with transaction.atomic():
        hours = _level("hour", HOUR,
                       lambda: MinuteRollup.objects.order_by("bucket").values_list("bucket", flat=True).first(),
                       _hour_rows, HourRollup, now)
    pruned = telemetry_prune(now=now)
    return {"minute_rows": minutes, "hour_rows": hours, **pruned}


@transaction.atomic
def telemetry_prune(*, now: float | None = None) -> dict[str, int]:
    now = int(time.time() if now is None else now)
    raw, _ = Sample.objects.filter(ts__lt=now - settings.TELEMETRY_RAW_RETENTION.total_seconds()).delete()
    minute, _ = MinuteRollup.objects.filter(
        bucket__lt=now - settings.TELEMETRY_MINUTE_RETENTION.total_seconds()).delete()
    hour, _ = HourRollup.objects.filter(bucket__lt=now - settings.TELEMETRY_HOUR_RETENTION.total_seconds()).delete()
    return {"pruned_raw": raw, "pruned_minute": minute, "pruned_hour": hour}
