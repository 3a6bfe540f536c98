"""Rollups: minute and hour aggregates equal what the raw samples give; pruning keeps each level's retention."""
from __future__ import annotations

import random
import statistics
from datetime import timedelta

import pytest
from django.test import override_settings

from monitoring.models import HourRollup, MinuteRollup, RollupMark, Sample
from monitoring.rollup import mark_dirty, telemetry_rollup
from monitoring.selectors import pool_history

pytestmark = pytest.mark.django_db

HOUR0 = 1_800_000_000 - 1_800_000_000 % 3600  # an hour boundary


def _raw(gpu_ids, start, seconds, seed=1):
    rng = random.Random(seed)
    rows = []
    for gpu in gpu_ids:
        for ts in range(start, start + seconds, rng.choice([1, 1, 2])):
            rows.append(Sample(gpu_id=gpu, pool_id=7, ts=ts, util=rng.randint(0, 100), mem_util=rng.randint(0, 100),
                               mem_used=rng.randint(0, 80000), mem_total=81559, temp=rng.randint(30, 90),
                               power=round(rng.uniform(50, 700), 1)))
    Sample.objects.bulk_create(rows)
    return rows


@override_settings(TELEMETRY_RAW_RETENTION=timedelta(days=3650),
                   TELEMETRY_MINUTE_RETENTION=timedelta(days=3650))
def test_minute_and_hour_aggregates_equal_those_of_the_raw_samples():
    rows = _raw([1, 2], HOUR0, 2 * 3600 + 600)
    telemetry_rollup(now=HOUR0 + 3 * 3600)
    for gpu in (1, 2):
        for minute in (HOUR0, HOUR0 + 60 * 17, HOUR0 + 3600 + 60 * 59):
            raw = [r for r in rows if r.gpu_id == gpu and minute <= r.ts < minute + 60]
            got = MinuteRollup.objects.get(gpu_id=gpu, bucket=minute)
            assert got.n == len(raw) and got.pool_id == 7
            assert got.util_avg == pytest.approx(statistics.fmean(r.util for r in raw))
            assert got.util_max == max(r.util for r in raw)
            assert got.temp_avg == pytest.approx(statistics.fmean(r.temp for r in raw))
            assert got.power_max == max(r.power for r in raw)
            assert got.mem_used_avg == pytest.approx(statistics.fmean(r.mem_used for r in raw))
        for hour in (HOUR0, HOUR0 + 3600):
            raw = [r for r in rows if r.gpu_id == gpu and hour <= r.ts < hour + 3600]
            got = HourRollup.objects.get(gpu_id=gpu, bucket=hour)
            assert got.n == len(raw)
            assert got.util_avg == pytest.approx(statistics.fmean(r.util for r in raw))
            assert got.power_avg == pytest.approx(statistics.fmean(r.power for r in raw))
            assert got.mem_util_max == max(r.mem_util for r in raw)
    # The third hour is not over (+ grace): not rolled up yet; its minutes are.
    assert not HourRollup.objects.filter(bucket=HOUR0 + 7200).exists()
    assert MinuteRollup.objects.filter(bucket=HOUR0 + 7200 + 540).count() == 2
    assert RollupMark.objects.get(level="minute").done_until == HOUR0 + 3 * 3600 - 60


@override_settings(TELEMETRY_RAW_RETENTION=timedelta(days=3650))
def test_running_twice_changes_nothing_and_late_samples_are_rolled_up_again():
    _raw([1], HOUR0, 600)
    telemetry_rollup(now=HOUR0 + 900)
    first = list(MinuteRollup.objects.order_by("bucket").values())
    telemetry_rollup(now=HOUR0 + 900)
    assert list(MinuteRollup.objects.order_by("bucket").values()) == first
    # A resent sample for minute 0 (already done) with a peak the first pass did not see.
    Sample.objects.filter(gpu_id=1, ts=HOUR0).update(util=100)
    mark_dirty([HOUR0])
    telemetry_rollup(now=HOUR0 + 960)
    assert MinuteRollup.objects.get(gpu_id=1, bucket=HOUR0).util_max == 100


def test_each_level_is_pruned_past_its_retention(settings):
    now = HOUR0 + 400 * 86400
    Sample.objects.create(gpu_id=1, ts=now - 2 * 3600, util=1, mem_util=1, mem_used=1, mem_total=2, temp=40, power=1)
    Sample.objects.create(gpu_id=1, ts=now - 60, util=1, mem_util=1, mem_used=1, mem_total=2, temp=40, power=1)
    common = dict(n=1, util_avg=1, util_max=1, mem_util_avg=1, mem_util_max=1, mem_used_avg=1, mem_used_max=1,
                  mem_total=2, temp_avg=1, temp_max=1, power_avg=1, power_max=1)
    MinuteRollup.objects.create(gpu_id=1, bucket=now - 8 * 86400, **common)
    MinuteRollup.objects.create(gpu_id=1, bucket=now - 6 * 86400, **common)
    HourRollup.objects.create(gpu_id=1, bucket=now - 401 * 86400, **common)
    HourRollup.objects.create(gpu_id=1, bucket=now - 30 * 86400, **common)
    result = telemetry_rollup(now=now)
    assert (result["pruned_raw"], result["pruned_minute"], result["pruned_hour"]) == (1, 1, 1)
    assert list(Sample.objects.values_list("ts", flat=True)) == [now - 60]


def test_the_history_query_picks_the_resolution_by_range(settings):
    settings.TELEMETRY_RAW_RETENTION = timedelta(days=3650)
    settings.TELEMETRY_MINUTE_RETENTION = timedelta(days=3650)
    rows = _raw([1, 2], HOUR0, 3 * 3600)
    telemetry_rollup(now=HOUR0 + 5 * 3600)
    settings.TELEMETRY_RAW_RETENTION = timedelta(hours=1)
    short = pool_history([1], "15m", now=HOUR0 + 3 * 3600)
    assert short.resolution == "raw" and set(short.series) == {1}
    assert len(short.series[1]["util"]) <= 360
    # A raw point is the average and max of the samples in its step, numbers as JSON wants them.
    ts, avg, top = short.series[1]["power"][3]
    samples = [r.power for r in rows if r.gpu_id == 1 and ts <= r.ts < ts + short.step]
    assert avg == pytest.approx(sum(samples) / len(samples)) and top == max(samples)
    assert isinstance(avg, float) and isinstance(short.series[1]["util"][3][2], int)
    assert pool_history([], "15m").series == {}
    day = pool_history([1, 2], "24h", now=HOUR0 + 3 * 3600)
    assert day.resolution == "minute" and day.step == 300
    # A 5-minute point's max is the max of its raw samples.
    bucket = HOUR0 + 600
    point = next(p for p in day.series[2]["util"] if p[0] == bucket)
    assert point[2] == max(r.util for r in rows if r.gpu_id == 2 and bucket <= r.ts < bucket + 300)
    month = pool_history([1, 2], "30d", now=HOUR0 + 3 * 3600)
    assert month.resolution == "hour" and month.step == 7200
    assert len(month.series[1]["util"]) == 2


def test_a_sample_arriving_after_its_minute_was_rolled_up_gets_the_minute_redone(host, settings):
    from monitoring.ingest import telemetry_ingest
    from tests.monitoring.conftest import batch, payload, sample

    settings.TELEMETRY_RAW_RETENTION = timedelta(days=3650)
    gpu, minute = host.gpus[0], HOUR0
    for second in range(0, 60, 2):  # on time
        telemetry_ingest(token=host.token, payload=payload(batch([sample(host.uuids[0], util=10)], t=minute + second,
                                                                 seq=second + 1)), now=minute + second)
    telemetry_rollup(now=minute + 90)  # the minute is done 30 s after it ends
    assert MinuteRollup.objects.get(gpu_id=gpu.pk, bucket=minute).util_max == 10
    # A lost sample resent 65 s late, 6 s after the rollup did its minute.
    late = telemetry_ingest(token=host.token, payload=payload(batch([sample(host.uuids[0], util=100)], t=minute + 31,
                                                                    seq=1000)), now=minute + 96)
    assert late.accepted == 1
    telemetry_rollup(now=minute + 150)
    redone = MinuteRollup.objects.get(gpu_id=gpu.pk, bucket=minute)
    assert (redone.n, redone.util_max) == (31, 100)


def test_a_history_point_over_several_minutes_weights_each_by_its_samples(settings):
    settings.TELEMETRY_RAW_RETENTION = timedelta(days=3650)
    settings.TELEMETRY_MINUTE_RETENTION = timedelta(days=3650)
    # One sample at 100 in the first minute, 59 at 0 in the second: the 5-minute point averages 100/60.
    rows = [Sample(gpu_id=1, pool_id=7, ts=HOUR0, util=100, mem_util=0, mem_used=1, mem_total=2, temp=40, power=1.0)]
    rows += [Sample(gpu_id=1, pool_id=7, ts=HOUR0 + 60 + i, util=0, mem_util=0, mem_used=1, mem_total=2, temp=40,
                    power=1.0) for i in range(59)]
    Sample.objects.bulk_create(rows)
    telemetry_rollup(now=HOUR0 + 3 * 3600)
    settings.TELEMETRY_RAW_RETENTION = timedelta(hours=1)
    day = pool_history([1], "24h", now=HOUR0 + 3600)
    point = next(p for p in day.series[1]["util"] if p[0] == HOUR0)
    assert point[1] == pytest.approx(100 / 60) and point[2] == 100


@override_settings(TELEMETRY_RAW_RETENTION=timedelta(days=3650),
                   TELEMETRY_MINUTE_RETENTION=timedelta(days=3650))
def test_the_sm_clock_and_ecc_counts_roll_up_over_the_samples_that_have_them():
    base = {"pool_id": 7, "mem_util": 0, "mem_used": 0, "mem_total": 81559, "temp": 40, "power": 100.0, "util": 50}
    rows = []
    for s in range(120):  # GPU 1 reports its clock and ECC counts in its first minute only; GPU 2 never
        health = {"sm_clock": 1000 + s * 10, "ecc_corrected": s // 10, "ecc_uncorrected": 0} if s < 60 else {}
        rows.append(Sample(gpu_id=1, ts=HOUR0 + s, **base, **health))
        rows.append(Sample(gpu_id=2, ts=HOUR0 + s, **base))
    Sample.objects.bulk_create(rows)
    telemetry_rollup(now=HOUR0 + 3 * 3600)
    first, second = MinuteRollup.objects.filter(gpu_id=1).order_by("bucket")
    assert (first.sm_clock_avg, first.sm_clock_max, first.ecc_corrected_max, first.ecc_uncorrected_max) == (
        1295.0, 1590, 5, 0)
    assert (second.sm_clock_avg, second.sm_clock_max, second.ecc_corrected_max) == (None, None, None)
    hour = HourRollup.objects.get(gpu_id=1, bucket=HOUR0)
    assert (hour.sm_clock_avg, hour.sm_clock_max, hour.ecc_corrected_max) == (1295.0, 1590, 5)
    assert HourRollup.objects.get(gpu_id=2, bucket=HOUR0).sm_clock_avg is None
    # The history reads the clock over the minutes that had it (not diluted by those without), null elsewhere.
    day = pool_history([1, 2], "24h", now=HOUR0 + 3 * 3600)
    clock = {gpu: [p for p in day.series[gpu]["sm_clock"] if p[0] == HOUR0][0] for gpu in (1, 2)}
    assert clock[1][1:] == (1295.0, 1590) and clock[2][1:] == (None, None)
    month = pool_history([1], "30d", now=HOUR0 + 3 * 3600)
    assert [p[1:] for p in month.series[1]["sm_clock"] if p[0] == HOUR0] == [(1295.0, 1590)]
