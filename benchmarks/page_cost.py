"""What each page and API call costs the web process with nothing else running: `python -m benchmarks.page_cost
--json FILE` against the database DATABASE_URL names (e.g. the fleet benchmark's, which `make benchmark-fleet`
leaves behind: `make benchmark-page-cost`).

The fleet benchmark measures calls under load, where a slow call cannot be told from one that queued
behind others. This one signs in the first member of a team and calls each of the fleet benchmark's
user calls in one process through Django's request handler (no HTTP server, no other load), `--calls`
times after one warm-up call, and reports the median and worst wall time and the queries each sent.
`/api/v1/me/` is the baseline beside them (the smallest authenticated call): the ratios are what
counts on this machine, whose speed drifts.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

BASELINE = "api GET me"


def calls_of(member) -> dict[str, str]:
    """The fleet benchmark's user calls (benchmarks.fleet), for one member of a team."""
    from allocations.models import Reservation
    from inventory.models import GpuPool

    pool = GpuPool.objects.order_by("slug").first()
    reservation = Reservation.objects.filter(team=member.team).order_by("-pk").first()
    calls = {"page /": "/", "page /reserve/": "/reserve/", "page /reservations/": "/reservations/",
             "page team": f"/teams/{member.team.slug}/"}
    if reservation is not None:
        calls["page reservation"] = f"/reservations/{reservation.pk}/"
    if pool is not None:
        calls["page pool"] = f"/pools/{pool.slug}/"
        calls["api GET availability"] = f"/api/v1/pools/{pool.slug}/availability/?gpus=1"  # as benchmarks.fleet asks
    calls.update({"api GET reservations": "/api/v1/reservations/", "api GET pools": "/api/v1/pools/",
                  BASELINE: "/api/v1/me/"})
    return calls


def measure(calls_per_url: int = 5) -> dict:
    from django.conf import settings
    from django.db import connection, reset_queries
    from django.test import Client

    from teams.models import Membership

    member = Membership.objects.select_related("user", "team").order_by("pk").first()
    if member is None:
        raise SystemExit("no team member in this database: run the fleet benchmark (or `make run`) first")
    client = Client()
    client.force_login(member.user)
    results = {}
    for name, url in calls_of(member).items():
        client.get(url)  # warm: templates, the content-type cache, the pool's frame
        times, queries, status = [], 0, None
        for _ in range(calls_per_url):
            settings.DEBUG = True  # for connection.queries; the handler does not read it per request
            reset_queries()
            started = time.perf_counter()
            response = client.get(url)
            times.append((time.perf_counter() - started) * 1000)
            settings.DEBUG = False
            queries, status = len(connection.queries), response.status_code
        results[name] = {"url": url, "status": status, "median_ms": round(statistics.median(times), 1),
                         "worst_ms": round(max(times), 1), "queries": queries}
    base = results[BASELINE]["median_ms"]
    for row in results.values():
        row["x_baseline"] = round(row["median_ms"] / base, 2) if base else None
    return {"member": member.user.username, "team": member.team.slug, "calls": calls_per_url, "results": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5, help="timed calls of each URL, after one warm-up call")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import django

    django.setup()
    from django.db import connection

    found = measure(args.calls)
    print(f"database {connection.settings_dict['NAME']}, as {found['member']} of {found['team']}, "
          f"median of {args.calls} calls each")
    print(f"{'call':24} {'status':>6} {'median ms':>10} {'worst ms':>9} {'queries':>8} {'x ' + BASELINE:>14}")
    for name, row in found["results"].items():
        print(f"{name:24} {row['status']:>6} {row['median_ms']:>10.1f} {row['worst_ms']:>9.1f} {row['queries']:>8} "
              f"{row['x_baseline']:>14}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**found, "database": connection.settings_dict["NAME"],
                                         "load_avg": os.getloadavg()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
