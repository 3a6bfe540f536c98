"""The queue driven by a real Celery worker and beat on PostgreSQL and Redis, mailing a real SMTP server
(aiosmtpd): a request waits, starts within seconds of the release that frees room, and its owner is mailed
once; the expiry warning goes out once."""
from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from allocations.models import Allocation, PriorityClass, QueueEntry, Quota, Reservation
from tests.conftest import wait_for
from tests.smtp import start_smtp

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
URL = "/api/v1/reservations/"


@pytest.fixture
def inbox(worker_env):
    box, controller, port = start_smtp()
    # QUEUE_PASS_SECONDS: the backstop stays out of it, so a release's own kick must start the waiter.
    worker_env.update(EMAIL_URL=f"smtp://127.0.0.1:{port}", EXPIRY_WARNING_SECONDS="1800",
                      QUEUE_PASS_SECONDS="600", PREEMPTION_NOTICE_SECONDS="3", PREEMPTION_MIN_RUNTIME_SECONDS="0")
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


@pytest.fixture
def notices_here(inbox, settings, worker_env):
    """This process gives the notice (the create runs the pass), the worker takes the GPUs back: both mail
    the same SMTP server and count the same notice and minimum runtime."""
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", int(worker_env["EMAIL_URL"].rsplit(":", 1)[1])
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""
    settings.PREEMPTION_NOTICE, settings.PREEMPTION_MIN_RUNTIME = timedelta(seconds=3), timedelta(0)
    return inbox


def test_borrowed_gpus_are_reclaimed_after_one_notice_and_the_waiter_starts(world, api, notices_here,
                                                                            celery_worker_process):
    inbox = notices_here
    world.pool.borrowing = True
    world.pool.save()
    own = api(world.member).post(URL, {"pool": "a100", "team": "ml", "gpus": 6, "duration": "2h"}, format="json")
    borrowed = api(world.member).post(URL, {"pool": "a100", "team": "ml", "gpus": 2, "duration": "2h",
                                            "requeue": True}, format="json").json()
    assert own.status_code == 201 and borrowed["borrowed_ge"] == 2.0
    wait_for(lambda: Reservation.objects.get(pk=borrowed["id"]).state == "active", message="the borrower active")

    waiter = api(world.staff).post(URL, {"pool": "a100", "team": "infra", "gpus": 2, "duration": "1h"},
                                   format="json").json()
    assert waiter["state"] == "pending"
    victim = Reservation.objects.get(pk=borrowed["id"])
    assert victim.preempt_at is not None
    wait_for(lambda: Reservation.objects.get(pk=waiter["id"]).state == "active", timeout=20,
             message="the waiter active once the notice ran out")
    victim.refresh_from_db()
    assert victim.state == "released" and "taken back" in victim.reason
    assert victim.ended_at >= victim.preempt_at
    requeued = Reservation.objects.get(team=world.team, state="pending")
    assert requeued.events.first().reason.startswith(f"Requeued for the rest of reservation #{victim.pk}")
    notices = [s for s in inbox.subjects() if "borrowed GPUs taken back" in s]
    time.sleep(2)
    assert notices == [f"[GPU Pool] Reservation #{victim.pk}: borrowed GPUs taken back at "
                       f"{victim.preempt_at:%H:%M} UTC"]
    assert [s for s in inbox.subjects() if "borrowed GPUs taken back" in s] == notices


def test_a_higher_class_preempts_a_lower_preemptible_booking_after_one_notice_and_it_is_requeued(
        world, api, notices_here, celery_worker_process):
    inbox = notices_here
    low = PriorityClass.objects.create(name="low", value=10, preemptible=True)
    high = PriorityClass.objects.create(name="high", value=100, preemptible=True)
    Quota.objects.filter(team=world.team, pool=world.pool).update(priority_class=high)
    Quota.objects.filter(team=world.other_team, pool=world.pool).update(priority_class=low)
    # infra (low, preemptible, within its quota of 8: nothing borrowed) fills the pool in two bookings.
    ends = (timezone.now() + timedelta(hours=2)).isoformat()
    older = api(world.staff).post(URL, {"pool": "a100", "team": "infra", "gpus": 6, "ends_at": ends},
                                  format="json").json()
    younger = api(world.staff).post(URL, {"pool": "a100", "team": "infra", "gpus": 2, "ends_at": ends,
                                          "requeue": True}, format="json").json()
    assert younger["borrowed_ge"] == 0.0 and younger["preemptible"] and younger["priority_class"] == "low"
    for booked in (older, younger):
        wait_for(lambda b=booked: Reservation.objects.get(pk=b["id"]).state == "active", message="infra active")

    # ml asks at high (100) within its quota: either booking alone frees 2 GPUs; the youngest is taken.
    waiter = api(world.member).post(URL, {"pool": "a100", "team": "ml", "gpus": 2, "duration": "1h"},
                                    format="json").json()
    assert waiter["state"] == "pending"
    victim = Reservation.objects.get(pk=younger["id"])
    assert victim.preempt_at is not None and Reservation.objects.get(pk=older["id"]).preempt_at is None
    wait_for(lambda: Reservation.objects.get(pk=waiter["id"]).state == "active", timeout=20,
             message="the waiter active once the notice ran out")
    victim.refresh_from_db()
    assert victim.state == "released" and victim.ended_at >= victim.preempt_at
    assert Reservation.objects.get(pk=older["id"]).state == "active"
    assert set(Allocation.objects.filter(reservation_id=waiter["id"]).values_list("gpu_id", flat=True)) == set(
        Allocation.objects.filter(reservation=victim).values_list("gpu_id", flat=True))
    requeued = Reservation.objects.get(team=world.other_team, state="pending")
    assert requeued.priority_class == "low" and requeued.preemptible and requeued.requeue
    assert requeued.events.first().reason.startswith(f"Requeued for the rest of reservation #{victim.pk}")
    subject = f"[GPU Pool] Reservation #{victim.pk}: preempted at {victim.preempt_at:%H:%M} UTC for a higher priority"
    time.sleep(2)  # more sweeps and passes: still one notice
    assert [s for s in inbox.subjects() if "preempted at" in s] == [subject]
