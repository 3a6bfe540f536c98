"""Quota arithmetic checked against brute force (hypothesis) and by hand."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from allocations import quota_math

T0 = datetime(2026, 1, 31, 20, 0, tzinfo=timezone.utc)
minutes = st.integers(min_value=0, max_value=600)
windows = st.lists(st.tuples(minutes, minutes).map(sorted).filter(lambda w: w[0] < w[1]), max_size=12)


def at(m: int) -> datetime:
    return T0 + timedelta(minutes=m)


@given(windows, minutes, minutes)
def test_peak_concurrent_matches_counting_every_minute(ws, a, b):
    start, end = min(a, b), max(a, b)
    peak, _ = quota_math.peak_concurrent([(at(s), at(e)) for s, e in ws], at(start), at(end))
    brute = max((sum(1 for s, e in ws if s <= m < e) for m in range(start, end)), default=0)
    assert peak == brute


def test_back_to_back_windows_never_count_together():
    peak, _ = quota_math.peak_concurrent([(at(0), at(60)), (at(60), at(120))], at(0), at(120))
    assert peak == 1


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
