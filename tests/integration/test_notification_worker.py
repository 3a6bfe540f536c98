"""Notification channels driven by a real Celery worker and beat: a booking that goes active is announced
to the team's signed webhook by the worker's delivery task; a receiver that is down first gets the
delivery retried by the beat sweep once it answers, and the reservation went active all the same."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from allocations.models import Reservation
from teams.models import Delivery
from teams.notify import signature
from teams.services import channel_create
from tests.conftest import wait_for
from tests.webhooks import start_receiver

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
SECRET = "integration-secret"


@pytest.fixture
def receiver(worker_env):
    worker_env.update(NOTIFY_ALLOW_PRIVATE_URLS="1", NOTIFY_RETRY_SECONDS="1", NOTIFY_SWEEP_SECONDS="1")
    receiver = start_receiver()
    yield receiver
    receiver.stop()


def test_an_activation_reaches_the_teams_webhook_and_a_failing_one_is_retried(
        world, api, receiver, celery_worker_process):
    channel_create(actor=world.owner, name="ml hook", kind="webhook", team=world.team, url=f"{receiver.url}/hook",
                   secret=SECRET, events=["reservation.active"])
    receiver.statuses = [502]  # the first attempt fails; the sweep sends it again after the wait
    booked = api(world.member).post("/api/v1/reservations/", {
        "pool": "a100", "team": "ml", "gpus": 1, "ends_at": (timezone.now() + timedelta(hours=1)).isoformat()},
        format="json")
    assert booked.status_code == 201
    wait_for(lambda: Reservation.objects.get(pk=booked.json()["id"]).state == "active", message="activation")
    wait_for(lambda: Delivery.objects.filter(status="sent").exists(), timeout=30, message="the retried delivery")
    assert len(receiver.received) == 2 and Delivery.objects.get().attempts == 2
    hook = receiver.received[-1]
    assert hook.json()["event"] == "reservation.active" and hook.json()["data"]["reservation"] == booked.json()["id"]
    assert hook.headers["X-GpuPool-Signature"] == signature(SECRET, hook.headers["X-GpuPool-Timestamp"], hook.body)
