"""Hand-made grant histories and telemetry for the ledger's tests: grants written as Allocation rows
(tests/allocations/grants.py does the same), minute rollups written as the rollup would."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

from allocations.models import Allocation, Reservation
from monitoring.models import MinuteRollup

H = datetime(2025, 3, 3, 10, tzinfo=UTC)  # a Monday, on the hour


def grant(team, pool, gpu, start: datetime, end: datetime, *, ge: float = 1.0, milli: int = 1000, mode: str = "exclusive",
          user=None, share=(0, 1000)) -> Allocation:
    reservation = Reservation.objects.create(team=team, pool=pool, gpus=1, state="released", mode=mode, ge=ge,
                                             requested_by=user, starts_at=start,
                                             ends_at=max(end, start + timedelta(seconds=1)))
    return Allocation.objects.create(reservation=reservation, gpu=gpu, starts_at=start, ends_at=end, mode=mode, ge=ge,
                                     milli=milli, share_from=share[0], share_to=share[1])


def minutes(gpu, first: datetime, count: int, *, util: float, mem_used: float = 1.0) -> None:
    """`count` minute rollups of `gpu` from `first` (a minute boundary) on, each at `util` % and `mem_used` MiB."""
    start = int(first.timestamp())
    MinuteRollup.objects.bulk_create([
        MinuteRollup(gpu_id=gpu.pk, pool_id=gpu.pool_id, bucket=start + 60 * i, n=60, util_avg=util,
                     util_max=int(util), mem_util_avg=0, mem_util_max=0, mem_used_avg=mem_used,
                     mem_used_max=int(mem_used), mem_total=81920, temp_avg=40, temp_max=40, power_avg=100,
                     power_max=100) for i in range(count)],
        update_conflicts=True, unique_fields=["gpu_id", "bucket"], update_fields=["util_avg", "mem_used_avg"])
