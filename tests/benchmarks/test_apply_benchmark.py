"""The apply benchmark's pure parts: percentiles, summaries, /proc parsing, the JSON shape and the table.

The real run (control plane, Celery worker, portal and agent processes) is a benchmark, not a test.
"""
from __future__ import annotations

import json
import os

import pytest

from benchmarks.apply import (
    ProcSnapshot,
    Sample,
    cpu_pct,
    footprint,
    format_table,
    lease_path,
    parse_stat_ticks,
    parse_status_kb,
    phase_summary,
    proc_snapshot,
    summarize,
)

STATUS = """Name:\tpython
Umask:\t0022
State:\tS (sleeping)
VmPeak:\t  123456 kB
VmHWM:\t   40960 kB
VmRSS:\t   30720 kB
Threads:\t4
"""

# pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
STAT = "4242 (python -m (a) b) S 1 4242 4242 0 -1 4194560 2000 0 1 0 150 25 0 0 20 0 4 0 100 0 0"


def test_summarize_uses_nearest_rank_percentiles():
    values = [float(v) for v in range(1, 101)]  # 1..100 ms
    summary = summarize(values)
    assert summary["n"] == 100
    assert summary["p50"] == 51.0 and summary["p95"] == 95.0
    assert summary["max"] == 100.0 and summary["mean"] == 50.5
    assert summarize([]) == {"n": 0, "p50": None, "p95": None, "max": None, "mean": None}


def test_phase_summary_has_the_keys_the_issue_asks_for_and_checks_the_target():
    samples = [Sample(create_to_active_ms=100.0 + i, release_to_clean_ms=50.0 + i, release_to_released_ms=60.0 + i,
                      apply_attempts=1, undo_attempts=1) for i in range(60)]
    block = phase_summary(samples, 1000.0)
    for key in ("create_to_active_ms_p50", "create_to_active_ms_p95", "release_to_clean_ms_p50",
                "release_to_clean_ms_p95", "n"):
        assert key in block
    assert block["n"] == 60 and block["failures"] == []
    assert block["create_to_active_ms_p95"] == 156.0 and block["target_met"] is True
    assert block["apply_attempts_mean"] == 1.0

    slow = phase_summary(samples + [Sample(create_to_active_ms=5000.0, release_to_clean_ms=10.0)] * 10, 1000.0)
    assert slow["create_to_active_ms_p95"] == 5000.0 and slow["target_met"] is False


def test_a_failed_reservation_is_reported_and_never_meets_the_target():
    samples = [Sample(create_to_active_ms=10.0, release_to_clean_ms=10.0), Sample(error="reservation 7 failed: x")]
    block = phase_summary(samples, 1000.0)
    assert block["n"] == 1 and block["failures"] == ["reservation 7 failed: x"]
    assert block["target_met"] is False
    assert phase_summary([], 1000.0)["target_met"] is False


def test_proc_parsing():
    assert parse_status_kb(STATUS) == {"VmRSS": 30720, "VmHWM": 40960}
    assert parse_stat_ticks(STAT) == 175  # utime 150 + stime 25, despite the parentheses in the name
    assert cpu_pct(ticks=100, seconds=50, clk_tck=100) == pytest.approx(2.0)
    assert cpu_pct(ticks=5, seconds=0, clk_tck=100) == 0.0


def test_proc_snapshot_reads_this_process():
    snapshot = proc_snapshot(os.getpid())
    assert snapshot.rss_kb > 0 and snapshot.hwm_kb >= snapshot.rss_kb and snapshot.ticks >= 0


def test_footprint_block_and_targets():
    first = ProcSnapshot(at=100.0, ticks=1000, rss_kb=30 * 1024, hwm_kb=35 * 1024)
    last = ProcSnapshot(at=160.0, ticks=1060, rss_kb=31 * 1024, hwm_kb=36 * 1024)
    block = footprint(first, last, gpus=8, clk_tck=100, rss_samples_kb=[30 * 1024, 32 * 1024])
    assert block["rss_mb"] == 31.0 and block["peak_rss_mb"] == 36.0 and block["rss_mb_max_sampled"] == 32.0
    assert block["cpu_pct_one_core"] == 1.0 and block["gpus"] == 8 and block["seconds"] == 60.0
    assert block["target_met"] is True
    heavy = footprint(first, ProcSnapshot(at=160.0, ticks=1200, rss_kb=60 * 1024, hwm_kb=60 * 1024), gpus=8,
                      clk_tck=100)
    assert heavy["target_met"] is False


@pytest.mark.parametrize("wiring", ["config", "portal"])  # portal/: commits before the wiring moved out
def test_lease_path_follows_the_code(tmp_path, wiring):
    (tmp_path / wiring).mkdir()
    (tmp_path / "agent").mkdir()
    (tmp_path / wiring / "routing.py").write_text('path("ws/pools/<slug:key>/", PoolConsumer.as_asgi()),')
    assert lease_path(tmp_path) == "http-poll"
    (tmp_path / wiring / "routing.py").write_text('path("ws/agent/", AgentLeaseConsumer.as_asgi()),')
    (tmp_path / "agent" / "lease_channel.py").write_text("")
    assert lease_path(tmp_path) == "websocket"


def test_the_result_serializes_and_prints_as_a_table():
    samples = [Sample(create_to_active_ms=300.0, release_to_clean_ms=200.0, release_to_released_ms=250.0)] * 50
    process = footprint(ProcSnapshot(0.0, 0, 30720, 40960), ProcSnapshot(60.0, 60, 30720, 40960), gpus=8,
                        clk_tck=100)
    result = {"kubernetes": phase_summary(samples, 1000.0), "agent": phase_summary(samples, 2000.0),
              "agent_process": process, "machine": {"cpus": 2}}
    again = json.loads(json.dumps(result))
    assert set(again["agent_process"]) >= {"rss_mb", "peak_rss_mb", "cpu_pct_one_core", "gpus", "seconds"}
    table = format_table(again)
    assert "kubernetes" in table and "agent" in table and "300" in table and "RSS 30.0 MB" in table
