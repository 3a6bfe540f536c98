"""The fleet benchmark at a tiny size, end to end: both portals built in their own databases, served by the
Procfile's processes (web, ws, worker, beat) and loaded; the JSON has every call measured on both portals."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from django.conf import settings

from benchmarks.fleet import APIS, PAGES, TELEMETRY, compare, format_table

ROOT = Path(__file__).resolve().parents[2]


def _portal(calls: dict) -> dict:
    return {"calls": {name: {"requests": 3, "p50_ms": 10.0, "p95_ms": p95, "p99_ms": p95, "statuses": {"200": 3}}
                      for name, p95 in calls.items()}}


def test_compare_gives_the_ratio_to_the_empty_portal_and_the_targets():
    names = PAGES + APIS + [TELEMETRY]
    fleet = _portal({name: 600.0 if name == "page /" else 100.0 for name in names})
    empty = _portal({name: 50.0 for name in names})
    rows = {row["call"]: row for row in compare(empty, fleet)}
    assert list(rows) == names
    assert rows["page /"]["p95_vs_empty"] == 12.0 and rows["page /"]["met"] is False  # target 500 ms
    assert rows["page pool"]["met"] is True
    assert rows["api POST create"]["target_p95_ms"] == 250.0
    assert rows[TELEMETRY]["p95_vs_empty"] == 2.0
    table = format_table(list(rows.values())).splitlines()
    assert len(table) == len(names) + 1 and "NO" in table[1]


def test_a_call_never_measured_has_not_met_its_target():
    rows = compare(_portal({}), _portal({}))
    assert not any(row["met"] for row in rows)
    assert all(row["p95_vs_empty"] is None for row in rows)


@pytest.mark.integration
def test_a_tiny_fleet_run_measures_every_call(tmp_path):
    database = urlsplit(os.environ["DATABASE_URL"])
    base = settings.DATABASES["default"]["NAME"].removeprefix("test_")
    suite_db = redis.connection.parse_url(settings.REDIS_URL).get("db", 0)
    fleet_db, empty_db = [n for n in (13, 12, 11) if n != suite_db][:2]
    redis_url = urlsplit(settings.REDIS_URL)
    env = dict(os.environ, DATABASE_URL=database._replace(path=f"/{base}_fleetbench").geturl(),
               REDIS_URL=redis_url._replace(path=f"/{fleet_db}", query="").geturl(), SECRET_KEY="bench-only")
    out = tmp_path / "fleet.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.fleet", "--gpus", "16", "--teams", "3", "--users", "6",
         "--history-per-team", "5", "--seconds", "6", "--warmup", "4", "--think", "0.1", "--watchers", "2",
         "--empty-database-url", database._replace(path=f"/{base}_fleetbench_empty").geturl(),
         "--empty-redis-url", redis_url._replace(path=f"/{empty_db}", query="").geturl(), "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["fleet"]["rows"]["gpus"] == 16 and result["fleet"]["rows"]["hosts"] == 2
    assert result["fleet"]["rows"]["reservations"] > 0 and result["fleet"]["rows"]["allocations"] > 0
    assert result["empty"]["rows"]["gpus"] == 8 and result["empty"]["rows"]["teams"] == 1
    rows = result["comparison"]
    assert [row["call"] for row in rows] == PAGES + APIS + [TELEMETRY]
    for row in rows:  # every page and call measured on both portals, and answered as it should be
        assert row["requests"] > 0 and row["empty_requests"] > 0, row
        assert set(row["statuses"]) <= {"200", "201"}, row
        assert row["p95_ms"] > 0 and row["p95_vs_empty"] is not None
        assert isinstance(row["met"], bool) and row["target_p95_ms"] in (250.0, 500.0)
    for label in ("empty", "fleet"):
        portal = result[label]
        assert set(portal["processes"]) == {"web", "ws", "worker", "beat", "agents", "users"}
        assert all(p["peak_rss_mib"] > 0 for p in portal["processes"].values())
        telemetry = portal["telemetry"]
        assert telemetry["offered_samples_per_s"] == telemetry["hosts"] * 8
        assert telemetry["achieved_samples_per_s"] > 0 and telemetry["refused_samples"] == 0
        assert portal["lease_channels"]["open_at_start"] == telemetry["hosts"]
        assert portal["users"]["watchers_connected"] == 2
    assert "Fleet:" in run.stdout and "agent POST telemetry" in run.stdout
