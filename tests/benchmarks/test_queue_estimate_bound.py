"""The estimate's bound (benchmarks.queue_estimate_bound): the best point over drawn waits, the figures of hand-made
draws, the drawn futures' consistency, and a tiny replay end to end on PostgreSQL (its teams' windows read one a
reservation)."""
from __future__ import annotations

import json
from datetime import timedelta

import numpy as np
import pytest

from allocations.queue import EarlyRelease
from benchmarks.queue import Task
from benchmarks.queue_estimate_bound import SampledEnds, analyse, best_point, main, window_shares

HOUR = 3600 * 10**6  # micros


def test_the_best_point_covers_the_most_draws_within_the_share():
    # 100, 110 and 120 are within 15 % of 115 (|115 - w| <= 0.15 w); 1,000 is not; no point reaches all four.
    point, share = best_point(np.array([100.0, 110.0, 120.0, 1000.0]), 0.15)
    assert share == 0.75
    assert all(abs(point - w) <= 0.15 * w for w in (100, 110, 120))
    # Draws of no wait (started at once) are never within any share of the point: they only lower the share.
    assert best_point(np.array([0.0, 0.0, 50.0]), 0.5)[1] == pytest.approx(1 / 3)
    assert best_point(np.array([0.0]), 0.15)[1] == 0.0


def test_draws_that_are_the_real_wait_bound_and_estimate_it_exactly():
    rows = [{"wait": 100.0, "portal_wait": 130.0, "drawn_waits": [100.0] * 20},
            {"wait": 50.0, "portal_wait": 50.0, "drawn_waits": [49.0, 50.0, 51.0] * 7}]
    figures = analyse(rows)
    assert figures["bound"]["mean_best_share_within_15"] == 1.0
    assert figures["estimates"]["draws_median"]["p50"] == 0.0  # both medians are the real waits
    assert figures["estimates"]["portal"]["p90"] == pytest.approx(0.3)
    assert figures["calibration"]["inside_middle_80"] == 1.0
    assert sum(figures["calibration"]["rank_deciles"]) == 2 and figures["calibration"]["rank_deciles"][5] == 2
    assert analyse([]) == {"requests": 0}


def history(shares):
    """An EarlyRelease of bookings of one hour that used `shares`."""
    return EarlyRelease(tuple(sorted(shares)), tuple((3600.0, s) for s in shares))


def test_a_drawn_end_is_after_what_the_booking_has_run_and_shared_by_its_grants_and_its_team():
    future = SampledEnds(history([k / 20 for k in range(1, 21)]), np.random.default_rng(3))
    now = 10 * HOUR
    # Reservation 7 on two GPUs, started 33 min ago; reservation 8 started 6 min ago; 9 is not running.
    starts = np.array([now - 33 * HOUR // 60] * 2 + [now - HOUR // 10, now + HOUR], dtype=np.int64)
    ends = starts + HOUR
    for _ in range(50):
        future = SampledEnds(future.history, future.rng)
        grants = future.likely_ends(starts, ends, now, bookings=np.array([7, 7, 8, 9]))
        assert grants[0] == grants[1]  # one booking, one end
        assert starts[0] + 0.55 * HOUR <= grants[0] <= ends[0]  # it has run 55 %: only shares above that
        assert now <= grants[2] <= ends[2]
        assert starts[3] + 0.05 * HOUR <= grants[3] <= ends[3]  # not started yet: any share of it
        # Its team's windows (one a reservation): the same ends for the same bookings; a window of no known
        # booking is drawn on its own.
        team = future.team_ends([(7, int(starts[0]), int(ends[0]), 2.0), (8, int(starts[2]), int(ends[2]), 1.0),
                                 (None, int(starts[2]), int(ends[2]), 1.0)], now)
        drawn_starts, drawn_ends, ge = team.columns()
        assert drawn_ends[0] == grants[0] and drawn_ends[1] == grants[2] and now <= drawn_ends[2] <= ends[2]
        assert drawn_starts.tolist() == [starts[0], starts[2], starts[2]] and ge.tolist() == [2.0, 1.0, 1.0]
        assert timedelta(minutes=3) <= future.expected_duration(timedelta(hours=1)) <= timedelta(hours=1)


def test_a_history_of_one_share_draws_the_estimates_own_ends():
    # Where every past booking used the same share, there is one future, and it is the estimate's.
    past = history([0.75] * 12)
    now = 10 * HOUR
    starts = np.array([now - HOUR // 2, now - HOUR // 4], dtype=np.int64)
    ends = starts + HOUR
    drawn = SampledEnds(past, np.random.default_rng(0)).likely_ends(starts, ends, now, bookings=np.array([1, 2]))
    assert drawn.tolist() == past.likely_ends(starts, ends, now, bookings=np.array([1, 2])).tolist()


def test_the_windows_own_shares_are_its_tasks_runtimes_over_their_bookings():
    tasks = [Task(index=k, name=f"pod-{k}", arrival=0.0, runtime=runtime, gpus=1, qos="LS", team=0)
             for k, runtime in enumerate((900.0, 2700.0, 5400.0))]  # booked 30 min, 1 h and 2 h
    known = window_shares(tasks)
    assert known.used == (0.5, 0.75, 0.75)
    assert sorted(known.by_length) == [(1800.0, 0.5), (3600.0, 0.75), (7200.0, 0.75)]


@pytest.mark.django_db(transaction=True)
def test_a_tiny_window_end_to_end(tmp_path):
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.fail("needs PostgreSQL, as the benchmark does: run it with `make test`")
    out = tmp_path / "bound.json"
    main(["--requests", "40", "--nodes", "3", "--speedup", "200", "--samples", "4", "--json", str(out)])
    result = json.loads(out.read_text())
    (name, figures), = result["windows"].items()
    assert name == "skip 1000 fcfs/backfill"
    assert figures["requests"] > 0  # the stretch contends
    for row in figures["rows"]:
        assert row["wait"] > 0 and len(row["drawn_waits"]) == 4
        assert all(w >= 0 for w in row["drawn_waits"])
    assert 0 <= figures["bound"]["mean_best_share_within_15"] <= figures["bound"]["mean_best_share_within_50"] <= 1
    # The portal's estimate read from the rows is the replay's own figure.
    assert figures["estimates"]["portal"]["p50"] == figures["portal_reported"]["p50"]
    from inventory.models import GpuPool

    assert not GpuPool.objects.filter(slug__startswith="bench-queue-").exists()
