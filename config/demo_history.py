"""A few months of past GPU use for the embedded demo, so the Reports page and the monthly statements have
something to show: bookings of the demo teams in the three whole months before this one and this month
so far, the telemetry of those hours (minute rollups, busy or idle as each booking's habit says), then the
ledger closed over their hours by its own code (accounting.ledger) and the past months' statements frozen
(accounting.services). Chargeback prices are set from the first of those months.

Deterministic under its seed for a given `now` (the months are the ones before it). Kept small (about
12 bookings a month, one to six hours each): the telemetry is one row per GPU and minute, and loading it
must stay quick at start-up (well under 5 s on SQLite).
"""
from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction

from accounting.ledger import ledger_hours_close
from accounting.models import Price
from accounting.services import statements_close_due
from allocations import units
from allocations.models import Allocation, Reservation
from inventory.models import Gpu, GpuModel, GpuPool
from monitoring.models import MinuteRollup
from teams.models import Membership, Team

SEED = 2026
MONTHS = 3
BOOKINGS_PER_MONTH = 12
HOUR = timedelta(hours=1)
# Who books what, and how busy they keep it: (team, pool, most GPUs or shares, busy share of each hour).
HABITS = [("vision", "h100", 4, 0.75), ("vision", "l40s", 2, 0.45), ("nlp", "h100", 2, 0.55),
          ("nlp", "l40s", 2, 0.25), ("nlp", "l4-shared", 2, 0.35), ("vision", "l4-shared", 1, 0.6)]
# CNY per GE-hour; the H100's price drops at the start of last month (a price change, kept as history).
PRICES = {"NVIDIA H100 80GB HBM3": "12.00", "NVIDIA A100-SXM4-80GB": "8.00", "NVIDIA L40S": "4.50",
          "NVIDIA L4": "3.00"}


def _month_start(value: datetime, back: int = 0) -> datetime:
    index = value.year * 12 + value.month - 1 - back
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)


def plan(start: datetime, end: datetime, rng: random.Random) -> list[tuple]:
    """The bookings of [start, end): (begin, finish, team, pool, GPUs or shares, busy share), by begin."""
    bookings = []
    month = start
    while month < end:
        following = _month_start(month + timedelta(days=32))
        hours = int((min(following, end) - month) / HOUR)
        for _ in range(BOOKINGS_PER_MONTH * hours // (31 * 24) or 1):
            team, pool, most, busy = rng.choice(HABITS)
            begin = month + rng.randrange(0, max(1, hours - 8)) * HOUR + timedelta(minutes=rng.choice([0, 15, 30]))
            length = timedelta(minutes=rng.randrange(60, 6 * 60, 30))
            bookings.append((begin, min(begin + length, end), team, pool, rng.randint(1, most), busy))
        month = following
    return sorted(bookings)


@transaction.atomic
def load_demo_history(now: datetime, seed: int = SEED) -> dict[str, int]:
    """Book, measure and account the demo's past months (see the module); returns what it wrote."""
    now = now.astimezone(UTC)
    start = _month_start(now, MONTHS)
    end = now.replace(minute=0, second=0, microsecond=0) - 3 * HOUR  # the live ledger closes from here on
    this_month = _month_start(now)
    last_month = _month_start(now, 1)
    for model, price in PRICES.items():
        Price.objects.create(gpu_model=model, price_per_ge_hour=Decimal(price), currency="CNY", valid_from=start.date())
    Price.objects.create(gpu_model="NVIDIA H100 80GB HBM3", price_per_ge_hour=Decimal("10.00"), currency="CNY",
                         valid_from=last_month.date())

    teams = {team.slug: team for team in Team.objects.all()}
    members = {slug: list(Membership.objects.filter(team__slug=slug).order_by("user__username")
                          .values_list("user_id", flat=True)) for slug in teams}
    pools = {pool.slug: pool for pool in GpuPool.objects.all()}
    weights = {m.name: float(m.weight) for m in GpuModel.objects.all()}
    gpus = {slug: list(Gpu.objects.filter(pool=pool).order_by("pk")) for slug, pool in pools.items()}
    free_from: dict[tuple[int, int], datetime] = {}  # (gpu, share) -> when it is free again

    bookings = plan(start, end, random.Random(seed))

    rollups, made = [], 0
    for begin, finish, team, pool_slug, count, busy in bookings:
        if finish <= begin or team not in teams or pool_slug not in pools or not members.get(team):
            continue
        pool = pools[pool_slug]
        shared = pool.sharing_mode == "time_slicing"
        # Whole GPUs: `count` free cards, one grant each. Shares: `count` adjacent free shares of one card,
        # one grant (as the placement makes them).
        replicas = int(pool.sharing_config.get("replicas", 1)) if shared else 1
        milli_each = units.MILLI_PER_GPU // replicas
        if shared:
            runs = [(gpu, k, count) for gpu in gpus[pool_slug] for k in range(replicas - count + 1)
                    if all(free_from.get((gpu.pk, j), start) <= begin for j in range(k, k + count))][:1]
        else:
            runs = [(gpu, 0, 1) for gpu in gpus[pool_slug] if free_from.get((gpu.pk, 0), start) <= begin][:count]
        if not runs or (not shared and len(runs) < count):
            continue
        user = members[team][(begin.day + begin.hour) % len(members[team])]
        weight = weights.get(runs[0][0].model_name, 1.0)
        grants = [(gpu, k, n, milli_each * n, units.ge(milli_each * n, weight)) for gpu, k, n in runs]
        # bulk_create: history, not a change someone made now (no audit entries, no notices).
        [reservation] = Reservation.objects.bulk_create([Reservation(
            team=teams[team], pool=pool, requested_by_id=user, mode=pool.sharing_mode, gpus=1 if shared else count,
            shares=count if shared else None, ge=sum(g[4] for g in grants), starts_at=begin, ends_at=finish,
            state=Reservation.State.RELEASED, ended_at=finish)])
        Allocation.objects.bulk_create([
            Allocation(reservation=reservation, gpu=gpu, starts_at=begin, ends_at=finish, mode=pool.sharing_mode,
                       ge=ge, milli=milli, share_from=k * milli_each, share_to=k * milli_each + milli)
            for gpu, k, n, milli, ge in grants])
        made += 1
        for gpu, k, n, _, _ in grants:
            for j in range(k, k + n):
                free_from[(gpu.pk, j)] = finish
        slots = [(gpu, k) for gpu, k, *_ in grants]
        # Its telemetry, minute by minute: busy for the habit's share of each hour, idle after; the last
        # 5 % of the booking without telemetry (an agent that went quiet), counted apart by the ledger.
        minutes = int((finish - begin).total_seconds() // 60)
        measured = int(minutes * 0.95)
        for gpu in {gpu for gpu, _ in slots}:
            for i in range(measured):
                at = begin + timedelta(minutes=i)
                on = at.minute < busy * 60
                rollups.append(MinuteRollup(
                    gpu_id=gpu.pk, pool_id=pool.pk, bucket=int(at.timestamp()), n=60, util_avg=85.0 if on else 1.0,
                    util_max=95 if on else 3, mem_util_avg=40.0 if on else 0.0, mem_util_max=45 if on else 0,
                    mem_used_avg=float(gpu.memory_mib // 2) if on else 0.0, mem_used_max=gpu.memory_mib // 2 if on else 0,
                    mem_total=gpu.memory_mib, temp_avg=70.0 if on else 35.0, temp_max=75 if on else 36,
                    power_avg=500.0 if on else 60.0, power_max=600 if on else 65))
    MinuteRollup.objects.bulk_create(rollups, batch_size=2000, ignore_conflicts=True)

    # Close every hour a booking touched, and each past month's last hour (a month is final once its last
    # hour is): final where the late-telemetry grace has passed, as the ledger's own run would.
    grace = timedelta(seconds=settings.USAGE_LATE_TELEMETRY_SECONDS)
    hours = set()
    for begin, finish, *_ in bookings:
        hour = begin.replace(minute=0)
        while hour < finish:
            hours.add(hour)
            hour += HOUR
    month = start
    while month < this_month:
        month = _month_start(month + timedelta(days=32))
        hours.add(month - HOUR)
    entries = ledger_hours_close(hours=[(hour, hour + HOUR + grace <= now) for hour in sorted(hours) if hour < end],
                                 now=now)
    statements = statements_close_due(now=now)
    return {"reservations": made, "minute_rollups": len(rollups), "hours": len(hours), "entries": entries,
            "statements": statements}
