"""The queue driven by a real Celery worker and beat on PostgreSQL and Redis, mailing a real SMTP server
(aiosmtpd): a request waits, starts within seconds of the release that frees room, and its owner is mailed
once; the expiry warning goes out once."""
from __future__ import annotations

import email
import socket
import time
from datetime import timedelta
from email import policy

import pytest
from aiosmtpd.controller import Controller
from django.utils import timezone

from allocations.models import Allocation, QueueEntry, Reservation
from tests.conftest import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
URL = "/api/v1/reservations/"


class Inbox:
    def __init__(self) -> None:
        self.messages: list[email.message.EmailMessage] = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append(email.message_from_bytes(envelope.content, policy=policy.default))
        return "250 OK"

    def subjects(self) -> list[str]:
        return [m["Subject"] for m in self.messages]


@pytest.fixture
def inbox(worker_env):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    box = Inbox()
    controller = Controller(box, hostname="127.0.0.1", port=port)
    controller.start()
    worker_env.update(EMAIL_URL=f"smtp://127.0.0.1:{port}", EXPIRY_WARNING_SECONDS="1800",
                      QUEUE_PASS_SECONDS="600")  # the backstop stays out of it: the release's kick must do it
    yield box
    controller.stop()


def test_a_waiting_request_starts_seconds_after_a_release_and_the_expiry_warning_goes_once(
        world, api, inbox, celery_worker_process):
    busy = api(world.staff).post(URL, {"pool": "a100", "team": "infra", "gpus": 8,
                                       "ends_at": (timezone.now() + timedelta(hours=2)).isoformat()}, format="json")
    busy_id = busy.json()["id"]
    waiting = api(world.member).post(URL, {"pool": "a100", "team": "ml", "gpus": 2, "duration": "1h"}, format="json")
    assert waiting.status_code == 201 and waiting.json()["state"] == "pending"
    rid = waiting.json()["id"]
    assert waiting.json()["queue"]["position"] == 1 and waiting.json()["queue"]["start_by"]

    wait_for(lambda: Reservation.objects.get(pk=busy_id).state == "active", message="the booking applied")
    released_at = timezone.now()
    assert api(world.staff).post(f"{URL}{busy_id}/release/").status_code == 200
    wait_for(lambda: Reservation.objects.get(pk=rid).state == "active", timeout=15,
             message="the waiting request started by the release's pass")
    started = Reservation.objects.get(pk=rid)
    assert started.starts_at - released_at < timedelta(seconds=10)
    assert Allocation.objects.filter(reservation=started).count() == 2
    assert QueueEntry.objects.get(pk=rid).position is None
    wait_for(lambda: f"[GPU Pool] Reservation #{rid} started" in inbox.subjects(), message="the started mail")

    # A booking of infra that has run an hour and ends in 20 minutes: the sweep warns its holders once.
    now = timezone.now()
    free = next(g for g in world.pool.gpus.all() if not g.allocations.filter(ends_at__gt=now).exists())
    ending = Reservation.objects.create(team=world.other_team, pool=world.pool, requested_by=world.staff, gpus=1,
                                        starts_at=now - timedelta(hours=1), ends_at=now + timedelta(minutes=20),
                                        state="active", ge=1.0)
    Allocation.objects.create(reservation=ending, gpu=free, starts_at=now, ends_at=ending.ends_at)
    subject = f"[GPU Pool] Reservation #{ending.pk} ends in 20 min"
    wait_for(lambda: subject in inbox.subjects(), message="the expiry warning")
    time.sleep(3)  # three more sweeps
    assert inbox.subjects().count(subject) == 1
    assert inbox.subjects().count(f"[GPU Pool] Reservation #{rid} started") == 1
    assert not any(f"#{rid} ends in" in s for s in inbox.subjects())  # a 1 h booking that just started
