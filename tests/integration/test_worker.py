"""A reservation's life driven by a real Celery worker and beat, on PostgreSQL and Redis."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from allocations.models import Allocation, Reservation
from tests.conftest import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def state_of(reservation_id: int) -> str:
    return Reservation.objects.get(pk=reservation_id).state


def test_a_reservation_goes_active_then_released_through_the_worker(world, api, celery_worker_process):
    client = api(world.member)
    created = client.post("/api/v1/reservations/", {
        "pool": "a100", "team": "ml", "gpus": 2, "ends_at": (timezone.now() + timedelta(hours=1)).isoformat(),
    }, format="json")
    assert created.status_code == 201
    rid = created.json()["id"]
    wait_for(lambda: state_of(rid) == "active", message="scheduled → active")
    assert client.post(f"/api/v1/reservations/{rid}/release/").json()["state"] == "releasing"
    wait_for(lambda: state_of(rid) == "released", message="releasing → released")
    events = list(Reservation.objects.get(pk=rid).events.values_list("to_state", flat=True))
    assert events == ["scheduled", "applying", "active", "releasing", "released"]


def test_beat_starts_a_future_reservation_and_expires_it_at_its_end(world, api, celery_worker_process):
    start = timezone.now() + timedelta(seconds=3)
    created = api(world.member).post("/api/v1/reservations/", {
        "pool": "a100", "team": "ml", "gpus": 1, "starts_at": start.isoformat(),
        "ends_at": (start + timedelta(seconds=4)).isoformat(),
    }, format="json")
    rid = created.json()["id"]
    assert created.json()["state"] == "scheduled"
    wait_for(lambda: state_of(rid) == "active", message="beat activates at starts_at")
    assert timezone.now() >= start
    wait_for(lambda: state_of(rid) == "expired", message="beat expires at ends_at")
    reservation = Reservation.objects.get(pk=rid)
    assert reservation.ended_at >= reservation.ends_at


def test_a_lost_task_loses_nothing_the_sweep_finishes_it(world, celery_worker_process):
    """A scheduled row whose activation message never reached the broker is still activated by beat."""
    now = timezone.now()
    reservation = Reservation.objects.create(team=world.team, pool=world.pool, requested_by=world.member, gpus=1,
                                             starts_at=now, ends_at=now + timedelta(hours=1))
    Allocation.objects.create(reservation=reservation, gpu=world.pool.gpus.first(), starts_at=now,
                              ends_at=reservation.ends_at)
    wait_for(lambda: state_of(reservation.pk) == "active", message="the sweep activates it")
