"""Does a long history slow the portal down? `python -m benchmarks.history --past 200000 --json FILE`.

A portal keeps every reservation it ever made (the history is the audit trail), so the
queries that run on every request must not read it. This gives one benchmark team
`--past` ended reservations in one pool (one GPU each, half an hour apiece, going back in
time), then times, by the wall clock in one process on PostgreSQL:

- `create (with history)`: a reservation for that team and pool through the API (its quota
  check reads the team's bookings in the pool), release included;
- `create (no history)`: the same for a team without any, the baseline beside it;
- `list (with history)` / `list (no history)`: the first page of each team's reservations
  (`GET /api/v1/reservations/?limit=20`: newest first, with the total count);
- `reservations page` and `team page` for each team, signed in as its member (the team page
  sums this month's GPU-hours per quota);
- `held now (fleet)`: the allocations held at this moment across the fleet, the read behind
  /metrics, the alert rules and the dashboards.

Needs DATABASE_URL (PostgreSQL), REDIS_URL and SECRET_KEY like `benchmarks.api`, whose
fixtures it shares; its history goes away with the benchmark's other reservations at the
start of the next run of either.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

from benchmarks.api import django_on_postgresql, write_json


def add_history(team_slug: str, pool_slug: str, count: int) -> None:
    """`count` released half-hour reservations of one GPU each, ending 100 minutes ago and earlier."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """WITH ids AS (
                   SELECT t.id AS team_id, p.id AS pool_id,
                          array(SELECT g.id FROM inventory_gpu g WHERE g.pool_id = p.id ORDER BY g.id) AS gpus
                   FROM teams_team t, inventory_gpupool p WHERE t.slug = %s AND p.slug = %s),
               r AS (
                   INSERT INTO allocations_reservation (team_id, pool_id, requested_by_id, gpus, starts_at, ends_at,
                                                        state, reason, ended_at, created_at, updated_at)
                   SELECT ids.team_id, ids.pool_id, NULL, 1, now() - (i + 30) * interval '1 minute',
                          now() - i * interval '1 minute', 'released', 'benchmark history',
                          now() - i * interval '1 minute', now() - (i + 30) * interval '1 minute', now()
                   FROM ids, generate_series(100, 99 + %s) AS i
                   RETURNING id, starts_at, ends_at)
               INSERT INTO allocations_allocation (reservation_id, gpu_id, starts_at, ends_at)
               SELECT r.id, ids.gpus[1 + r.id %% array_length(ids.gpus, 1)], r.starts_at, r.ends_at FROM r, ids""",
            [team_slug, pool_slug, count],
        )
        # As autovacuum leaves an insert-only history: statistics, and a visibility map for index-only scans.
        cursor.execute("VACUUM ANALYZE allocations_reservation")
        cursor.execute("VACUUM ANALYZE allocations_allocation")


def measure(past: int, calls: int, seed: int) -> dict[str, list[float]]:
    """Wall milliseconds of each measured call, by name."""
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.utils import timezone as dj_timezone

    from allocations.models import Allocation
    from benchmarks.api import prepare, reservation_body

    pairs = prepare(pools=16, teams=32, nodes_per_pool=4, gpus_per_node=8)
    with_history, without = pairs[0], next(p for p in pairs if p["team"] != pairs[0]["team"]
                                            and p["pool"] == pairs[0]["pool"])
    add_history(with_history["team"], with_history["pool"], past)
    client, rng = Client(), random.Random(seed)
    wall_ms: dict[str, list[float]] = defaultdict(list)
    teams = {"with history": with_history, "no history": without}
    browsers = {}  # a signed-in browser per team, for the pages
    for label, pair in teams.items():
        browsers[label] = Client()
        browsers[label].force_login(get_user_model().objects.get(auth_token__key=pair["token"]))

    def held_now() -> None:
        now = dj_timezone.now()
        Allocation.objects.filter(starts_at__lte=now, ends_at__gt=now).count()

    def timed(name: str, record: bool, send, *args, **kwargs):
        started = time.perf_counter()
        response = send(*args, **kwargs)
        if record:
            wall_ms[name].append((time.perf_counter() - started) * 1000)
        if response is not None and response.status_code >= 300:
            raise SystemExit(f"{name} answered {response.status_code}: {response.content[:300]!r}")
        return response

    for i in range(calls + 5):  # the first five warm up connections and caches
        record = i >= 5
        for label, pair in teams.items():
            headers = {"HTTP_AUTHORIZATION": f"Token {pair['token']}"}
            start = datetime.now(timezone.utc) + timedelta(minutes=rng.randrange(10, 7 * 24 * 60))
            created = timed(f"create ({label})", record, client.post, "/api/v1/reservations/",
                            json.dumps(reservation_body(pair, start, rng)), content_type="application/json", **headers)
            client.post(f"/api/v1/reservations/{created.json()['id']}/release/", **headers)
            timed(f"list ({label})", record, client.get, "/api/v1/reservations/?limit=20", **headers)
            timed(f"reservations page ({label})", record, browsers[label].get, "/reservations/")
            timed(f"team page ({label})", record, browsers[label].get, f"/teams/{pair['team']}/")
        timed("held now (fleet)", record, held_now)
    return wall_ms


def summarize(wall_ms: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    base = statistics.median(wall_ms["create (no history)"])
    # Each call's two teams side by side, in the order the calls were made.
    calls = list(dict.fromkeys(name.split(" (")[0] for name in wall_ms))
    names = sorted(wall_ms, key=lambda name: (calls.index(name.split(" (")[0]), "(no history)" in name))
    return {name: {"calls": len(wall_ms[name]), "wall_ms_median": round(statistics.median(wall_ms[name]), 3),
                   "vs_create_without_history": round(statistics.median(wall_ms[name]) / base, 2)}
            for name in names}


def format_table(summary: dict[str, dict[str, float]]) -> str:
    lines = [f"{'call':<34}{'calls':>7}{'wall ms (median)':>18}{'× create without history':>26}"]
    for name, row in summary.items():
        lines.append(f"{name:<34}{row['calls']:>7}{row['wall_ms_median']:>18}{row['vs_create_without_history']:>26}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.history", description=__doc__.split("\n\n")[0])
    parser.add_argument("--past", type=int, default=200_000, help="ended reservations given to one team in one pool")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    django_on_postgresql()
    summary = summarize(measure(args.past, args.calls, args.seed))
    print(f"Wall time per call with {args.past:,} past reservations for one team ({args.calls} calls each)")
    print(format_table(summary))
    write_json(args.json, {"past": args.past, "calls": args.calls, "results": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
