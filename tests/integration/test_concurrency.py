"""Racing requests never double-book: on PostgreSQL with row locks and the exclusion constraint."""
from __future__ import annotations

import threading
from datetime import timedelta

import httpx
import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from allocations.models import Allocation, Reservation
from teams.services import api_token_create
from tests.factories import MembershipFactory, UserFactory

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_twenty_requests_for_the_last_free_gpu_give_exactly_one_201(world, live_server, api):
    from tests.conftest import _require_postgresql

    _require_postgresql()
    ends_at = (timezone.now() + timedelta(hours=1)).isoformat()
    assert api(world.outsider).post("/api/v1/reservations/", {"pool": "a100", "team": "infra", "gpus": 7,
                                                              "ends_at": ends_at}, format="json").status_code == 201
    tokens = []
    for i in range(20):
        user = UserFactory(username=f"racer{i}")
        MembershipFactory(user=user, team=world.team)
        tokens.append(api_token_create(user=user)[1])

    barrier = threading.Barrier(20)
    statuses: list[int] = []
    lock = threading.Lock()

    def race(token: str) -> None:
        with httpx.Client(base_url=live_server.url, timeout=30) as client:
            barrier.wait()
            response = client.post("/api/v1/reservations/", json={"pool": "a100", "team": "ml", "gpus": 1,
                                                                  "ends_at": ends_at},
                                   headers={"Authorization": f"Token {token}"})
        with lock:
            statuses.append(response.status_code)

    threads = [threading.Thread(target=race, args=(t,)) for t in tokens]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [201] + [409] * 19
    assert Reservation.objects.filter(team=world.team).count() == 1
    assert Allocation.objects.count() == 8
    assert Allocation.objects.values("gpu_id").distinct().count() == 8


def test_the_database_itself_refuses_overlapping_windows_on_one_gpu(world, api):
    from tests.conftest import _require_postgresql

    _require_postgresql()
    ends_at = timezone.now() + timedelta(hours=1)
    rid = api(world.member).post("/api/v1/reservations/", {"pool": "a100", "team": "ml", "gpus": 1,
                                                           "ends_at": ends_at.isoformat()}, format="json").json()["id"]
    held = Allocation.objects.get(reservation_id=rid)
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.create(reservation_id=rid, gpu=held.gpu, starts_at=held.starts_at + timedelta(minutes=5),
                                  ends_at=held.ends_at + timedelta(hours=1))
