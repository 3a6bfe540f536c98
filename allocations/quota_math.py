"""Calendar arithmetic for quotas: the UTC months a window touches and the hours it spends in each.

Windows are half-open [start, end). The peak held at once is allocations.units.peak. Pure
functions, so they are property-tested on their own.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

Window = tuple[datetime, datetime]


def month_start(instant: datetime) -> datetime:
    utc = instant.astimezone(timezone.utc)
    return datetime(utc.year, utc.month, 1, tzinfo=timezone.utc)


def next_month(start: datetime) -> datetime:
    return datetime(start.year + (start.month // 12), start.month % 12 + 1, 1, tzinfo=timezone.utc)


def months_between(start: datetime, end: datetime) -> list[tuple[datetime, datetime]]:
    """Calendar months (UTC) that [start, end) touches, as [month_start, next_month_start)."""
    months = []
    cursor = month_start(start)
    while cursor < end:
        following = next_month(cursor)
        months.append((cursor, following))
        cursor = following
    return months


def overlap_hours(a: Window, b: Window) -> float:
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return max((hi - lo) / timedelta(hours=1), 0.0)

