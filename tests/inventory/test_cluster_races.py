"""Racing cluster registrations: the second of two requests for one new slug gets the 400 (slug,
unique) that a later request gets, never a 500."""
from __future__ import annotations

import pytest

from inventory import services
from inventory.models import Cluster
from tests.races import race_past_the_check

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_the_same_cluster_registered_twice_at_once_is_one_cluster_and_one_400(world, monkeypatch):
    outcomes = race_past_the_check(monkeypatch, Cluster, lambda: services.cluster_create(
        actor=world.staff, name="Edge", kind="baremetal"))
    assert outcomes == ["ValidationFailed", "written"]  # was ["IntegrityError", "written"]: a 500
    assert Cluster.objects.filter(slug="edge").count() == 1
