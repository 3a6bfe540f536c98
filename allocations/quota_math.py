"""Quota arithmetic over time windows: peak concurrent GPUs and GPU-hours per month.

Windows are half-open [start, end); each window is one GPU. Pure functions, so they are
property-tested on their own.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Iterable

Window = tuple[datetime, datetime]


def peak_concurrent(windows: Iterable[Window], start: datetime, end: datetime) -> tuple[int, datetime | None]:
    """The most windows that overlap at one instant inside [start, end), and the first such instant."""
    events: list[tuple[datetime, int]] = []
    for w_start, w_end in windows:
        lo, hi = max(w_start, start), min(w_end, end)
        if lo < hi:
            events.append((lo, 1))
            events.append((hi, -1))
    # At equal instants ends (-1) sort before starts (+1): [a, b) and [b, c) never overlap.
    events.sort()
    peak, running, peak_at = 0, 0, None
    for instant, delta in events:
        running += delta
        if running > peak:
            peak, peak_at = running, instant
    return peak, peak_at


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

