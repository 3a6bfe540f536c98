"""Racing writes about teams and their members: the second of two racing requests gets a 4xx, never a 500."""
from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.db.models.query import QuerySet

from portal import services
from portal.models import Membership, Team
from tests.conftest import _require_postgresql
from tests.factories import UserFactory

pytestmark = [pytest.mark.django_db(transaction=True)]


def race_past_the_check(monkeypatch, model, write) -> list[str]:
    """Run `write` twice at once, each held just after its `exists()` check on `model` (2 s at most), so
    both check before either writes unless the service serializes them; returns the two outcomes."""
    _require_postgresql()
    barrier = threading.Barrier(2)
    exists = QuerySet.exists

    def exists_then_wait(self):
        found = exists(self)
        if self.model is model:
            try:
                barrier.wait(timeout=2)
            except threading.BrokenBarrierError:
                pass
        return found

    monkeypatch.setattr(QuerySet, "exists", exists_then_wait)
    outcomes: list[str] = []

    def run() -> None:
        try:
            write()
            outcomes.append("written")
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test compares
            outcomes.append(type(exc).__name__)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(outcomes)


def test_the_same_user_added_twice_at_once_is_one_membership_and_one_409(world, monkeypatch):
    UserFactory(username="newcomer")
    outcomes = race_past_the_check(monkeypatch, Membership, lambda: services.membership_add(
        actor=world.owner, team=world.team, username="newcomer"))
    assert outcomes == ["Conflict", "written"]  # was ["IntegrityError", "written"]: a 500
    assert Membership.objects.filter(team=world.team, user__username="newcomer").count() == 1


def test_the_same_team_slug_created_twice_at_once_is_one_team_and_one_409(world, monkeypatch):
    outcomes = race_past_the_check(monkeypatch, Team, lambda: services.team_create(
        actor=world.staff, slug="vision", name="Vision"))
    assert outcomes == ["Conflict", "written"]
    assert Team.objects.filter(slug="vision").count() == 1
