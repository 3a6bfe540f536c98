"""The queue benchmark: its arithmetic on hand-made outcomes, and a tiny replay end to end through the real
services on PostgreSQL (a transactional test: the release's kick runs after its commit, as in the portal)."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest

from benchmarks.queue import Outcome, Task, booking_length, jain, main, percentile, summarize
from benchmarks.queue_estimate import breakdown


def test_bookings_are_the_next_usual_length_strictly_above_the_runtime():
    assert booking_length(60) == timedelta(minutes=30)
    assert booking_length(1800) == timedelta(hours=1)  # a task of exactly 30 min books an hour: it ends early
    assert booking_length(5 * 3600) == timedelta(hours=8)
    assert booking_length(400 * 86400) == timedelta(days=30)


def test_jain_and_percentiles():
    assert jain([2.0, 2.0, 2.0]) == 1.0
    assert jain([1.0, 0.0, 0.0, 0.0]) == 0.25
    assert jain([]) is None
    assert percentile([float(v) for v in range(1, 101)], 95) == 95.0
    assert percentile([], 50) is None


def task(k, arrival, gpus=1, team=0):
    return Task(index=k, name=f"pod-{k}", arrival=arrival, runtime=600.0, gpus=gpus, qos="LS", team=team)


def test_summary_of_hand_made_outcomes():
    outcomes = [
        Outcome(task(0, 0.0), start=0.0),  # started at once
        Outcome(task(1, 0.0), start=100.0, waited=True, first_start_by=100.0, first_likely_start=90.0),
        Outcome(task(2, 50.0, team=1), start=250.0, waited=True, first_start_by=200.0, first_likely_start=250.0),
        Outcome(task(3, 60.0), refused="never_fits"),
    ]
    held = [(0, 0.0, 600.0, 1.0), (0, 100.0, 700.0, 1.0), (1, 250.0, 850.0, 1.0)]
    result = summarize(outcomes, pool_ge=2.0, quotas={0: 2.0, 1: 1.0}, window=(0.0, 1000.0), held=held)
    assert result["placed"] == 3 and result["refused"] == 1 and result["waited"] == 2
    assert result["wait_mean_s"] == pytest.approx((0 + 100 + 200) / 3)
    assert result["ge_utilization"] == pytest.approx((600 + 600 + 600) / 2000)
    # GE-seconds over quota: team 0 1200 / 2 = 600, team 1 600 / 1 = 600: perfectly fair.
    assert result["jain_quota_weighted"] == pytest.approx(1.0)
    assert result["promise_kept"] == 0.5  # the second started 50 s after its first start_by
    # |90 - 100| / 100 and |250 - 250| / 200
    assert result["estimate_error_p50"] == 0.0 and result["estimate_error_p90"] == pytest.approx(0.1)
    assert result["preemptions"] == 0


def test_the_estimate_errors_broken_down():
    def waited(arrival, start, first, last, reason):
        return {"arrival": arrival, "start": start, "first_likely_start": first, "last_likely_start": last,
                "first_reason": reason}

    b = breakdown([waited(0, 100, 150, 100, "over_quota"),  # +50 % (late), a short wait; last one right
                   waited(0, 1000, 900, 990, "behind"),  # -10 % (early), a long wait
                   waited(0, 2000, 2000, 2000, "behind"),  # right
                   waited(0, 0, 0, 0, "behind")])  # did not really wait: left out, as summarize does
    assert b["all"] == {"n": 3, "p50": 0.1, "p90": 0.5}
    assert b["signed_median"] == 0.0 and b["late_share"] == pytest.approx(1 / 3)
    assert b["wait_under_10_min"] == {"n": 1, "p50": 0.5, "p90": 0.5}
    assert b["wait_10_min_or_more"]["n"] == 2 and b["wait_10_min_or_more"]["p90"] == pytest.approx(0.1)
    assert b["by_first_reason"]["behind"]["n"] == 2 and b["by_first_reason"]["over_quota"]["p50"] == 0.5
    assert b["last_estimate"] == {"n": 3, "p50": 0.0, "p90": 0.01}


@pytest.mark.django_db(transaction=True)
def test_a_tiny_replay_and_pass_run_end_to_end(tmp_path):
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.fail("needs PostgreSQL, as the benchmark does: run it with `make test`")
    out = tmp_path / "queue.json"
    # 3 nodes and a short, sped-up stretch of the trace: some requests must wait.
    main(["--requests", "40", "--nodes", "3", "--speedup", "200", "--orderings", "fcfs,priority",
          "--pass-nodes", "3", "--pass-queue", "5", "20", "--pass-repeats", "1", "--pass-history", "20",
          "--json", str(out)])
    result = json.loads(out.read_text())
    assert set(result["configs"]) == {"fcfs/backfill", "fcfs/strict", "priority/backfill", "priority/strict"}
    for name, figures in result["configs"].items():
        assert figures["requests"] == 40, name
        assert figures["placed"] + figures["refused"] == 40
        assert figures["placed"] >= 30, (name, figures["refused_rules"])
        assert 0 < figures["ge_utilization"] <= 1
        assert figures["preemptions"] == 0
    strict = result["configs"]["fcfs/strict"]
    assert strict["waited"] > 0 and strict["wait_mean_s"] > 0  # the stretch does contend
    assert 0 <= strict["promise_kept"] <= 1 and strict["estimate_error_p50"] is not None
    # Each request that waited says why the create's pass said it waits, and what ended while it waited.
    assert all(w["first_reason"] and w["ended_pool"] >= w["ended_team"] >= 0 for w in strict["waited_requests"])
    assert len(strict["bookings"]) == strict["placed"]
    passes = result["pass"]["passes"]
    assert set(passes) == {"5", "20"} and passes["20"]["counts"]["waiting"] == 20
    assert result["pass"]["create_ms_median"] > 0 and result["pass"]["create_cpu_ms_median"] > 0
    assert passes["20"]["pass_cpu_ms_median"] > 0 and passes["20"]["cpu_vs_create"] > 0
    assert set(passes["20"]["parts_cpu_ms_median"]) == {"read", "promise", "estimate"}
    assert "promise_kept_fcfs_backfill_ge_95pct" in result["targets"] and "pass_under_200ms" in result["targets"]
    assert sum(result["pass"]["waiting_gpus"].values()) == 20
    from inventory.models import GpuPool

    assert not GpuPool.objects.filter(slug__startswith="bench-queue-").exists()  # it cleans up after itself


@pytest.mark.django_db(transaction=True)
def test_the_pass_over_a_training_heavy_queue(tmp_path):
    """--pass-waiting multi: the waiting requests ask 1, 2, 4 and 8 GPUs in turn (the held bookings stay the trace's)."""
    out = tmp_path / "queue.json"
    main(["--requests", "5", "--nodes", "3", "--orderings", "fcfs", "--pass-nodes", "4", "--pass-queue", "8",
          "--pass-repeats", "1", "--pass-history", "20", "--pass-waiting", "multi", "--json", str(out)])
    passes = json.loads(out.read_text())["pass"]
    assert passes["waiting_gpus"] == {"1": 2, "2": 2, "4": 2, "8": 2}
    assert passes["passes"]["8"]["counts"]["waiting"] == 8 and passes["passes"]["8"]["pass_ms_median"] > 0
