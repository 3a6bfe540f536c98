"""Racing writes about teams and their members: the second of two racing requests gets a 4xx, never a 500."""
from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.db.models.query import QuerySet

from portal import services
from portal.models import Membership
from tests.factories import UserFactory

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_the_same_user_added_twice_at_once_is_one_membership_and_one_409(world, monkeypatch):
    from tests.conftest import _require_postgresql

    _require_postgresql()
    UserFactory(username="newcomer")
    # Hold each request just after its duplicate check (2 s at most), so both check before either
    # inserts unless the service serializes them.
    barrier = threading.Barrier(2)
    exists = QuerySet.exists

    def exists_then_wait(self):
        found = exists(self)
        if self.model is Membership:
            try:
                barrier.wait(timeout=2)
            except threading.BrokenBarrierError:
                pass
        return found

    monkeypatch.setattr(QuerySet, "exists", exists_then_wait)
    outcomes: list[str] = []

    def add() -> None:
        try:
            services.membership_add(actor=world.owner, team=world.team, username="newcomer")
            outcomes.append("added")
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test compares
            outcomes.append(type(exc).__name__)
        finally:
            connection.close()

    threads = [threading.Thread(target=add) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["Conflict", "added"]  # was ["IntegrityError", "added"]: a 500
    assert Membership.objects.filter(team=world.team, user__username="newcomer").count() == 1


def test_the_same_team_slug_created_twice_at_once_is_one_team_and_one_409(world, monkeypatch):
    from tests.conftest import _require_postgresql

    from portal.models import Team

    _require_postgresql()
    barrier = threading.Barrier(2)
    exists = QuerySet.exists

    def exists_then_wait(self):
        found = exists(self)
        if self.model is Team:
            try:
                barrier.wait(timeout=2)
            except threading.BrokenBarrierError:
                pass
        return found

    monkeypatch.setattr(QuerySet, "exists", exists_then_wait)
    outcomes: list[str] = []

    def create() -> None:
        try:
            services.team_create(actor=world.staff, slug="vision", name="Vision")
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
    assert sorted(outcomes) == ["Conflict", "created"]
    assert Team.objects.filter(slug="vision").count() == 1
