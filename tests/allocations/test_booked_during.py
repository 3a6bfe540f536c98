"""AllocationQuerySet.booked_during and its SQL twin (BOOKED_DURING_SQL, used by the hand-written reads
on the hot path) answer the same for every window, empty (cancelled) allocations included."""
from __future__ import annotations

from datetime import timedelta

from allocations.models import Allocation, AllocationQuerySet
from common import sql
from tests.factories import window

HOUR = timedelta(hours=1)


def test_the_sql_and_the_orm_say_the_same_of_every_window(world, api):
    booked = api(world.member).post("/api/v1/reservations/", {"pool": "a100", "team": "ml", "gpus": 1,
                                                              "ends_at": window(0, 2)[1].isoformat()}, format="json")
    rid = booked.json()["id"]
    gpu = Allocation.objects.get(reservation_id=rid).gpu_id
    t0, _ = window(1, 1)
    # Held [t0, t0+2h), back to back [t0+2h, t0+3h), and an empty (cancelled) one at t0+1h.
    Allocation.objects.filter(reservation_id=rid).update(starts_at=t0, ends_at=t0 + 2 * HOUR)
    Allocation.objects.create(reservation_id=rid, gpu_id=gpu, starts_at=t0 + 2 * HOUR, ends_at=t0 + 3 * HOUR)
    Allocation.objects.create(reservation_id=rid, gpu_id=gpu, starts_at=t0 + HOUR, ends_at=t0 + HOUR)
    for start_h in range(-1, 4):
        for length_h in range(1, 4):
            start, end = t0 + start_h * HOUR, t0 + (start_h + length_h) * HOUR
            by_orm = set(Allocation.objects.filter(gpu_id=gpu).booked_during(start, end).values_list("id", flat=True))
            by_sql = {row[0] for row in sql.fetch_all(
                f"SELECT a.id FROM allocations_allocation a WHERE a.gpu_id = %s AND {AllocationQuerySet.BOOKED_DURING_SQL}",
                [gpu, sql.db_datetime(end), sql.db_datetime(start)])}
            assert by_orm == by_sql, (start_h, length_h)
