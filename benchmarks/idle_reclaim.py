"""What would idle reclaim give back? `python -m benchmarks.idle_reclaim --json FILE` (`make benchmark-idle-reclaim`).

GE-hours per day that the policy (monitoring.idle.decide, the sweep's own decision, replayed once a
simulated minute as beat runs it) returns to the pool at a few (warn, release) settings, beside the
baseline without reclaim (nothing returned) and the idle GE-hours booked per day (the most any policy
could return). Two inputs, and what they are:

- `demo`: bookings drawn as the embedded demo's simulated users make them (config/demo_users.py: 1 or 2
  whole GPUs for 20-90 min, back to back on the demo's 4 L40S cards, 30 % released early at a random
  point), for --days days; which ones sit idle is the demo's own rule (agent.simulated.idle_on_purpose:
  4 % of bookings, chosen by id, idle from start to end). Every other booking's telemetry is busy
  from start to end, as the demo's simulated workloads are: so no busy booking is ever released.
- `trace`: the GPU tasks of the Alibaba GPU-sharing trace (cluster-trace-gpu-v2023, ../shared/data;
  its creation and deletion times, GPUs x milli-GPU as GE), with the same 4 % made idle. The trace
  records no utilization: which tasks idle is our assumption, not the trace's.

Neither is real telemetry of idle users, whose jobs often run, then sit idle for the rest of a
booking: the figures show how much of a whole-booking idle the policy's latency (warn + release +
the sweep's minute) leaves booked, for the booking lengths each input has. Pure Python, no database;
speed does not matter here.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from benchmarks.placement_trace import DEFAULT_TRACE

SETTINGS = [(15, 15), (30, 30), (60, 30), (60, 60), (120, 60)]  # (warn, release) minutes
SWEEP = timedelta(minutes=1)
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Booking:
    id: int
    start: datetime
    end: datetime
    ge: float
    idle: bool


def demo_bookings(days: int, gpus: int = 4, seed: int = 7) -> list[Booking]:
    from agent.simulated import idle_on_purpose
    from config.demo_users import EARLY_RELEASE_CHANCE

    rng = random.Random(seed)
    free_at = [EPOCH] * gpus
    out, next_id, horizon = [], 1, EPOCH + timedelta(days=days)
    while min(free_at) < horizon:
        size = rng.choice((1, 1, 2))
        slots = sorted(range(gpus), key=lambda g: free_at[g])[:size]
        start = max(free_at[g] for g in slots)
        end = start + timedelta(minutes=rng.randrange(20, 91, 5))
        if rng.random() < EARLY_RELEASE_CHANCE:
            end = start + (end - start) * rng.random()
        for g in slots:
            free_at[g] = end
        out.append(Booking(next_id, start, end, float(size), idle_on_purpose({"reservation": next_id})))
        next_id += 1
    return [b for b in out if b.start < horizon]


def trace_bookings(path: Path) -> list[Booking]:
    from agent.simulated import idle_on_purpose
    from allocations import units

    out = []
    with path.open() as f:
        for i, row in enumerate(csv.DictReader(f), start=1):
            if int(row["num_gpu"] or 0) == 0 or not row.get("deletion_time"):
                continue
            start = EPOCH + timedelta(seconds=int(row["creation_time"]))
            end = EPOCH + timedelta(seconds=int(row["deletion_time"]))
            if end <= start:
                continue
            out.append(Booking(i, start, end, int(row["num_gpu"]) * units.ge(int(row["gpu_milli"])),
                               idle_on_purpose({"reservation": i})))
    return out


def released_at(booking: Booking, warn: timedelta, release: timedelta) -> datetime | None:
    """When the sweep (once a minute from the booking's start) releases this booking, by the policy's own
    decisions on the evidence its telemetry gives; None when it ends first."""
    from monitoring.idle import RELEASE, WARN, Idleness, decide

    if not booking.idle:
        return None  # busy from start to end: every sweep sees activity now
    first_minute = booking.start.replace(second=0, microsecond=0)
    if first_minute < booking.start:
        first_minute += timedelta(minutes=1)
    warned_at, now = None, booking.start + SWEEP
    while now < booking.end:
        seen = Idleness(idle_since=first_minute, last_active=None, covered=True, peak_util=0, peak_memory_mib=3)
        step = decide(seen=seen, warned_at=warned_at, now=now, warn=warn, release=release)
        if step == WARN:
            warned_at = now
        elif step == RELEASE:
            return now
        now += SWEEP
    return None


def replay(bookings: list[Booking]) -> dict:
    span_days = (max(b.end for b in bookings) - min(b.start for b in bookings)).total_seconds() / 86400
    booked = sum(b.ge * (b.end - b.start).total_seconds() / 3600 for b in bookings)
    idle = sum(b.ge * (b.end - b.start).total_seconds() / 3600 for b in bookings if b.idle)
    rows = [{"warn_min": 0, "release_min": 0, "policy": "no reclaim (baseline)", "released": 0,
             "ge_hours_returned_per_day": 0.0, "of_idle_pct": 0.0}]
    for warn, release in SETTINGS:
        returned, released = 0.0, 0
        for b in bookings:
            at = released_at(b, timedelta(minutes=warn), timedelta(minutes=release))
            if at is not None:
                released += 1
                returned += b.ge * (b.end - at).total_seconds() / 3600
        rows.append({"warn_min": warn, "release_min": release, "policy": f"warn {warn} min, release {release} min later",
                     "released": released, "ge_hours_returned_per_day": round(returned / span_days, 2),
                     "of_idle_pct": round(100 * returned / idle, 1) if idle else 0.0})
    return {"bookings": len(bookings), "idle_bookings": sum(b.idle for b in bookings), "days": round(span_days, 1),
            "ge_hours_booked_per_day": round(booked / span_days, 1),
            "idle_ge_hours_booked_per_day": round(idle / span_days, 2), "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--days", type=int, default=30, help="days of demo-like bookings")
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    result = {"demo": replay(demo_bookings(args.days))}
    if args.trace.exists():
        result["trace"] = replay(trace_bookings(args.trace))
    for name, r in result.items():
        print(f"\n{name}: {r['bookings']} bookings ({r['idle_bookings']} idle) over {r['days']} days, "
              f"{r['ge_hours_booked_per_day']} GE-h booked/day, {r['idle_ge_hours_booked_per_day']} of them idle")
        print(f"{'policy':<36} {'released':>9} {'GE-h back/day':>14} {'of idle':>8}")
        for row in r["rows"]:
            print(f"{row['policy']:<36} {row['released']:>9} {row['ge_hours_returned_per_day']:>14.2f} "
                  f"{row['of_idle_pct']:>7.1f}%")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
