"""benchmarks.idle_reclaim replays the sweep's own decisions: an idle booking longer than warn + release is
released at the first sweep after both, a busy one never, and the table's figures add up."""
from __future__ import annotations

from datetime import timedelta

from benchmarks.idle_reclaim import EPOCH, Booking, demo_bookings, released_at, replay


def test_the_replay_releases_idle_bookings_after_warn_and_release_only():
    long_idle = Booking(1, EPOCH, EPOCH + timedelta(hours=3), 2.0, True)
    short_idle = Booking(2, EPOCH, EPOCH + timedelta(minutes=50), 1.0, True)
    busy = Booking(3, EPOCH, EPOCH + timedelta(hours=3), 1.0, False)
    warn, release = timedelta(minutes=30), timedelta(minutes=20)
    assert released_at(long_idle, warn, release) == EPOCH + timedelta(minutes=50)
    assert released_at(short_idle, warn, release) is None
    assert released_at(busy, warn, release) is None
    result = replay([long_idle, short_idle, busy])
    baseline, *rows = result["rows"]
    assert baseline["ge_hours_returned_per_day"] == 0
    assert all(0 <= r["of_idle_pct"] <= 100 for r in rows)


def test_demo_bookings_are_idle_by_the_demos_own_rule():
    bookings = demo_bookings(days=2)
    assert bookings and 0 < sum(b.idle for b in bookings) < len(bookings) * 0.15
