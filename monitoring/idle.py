"""Idle GPUs: the one rule of what "idle" means, and the idle reclaim of pools that opt in.

Idle is what the rest of monitoring already calls idle, read from the two places telemetry lives:

- now (the hot cache, monitoring.hot): a share is busy when a process of its lease uses memory
  (processes attributed at ingest, monitoring.shares); on a card whose processes were not attributed,
  when the card's utilization is above TELEMETRY_IDLE_UTIL_PCT or any process runs on it. This is
  what the dashboard's "booked but idle" counts (selectors.pool_activity reads `share_busy`).
- history (the minute rollups): a minute is busy when its average utilization is above
  TELEMETRY_IDLE_UTIL_PCT, or its average memory in use reaches USAGE_BUSY_MEMORY_MIB (a process holds
  the card; an idle card shows a few MiB). The usage ledger counts "used" GE-hours by the same rule.
  Rollups are per card, so on a shared card another holder's use keeps a share from reading idle:
  the policy errs towards keeping.

The sweep (`idle_reclaim_sweep`, run by beat every IDLE_RECLAIM_SWEEP_SECONDS) looks only at pools with
`idle_reclaim` on. For each active reservation there it reads the evidence of its GPUs since it
started: the last busy minute, and from then on the peaks. All of its GPUs idle for the pool's
idle_warn_minutes: a warning (allocations.services.reservation_idle_warn: mail, channels, a banner on
its page). Still idle idle_release_minutes after the warning: released through the normal undo path
with the evidence in its history (reservation_idle_release). Activity after the warning calls the
release off (reservation_idle_cancel), and a reservation its team marked keep is left alone. Minutes
without telemetry are not evidence of idleness: when too few of them have data, nothing is done.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db.models import Count, Max, Q
from django.utils import timezone

from allocations import services as allocation_services
from allocations.models import Allocation, Reservation
from inventory.models import GpuPool
from monitoring import hot
from monitoring.models import MinuteRollup

log = logging.getLogger(__name__)

MINUTE = 60
# Of the finished minutes an idle spell spans, at least this part must have telemetry on every GPU of the
# reservation for the spell to count (an agent that stopped reporting is not an idle GPU).
MIN_COVERAGE = 0.8
# The newest minute is rolled up a little after it ends (rollup.GRACE plus the beat's period): minutes this
# recent are not expected to be there yet.
ROLLUP_LAG_SECONDS = 120


def busy_minute() -> Q:
    """A minute rollup in which its GPU was in use (the history's side of the rule; see the module)."""
    return Q(util_avg__gt=settings.TELEMETRY_IDLE_UTIL_PCT) | Q(mem_used_avg__gte=settings.USAGE_BUSY_MEMORY_MIB)


def card_busy(sample: hot.Latest) -> bool:
    """A card is busy now when its utilization is above the idle threshold or any process runs on it."""
    return sample.util > settings.TELEMETRY_IDLE_UTIL_PCT or bool(sample.processes)


def share_busy(sample: hot.Latest, reservation_id: int) -> bool:
    """Whether one reservation's share of a card is busy now, from the card's hot entry: its own processes'
    memory where the ingest attributed them; else (no process data, or a booking newer than the ingest's
    holder map) the card as a whole."""
    used = {r: mib for r, _, mib, _ in sample.shares if r is not None}
    if sample.processes and reservation_id in used:
        return used[reservation_id] > 0
    return card_busy(sample)


@dataclass(frozen=True)
class Idleness:
    """What the telemetry says of one reservation's GPUs at `now`."""

    idle_since: datetime  # `now` when it is busy now
    last_active: datetime | None  # the end of its last busy minute (or now), None if never busy
    covered: bool  # enough minutes of the idle spell have telemetry on every GPU
    peak_util: int
    peak_memory_mib: int

    def idle_for(self, now: datetime) -> timedelta:
        return now - self.idle_since if self.covered else timedelta(0)

    def evidence(self) -> allocation_services.IdleEvidence:
        return allocation_services.IdleEvidence(since=self.idle_since, peak_util=self.peak_util,
                                                peak_memory_mib=self.peak_memory_mib)


def _epoch(value: datetime) -> int:
    return int(value.timestamp())


def _at(epoch: int) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def idleness(*, reservation_id: int, started_at: datetime, gpus: list[tuple[int, int]], now: datetime,
             latest: dict[int, hot.Latest]) -> Idleness:
    """The idle evidence of one reservation holding `gpus` ((gpu id, node id)) since `started_at`: three
    queries of the minute rollups and the GPUs' hot entries (`latest`, read once for the sweep)."""
    gpu_ids = [g for g, _ in gpus]
    if any(share_busy(latest[g], reservation_id) for g in gpu_ids if g in latest):
        return Idleness(now, now, True, 0, 0)
    first = -(-_epoch(started_at) // MINUTE) * MINUTE  # its first whole minute: the one before is another's
    end = _epoch(now)
    minutes = MinuteRollup.objects.filter(gpu_id__in=gpu_ids, bucket__gte=first, bucket__lt=end)
    last_busy = minutes.filter(busy_minute()).aggregate(last=Max("bucket"))["last"]
    since = first if last_busy is None else last_busy + MINUTE
    spell = list(minutes.filter(bucket__gte=since).values("gpu_id").order_by()
                 .annotate(n=Count("bucket"), util=Max("util_max"), memory=Max("mem_used_max"))
                 .values_list("gpu_id", "n", "util", "memory"))
    expected = max(0, (end - ROLLUP_LAG_SECONDS - since) // MINUTE)
    counted = {gpu_id: n for gpu_id, n, _, _ in spell}
    # No finished minute since its last busy one: busy until just now, which needs no more evidence.
    covered = all(counted.get(g, 0) >= MIN_COVERAGE * expected for g in gpu_ids)
    return Idleness(_at(since), None if last_busy is None else _at(last_busy + MINUTE), covered,
                    max((u or 0 for _, _, u, _ in spell), default=0), max((m or 0 for _, _, _, m in spell), default=0))


def idle_reclaim_sweep(*, now: datetime | None = None) -> dict[str, int]:
    """Warn, release or call off per the policy of every pool that has idle reclaim on (see the module).
    Returns how many reservations it warned, released, called off, and found without enough telemetry."""
    now = now or timezone.now()
    counts: dict[str, int] = defaultdict(int)
    pools = {p.pk: p for p in GpuPool.objects.filter(idle_reclaim=True)}
    if not pools:
        return {}
    running = list(Reservation.objects.filter(pool_id__in=pools, state=Reservation.State.ACTIVE,
                                              starts_at__lte=now, ends_at__gt=now, keep_at__isnull=True)
                   .values_list("pk", "pool_id", "starts_at", "idle_warned_at"))
    held: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for reservation_id, gpu_id, node_id in (
            Allocation.objects.filter(reservation_id__in=[r[0] for r in running], starts_at__lte=now, ends_at__gt=now)
            .values_list("reservation_id", "gpu_id", "gpu__node_id")):
        held[reservation_id].append((gpu_id, node_id))
    latest = hot.latest_get({g for gpus in held.values() for g in gpus})
    for reservation_id, pool_id, starts_at, warned_at in running:
        if not held[reservation_id]:
            continue
        pool = pools[pool_id]
        seen = idleness(reservation_id=reservation_id, started_at=starts_at, gpus=held[reservation_id], now=now,
                        latest=latest)
        warn, release = timedelta(minutes=pool.idle_warn_minutes), timedelta(minutes=pool.idle_release_minutes)
        step = decide(seen=seen, warned_at=warned_at, now=now, warn=warn, release=release)
        if step == CALL_OFF:
            counts["called_off"] += allocation_services.reservation_idle_cancel(
                reservation_id=reservation_id, active_at=seen.last_active, now=now)
        elif step == NO_DATA:
            counts["no_data"] += 1
        elif step == WARN:
            counts["warned"] += allocation_services.reservation_idle_warn(
                reservation_id=reservation_id, evidence=seen.evidence(), release_at=now + release, now=now)
        elif step == RELEASE:
            released = allocation_services.reservation_idle_release(reservation_id=reservation_id,
                                                                    evidence=seen.evidence(), now=now)
            counts["released"] += released
            if released:
                log.info("reservation %s released as idle since %s", reservation_id, seen.idle_since)
    return dict(counts)


WARN, RELEASE, CALL_OFF, NO_DATA, NOTHING = "warn", "release", "call_off", "no_data", ""


def decide(*, seen: Idleness, warned_at: datetime | None, now: datetime, warn: timedelta, release: timedelta) -> str:
    """The policy, on plain values (benchmarks.idle_reclaim replays it): what one sweep does to one
    reservation that the telemetry sees as `seen`, warned at `warned_at` (None: not warned)."""
    if warned_at is not None and seen.last_active is not None and seen.last_active > warned_at:
        return CALL_OFF  # used again since the warning
    if not seen.covered:
        return NO_DATA
    if warned_at is None:
        return WARN if seen.idle_for(now) >= warn else NOTHING
    if now >= warned_at + release and seen.idle_since <= warned_at:
        return RELEASE
    return NOTHING
