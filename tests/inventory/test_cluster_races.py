"""Racing cluster registrations: the second of two requests for one new slug gets the 400 (slug,
unique) that a later request gets, never a 500."""
from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.db.models.query import QuerySet

from inventory import services
from inventory.models import Cluster

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_the_same_cluster_registered_twice_at_once_is_one_cluster_and_one_400(world, monkeypatch):
    from tests.conftest import _require_postgresql

    _require_postgresql()
    # Hold each request just after its duplicate check (2 s at most), so both check before either inserts.
    barrier = threading.Barrier(2)
    exists = QuerySet.exists

    def exists_then_wait(self):
        found = exists(self)
        if self.model is Cluster:
            try:
                barrier.wait(timeout=2)
            except threading.BrokenBarrierError:
                pass
        return found

    monkeypatch.setattr(QuerySet, "exists", exists_then_wait)
    outcomes: list[str] = []

    def create() -> None:
        try:
            services.cluster_create(actor=world.staff, name="Edge", kind="baremetal")
            outcomes.append("created")
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test compares
            outcomes.append(type(exc).__name__)
        finally:
            connection.close()

    threads = [threading.Thread(target=create) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["ValidationFailed", "created"]  # was ["IntegrityError", "created"]: a 500
    assert Cluster.objects.filter(slug="edge").count() == 1
