"""Racing creations through the fleet API: the second of two requests for one new node or GPU gets a
409 naming the field and the rule `unique`, never a 500 (the serializer's unique check passes for
both; the database's index refuses the second)."""
from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from inventory.models import Cluster, Gpu, Node
from tests.races import race_past_the_check

pytestmark = [pytest.mark.django_db(transaction=True)]


def racing_posts(monkeypatch, model, user, url: str, body: dict) -> list[str]:
    """POST the same body twice at once, both held past the unique check; the answers, sorted."""
    answers: list[str] = []

    def post() -> None:
        client = APIClient()
        client.force_authenticate(user)
        response = client.post(url, body, format="json")
        error = response.json().get("errors", [{}])[0] if response.status_code != 201 else {}
        answers.append(f"{response.status_code} {error.get('field', '')} {error.get('rule', '')}".strip())

    race_past_the_check(monkeypatch, model, post)
    return sorted(answers)


def test_the_same_node_created_twice_at_once_is_one_node_and_one_409(world, monkeypatch):
    cluster = Cluster.objects.order_by("pk").first()
    answers = racing_posts(monkeypatch, Node, world.staff, "/api/v1/nodes/", {"cluster": cluster.slug,
                                                                                "name": "node-z"})
    assert answers == ["201", "409 name unique"]  # was a 500 (IntegrityError)
    assert Node.objects.filter(cluster=cluster, name="node-z").count() == 1


def test_the_same_gpu_registered_twice_at_once_is_one_gpu_and_one_409(world, monkeypatch):
    node = Node.objects.order_by("pk").first()
    answers = racing_posts(monkeypatch, Gpu, world.staff, "/api/v1/gpus/", {
        "node": node.pk, "index": 9, "uuid": "GPU-race-0001", "model_name": "H100", "memory_mib": 81920})
    assert answers == ["201", "409 uuid unique"]  # was a 500 (IntegrityError)
    assert Gpu.objects.filter(uuid="GPU-race-0001").count() == 1


@pytest.mark.parametrize("message, field", [
    ("UNIQUE constraint failed: inventory_node.cluster_id, inventory_node.name", "name"),  # SQLite's words
    ("UNIQUE constraint failed: inventory_gpu.uuid", "uuid"),
    ("NOT NULL constraint failed: inventory_gpu.node_id", None),  # not a duplicate: left to be a 500
])
def test_a_unique_violation_is_read_from_sqlites_message_too(message, field):
    from django.db import IntegrityError

    from config.exception_handler import _unique_violation_field

    assert _unique_violation_field(IntegrityError(message)) == field
