"""Calendar arithmetic of quotas, by hand."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from allocations import quota_math

T0 = datetime(2026, 1, 31, 20, 0, tzinfo=timezone.utc)


def at(m: int) -> datetime:
    return T0 + timedelta(minutes=m)


def test_months_between_splits_at_calendar_months_in_utc():
    months = quota_math.months_between(at(0), at(60 * 24 * 40))
    assert [m[0].month for m in months] == [1, 2, 3]
    assert months[0][1] == datetime(2026, 2, 1, tzinfo=timezone.utc)
    assert quota_math.next_month(datetime(2026, 12, 1, tzinfo=timezone.utc)) == datetime(2027, 1, 1,
                                                                                         tzinfo=timezone.utc)


def test_gpu_hours_are_clipped_to_the_month():
    january = (datetime(2026, 1, 1, tzinfo=timezone.utc), datetime(2026, 2, 1, tzinfo=timezone.utc))
    # 20:00 Jan 31 to 02:00 Feb 1 on two GPUs: 4 hours each land in January.
    ws = [(at(0), at(360)), (at(0), at(360))]
    assert sum(quota_math.overlap_hours(w, january) for w in ws) == 8.0
