"""Does a year's usage report stay under a second? `python -m benchmarks.usage --teams 1000 --gpus 10000 --json FILE`.

Builds a year of a fleet's usage ledger straight into its own database, as the closing task
(accounting/ledger.py) would have left it: the day sums (LedgerDay) for 365 days (and from them the
month sums, LedgerMonth, by the ledger's own code), each team's
GPUs in two pools (half of them each) and booked by three of its users, and the hourly entries
(LedgerEntry, one per grant and hour; 70 % of the fleet booked each hour) for the last 30 days at
full size; older hours' entries are counted, not written (at this size a year of them is tens of
millions of rows, and no whole-day report reads them). Then it times, median of --calls, what
GET /api/v1/usage/ does for staff (accounting.selectors: the rows, the totals, rendered as JSON):
a year (the last 365 days: 11 whole months and edge days) grouped by team and by team,month, beside
the same two over one month (the last 30 days; the ratio); a window of
hours (not whole days, so read from the entries) over a week; and rebuilding one day's summary
from its entries, as closing an hour does. Reports carry their cost: the prices (_prices: a few per
model, a pool's own, one starting mid-month) are set first; the year by team is timed again without
any price (the baseline of what pricing costs).

Needs DATABASE_URL (PostgreSQL; REDIS_URL and SECRET_KEY as for the other benchmarks). It empties the
ledger's tables of that database and adds teams, users and pools prefixed `ub-`: point it at a
benchmark database, never at a portal in use.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from benchmarks.api import django_on_postgresql, write_json

PREFIX = "ub"
POOLS = 10
USERS_PER_TEAM = 3
BOOKED_SHARE = 0.7  # of the fleet's GPU-hours
ENTRY_DAYS = 30


def _fleet(teams: int) -> None:
    """Teams, users (3 each) and pools (10), with temporary tables numbering them from 0 for the fills."""
    from django.contrib.auth import get_user_model
    from django.db import connection

    from inventory.models import GpuPool
    from teams.models import Team

    User = get_user_model()
    if Team.objects.filter(slug__startswith=f"{PREFIX}-").count() != teams:
        Team.objects.bulk_create([Team(slug=f"{PREFIX}-{n:05d}", name=f"Usage bench {n}") for n in range(teams)],
                                 ignore_conflicts=True)
        User.objects.bulk_create([User(username=f"{PREFIX}-{n:05d}-{k}") for n in range(teams)
                                  for k in range(USERS_PER_TEAM)], ignore_conflicts=True)
    modes = ["exclusive", "exclusive", "time_slicing", "mig", "exclusive"]
    for p in range(POOLS):
        GpuPool.objects.get_or_create(slug=f"{PREFIX}-pool-{p}", defaults={
            "name": f"Usage bench pool {p}", "sharing_mode": modes[p % len(modes)]})
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS ub_team, ub_user, ub_pool")
        cursor.execute("CREATE TEMP TABLE ub_team AS SELECT (row_number() OVER (ORDER BY slug) - 1)::int AS n, id "
                       "FROM teams_team WHERE slug LIKE %s", [f"{PREFIX}-%"])
        cursor.execute("CREATE TEMP TABLE ub_user AS SELECT (row_number() OVER (ORDER BY username) - 1)::int AS n, id "
                       "FROM auth_user WHERE username LIKE %s", [f"{PREFIX}-%"])
        cursor.execute("CREATE TEMP TABLE ub_pool AS SELECT (row_number() OVER (ORDER BY slug) - 1)::int AS n, id, "
                       "sharing_mode AS mode FROM inventory_gpupool WHERE slug LIKE %s", [f"{PREFIX}-pool-%"])
        for table in ("ub_team", "ub_user", "ub_pool"):
            cursor.execute(f"CREATE UNIQUE INDEX ON {table} (n)")
            cursor.execute(f"ANALYZE {table}")


def fill(teams: int, gpus: int, end_day: datetime) -> dict[str, int]:
    """The year's day summary and the last ENTRY_DAYS' hourly entries; returns the row counts."""
    from django.db import connection, transaction

    from accounting.ledger import ledger_month_refresh
    from accounting.models import ClosedHour, LedgerDay, LedgerEntry, LedgerMonth

    per_team = gpus / teams
    start_day = end_day - timedelta(days=365)
    models = ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA L4", "NVIDIA A100-SXM4-80GB", "NVIDIA H200"]
    model_case = "CASE p.n %% 5 " + " ".join(f"WHEN {i} THEN '{m}'" for i, m in enumerate(models)) + " END"
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {LedgerEntry._meta.db_table}, {LedgerDay._meta.db_table}, "
                       f"{ClosedHour._meta.db_table}")
        # Day rows: team t's GPUs are in pools t % 10 and (t + 1) % 10, half each; each of its 3 users books a
        # third; booked GE-hours vary by day and team around 70 % of its GPUs x 24 h.
        cursor.execute(
            f"INSERT INTO {LedgerDay._meta.db_table} (day, team_id, user_id, pool_id, gpu_model, mode, "
            "booked_ge_hours, used_ge_hours, no_data_ge_hours, gpu_hours) "
            f"SELECT d::date, t.id, u.id, p.id, {model_case}, p.mode, "
            "b, b * (0.3 + ((t.n + k + extract(doy FROM d)::int) %% 7) / 10.0), b * 0.02, b "
            "FROM generate_series(%s::timestamptz, %s::timestamptz - interval '1 day', interval '1 day') AS d "
            "CROSS JOIN ub_team t CROSS JOIN generate_series(0, 1) AS half CROSS JOIN generate_series(0, %s) AS k "
            "JOIN ub_user u ON u.n = t.n * %s + k "
            "JOIN ub_pool p ON p.n = (t.n + half) %% 10 "
            "CROSS JOIN LATERAL (SELECT %s / 2.0 / %s * 24 * (0.5 + ((t.n * 7 + k + extract(doy FROM d)::int) "
            "%% 5) / 10.0) AS b) AS booked",
            [start_day, end_day, USERS_PER_TEAM - 1, USERS_PER_TEAM, per_team, USERS_PER_TEAM])
        day_rows = cursor.rowcount
        # Entry rows: GPU g belongs to team g % teams, in pool (team + g // teams % 2) % 10, booked 70 % of the
        # hours (a pattern that shifts by GPU and hour) by one of the team's users; no grant row behind them.
        entry_start = end_day - timedelta(days=ENTRY_DAYS)
        cursor.execute(
            f"INSERT INTO {LedgerEntry._meta.db_table} (allocation_id, reservation_id, hour, team_id, user_id, "
            "pool_id, gpu_id, gpu_model, mode, ge, milli, seconds, booked_ge_hours, used_ge_hours, "
            "no_data_ge_hours, gpu_hours, closed_at) "
            f"SELECT NULL, g * 100000 + (extract(epoch FROM h)::bigint / 86400), h, t.id, u.id, p.id, g, {model_case}, "
            "p.mode, 1.0, 1000, 3600, 1.0, ((g + extract(hour FROM h)::int) %% 10) / 10.0, 0.0, 1.0, h + interval '1 hour' "
            "FROM generate_series(0, %s) AS g "
            "CROSS JOIN generate_series(%s::timestamptz, %s::timestamptz - interval '1 hour', interval '1 hour') AS h "
            "JOIN ub_team t ON t.n = g %% %s "
            "JOIN ub_user u ON u.n = t.n * %s + (g + extract(doy FROM h)::int) %% %s "
            "JOIN ub_pool p ON p.n = (t.n + (g / %s) %% 2) %% 10 "
            "WHERE (g * 7 + extract(epoch FROM h)::bigint / 3600 / 5) %% 10 < %s",
            [gpus - 1, entry_start, end_day, teams, USERS_PER_TEAM, USERS_PER_TEAM, teams, int(BOOKED_SHARE * 10)])
        entry_rows = cursor.rowcount
        cursor.execute(f"TRUNCATE {LedgerMonth._meta.db_table}")
    # The month sums, by the code that keeps them (accounting.ledger), from the day sums.
    month = (start_day - timedelta(days=1)).date().replace(day=1)
    month_rows, rebuilds = 0, []
    while month < end_day.date():
        t0 = time.perf_counter()
        with transaction.atomic():
            month_rows += ledger_month_refresh(month=month)
        rebuilds.append((time.perf_counter() - t0) * 1000)
        month = (month + timedelta(days=32)).replace(day=1)
    with connection.cursor() as cursor:
        for model in (LedgerDay, LedgerEntry, LedgerMonth):
            cursor.execute(f"ANALYZE {model._meta.db_table}")
    return {"day_rows": day_rows, "month_rows": month_rows,
            "month_rebuild_ms_median": round(statistics.median(rebuilds), 1), "entry_rows_last_30_days": entry_rows,
            "entry_rows_a_year_would_hold": round(entry_rows * 365 / ENTRY_DAYS)}


def _prices(end_day: datetime) -> int:
    """Chargeback prices as a site might keep them: each model priced from a year back, two models repriced on
    the 1st of a month half a year ago, one pool's own price for a model, and one price starting mid-month
    (that month is then read from the day sums). Returns how many."""
    from decimal import Decimal

    from accounting.models import Price
    from inventory.models import GpuPool

    Price.objects.all().delete()
    start = (end_day - timedelta(days=400)).date().replace(day=1)
    half = (end_day - timedelta(days=180)).date().replace(day=1)
    mid = (end_day - timedelta(days=100)).date().replace(day=15)
    names = ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA L4", "NVIDIA H200"]
    pool = GpuPool.objects.get(slug=f"{PREFIX}-pool-1")
    rows = [Price(gpu_model=name, price_per_ge_hour=Decimal(2 + i), currency="CNY", valid_from=start)
            for i, name in enumerate(names)]
    rows += [Price(gpu_model=name, price_per_ge_hour=Decimal(3 + i), currency="CNY", valid_from=half)
             for i, name in enumerate(names[:2])]
    rows += [Price(gpu_model=names[1], pool=pool, price_per_ge_hour=Decimal("9.5"), currency="CNY", valid_from=start),
             Price(gpu_model=names[2], price_per_ge_hour=Decimal("1.25"), currency="CNY", valid_from=mid)]
    Price.objects.bulk_create(rows)
    return len(rows)


def _report(query) -> int:
    """What the API view does for JSON: rows, totals, rendered; returns the rows' count."""
    from accounting import selectors

    columns = selectors.usage_header(query)
    rows = [dict(zip(columns, row)) for row in selectors.usage_rows(query)]
    body = {"columns": columns, "totals": selectors.usage_totals(query), "rows": rows}
    json.dumps(body)
    return len(rows)


def _time(fn, calls: int) -> tuple[float, int]:
    fn()  # warm: plans, caches, the pages of the table
    times, out = [], 0
    for _ in range(calls):
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), out


def measure(calls: int, end_day: datetime) -> dict:
    from django.db import transaction

    from accounting.ledger import ledger_day_refresh
    from accounting.selectors import UsageQuery

    year = (end_day - timedelta(days=365), end_day)
    month = (end_day - timedelta(days=30), end_day)
    out = {}
    for label, (start, end) in (("year", year), ("month", month)):
        for group_by in (("team",), ("team", "month")):
            ms, rows = _time(lambda: _report(UsageQuery(start, end, group_by, None)), calls)
            out[f"{label}_by_{'_'.join(group_by)}"] = {"ms": round(ms, 1), "rows": rows}
    for group_by in (("team",), ("team", "month")):
        key = "_".join(group_by)
        out[f"ratio_year_to_month_by_{key}"] = round(out[f"year_by_{key}"]["ms"] / out[f"month_by_{key}"]["ms"], 2)
    # A window of hours: read from the hourly entries (a week of them, ~1.2 M rows at full size).
    week = (end_day - timedelta(days=7, hours=1), end_day - timedelta(hours=1))
    ms, rows = _time(lambda: _report(UsageQuery(*week, ("team",), None)), calls)
    out["week_of_hours_by_team"] = {"ms": round(ms, 1), "rows": rows}
    # One team's year, as a member reads it.
    from teams.models import Team

    team = Team.objects.filter(slug__startswith=f"{PREFIX}-").order_by("slug").values_list("pk", flat=True).first()
    ms, rows = _time(lambda: _report(UsageQuery(*year, ("pool", "month"), frozenset([team]))), calls)
    out["year_one_team_by_pool_month"] = {"ms": round(ms, 1), "rows": rows}

    def refresh() -> int:
        with transaction.atomic():
            return ledger_day_refresh(day=(end_day - timedelta(days=1)).date())

    ms, rows = _time(refresh, max(1, calls // 2))
    out["day_summary_rebuild"] = {"ms": round(ms, 1), "rows": rows}
    # The baseline of the cost: the same year by team with no price at all (no cost to compute).
    from accounting.models import Price

    Price.objects.all().delete()
    ms, rows = _time(lambda: _report(UsageQuery(*year, ("team",), None)), calls)
    out["year_by_team_without_prices"] = {"ms": round(ms, 1), "rows": rows}
    out["ratio_year_by_team_priced_to_unpriced"] = round(out["year_by_team"]["ms"] / ms, 2)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teams", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=10000)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    django_on_postgresql()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    end_day = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    t0 = time.perf_counter()
    _fleet(args.teams)
    rows = fill(args.teams, args.gpus, end_day)
    built_s = time.perf_counter() - t0
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_size_pretty(pg_total_relation_size('accounting_ledgerday')), "
                       "pg_size_pretty(pg_total_relation_size('accounting_ledgerentry'))")
        day_size, entry_size = cursor.fetchone()
    prices = _prices(end_day)
    timings = measure(args.calls, end_day)
    result = {"teams": args.teams, "gpus": args.gpus, "calls": args.calls, "built_seconds": round(built_s, 1),
              "prices": prices,
              "ledger": {**rows, "day_table_size": day_size, "entry_table_size": entry_size},
              "timings_ms_median": timings, "target": "one-year report under 1000 ms"}
    print(json.dumps(result, indent=2))
    write_json(args.json, result)


if __name__ == "__main__":
    main()
