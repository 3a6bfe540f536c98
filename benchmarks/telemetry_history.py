"""Does a pool's history stay fast as the fleet grows? `python -m benchmarks.telemetry_history --fleets 1000,10000`.

The pool page and `GET /api/v1/pools/<slug>/telemetry/?range=` read the last 15 minutes
(raw samples), 24 hours (minute rollups) or 30 days (hour rollups) of one pool's GPUs.
This fills the three tables as a fleet of each size in `--fleets` would have them full
(every GPU reporting every second for the last 15 minutes, a minute row per GPU for 24
hours, an hour row for 30 days; written straight into the tables with generate_series,
as the ingest and the rollup task would have left them), then times
`monitoring.selectors.pool_history` for one pool of `--pool-gpus` GPUs, by the wall clock,
median of `--calls`. The smallest fleet is the baseline: each row gives its time as a
multiple of the same range on that fleet.

Needs DATABASE_URL (PostgreSQL; REDIS_URL and SECRET_KEY as for the other benchmarks).
It empties the raw-sample and rollup tables of that database before and after: point it at
a benchmark database, never at a portal in use.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from benchmarks.api import django_on_postgresql, write_json

RANGES = ("15m", "24h", "30d")
# Synthetic GPU ids, far from any real ones; the pool measured is the first --pool-gpus of them.
FIRST_GPU = 10_000_000


def fill(first: int, count: int, now: int) -> None:
    """Give GPUs first .. first+count-1 a full history at `now` in all three tables."""
    from django.db import connection

    from monitoring.models import HourRollup, MinuteRollup, Sample

    gpus = f"generate_series({first}, {first + count - 1}) AS g"
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {Sample._meta.db_table} "
            "(gpu_id, pool_id, ts, util, mem_util, mem_used, mem_total, temp, power) "
            f"SELECT g, NULL, t, (g + t) %% 101, (g + t) %% 51, 800 * ((g + t) %% 101), 81559, 35 + (g + t) %% 50, "
            f"100.0 + (g + t) %% 600 FROM {gpus}, generate_series(%s, %s) AS t",
            [now - 15 * 60, now])
        for model, step, span in ((MinuteRollup, 60, 86400), (HourRollup, 3600, 30 * 86400)):
            cursor.execute(
                f"INSERT INTO {model._meta.db_table} (gpu_id, pool_id, bucket, n, util_avg, util_max, mem_util_avg, "
                "mem_util_max, mem_used_avg, mem_used_max, mem_total, temp_avg, temp_max, power_avg, power_max) "
                f"SELECT g, NULL, b, {step}, (g + b) %% 101, (g + b) %% 101, (g + b) %% 51, (g + b) %% 51, "
                "800.0 * ((g + b) %% 101), 800 * ((g + b) %% 101), 81559, 35 + (g + b) %% 50, 35 + (g + b) %% 50, "
                f"100.0 + (g + b) %% 600, 100.0 + (g + b) %% 600 FROM {gpus}, "
                f"generate_series(%s, %s, {step}) AS b",
                [(now - span) - (now - span) % step, now - now % step])
        for model in (Sample, MinuteRollup, HourRollup):
            cursor.execute(f"ANALYZE {model._meta.db_table}")


def empty() -> None:
    from django.db import connection

    from monitoring.models import HourRollup, MinuteRollup, Sample

    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {Sample._meta.db_table}, {MinuteRollup._meta.db_table}, "
                       f"{HourRollup._meta.db_table}")


def measure(fleets: list[int], pool_gpus: int, calls: int) -> dict[int, dict[str, list[float]]]:
    """Wall milliseconds of pool_history per range, by fleet size."""
    from django.core.management import call_command

    from monitoring.selectors import pool_history

    call_command("migrate", verbosity=0)
    empty()
    now = int(time.time())
    pool = list(range(FIRST_GPU, FIRST_GPU + pool_gpus))
    results: dict[int, dict[str, list[float]]] = {}
    filled = 0
    try:
        for fleet in sorted(fleets):
            fill(FIRST_GPU + filled, fleet - filled, now)
            filled = fleet
            results[fleet] = {}
            for range_key in RANGES:
                pool_history(pool, range_key, now=now)  # warm the plan and the cache pages
                times = []
                for _ in range(calls):
                    started = time.perf_counter()
                    history = pool_history(pool, range_key, now=now)
                    times.append((time.perf_counter() - started) * 1000)
                if len(history.series) != pool_gpus:
                    raise SystemExit(f"{range_key}: history of {len(history.series)} GPUs, expected {pool_gpus}")
                results[fleet][range_key] = times
    finally:
        empty()
    return results


def summarize(results: dict[int, dict[str, list[float]]]) -> list[dict]:
    base_fleet = min(results)
    rows = []
    for fleet, by_range in sorted(results.items()):
        for range_key, times in by_range.items():
            median = statistics.median(times)
            base = statistics.median(results[base_fleet][range_key])
            rows.append({"fleet_gpus": fleet, "range": range_key, "calls": len(times),
                         "wall_ms_median": round(median, 2), "vs_smallest_fleet": round(median / base, 2)})
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [f"{'fleet GPUs':>11}{'range':>7}{'calls':>7}{'wall ms (median)':>18}{'× smallest fleet':>18}"]
    for row in rows:
        lines.append(f"{row['fleet_gpus']:>11,}{row['range']:>7}{row['calls']:>7}{row['wall_ms_median']:>18}"
                     f"{row['vs_smallest_fleet']:>18}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.telemetry_history",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--fleets", default="1000,10000", help="fleet sizes in GPUs, comma-separated")
    parser.add_argument("--pool-gpus", type=int, default=100, help="GPUs of the pool whose history is read")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    fleets = [int(f) for f in args.fleets.split(",")]
    if min(fleets) < args.pool_gpus:
        raise SystemExit("every fleet must hold the pool: --fleets must be at least --pool-gpus")
    django_on_postgresql()
    rows = summarize(measure(fleets, args.pool_gpus, args.calls))
    print(f"pool_history of a {args.pool_gpus}-GPU pool by fleet size ({args.calls} calls each)")
    print(format_table(rows))
    write_json(args.json, {"pool_gpus": args.pool_gpus, "calls": args.calls, "results": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
