"""Simulated users for the embedded demo, so its L40S pool has a queue to look at.

Every DEMO_USERS_SECONDS the demo's members (bob of Vision, carol of NLP) behave as people
on a busy pool do: while fewer than three requests wait in the pool they ask for one or two
GPUs for 20-90 minutes "as soon as it fits", through the same service the API calls; and now
and then one of them releases a running booking early, as people who finish early do, so the
pool's likely starts have early releases to learn from. Their bookings run on the simulated
agents like any other. Nothing here runs outside `make run`.
"""
from __future__ import annotations

import logging
import random
import threading
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.db import close_old_connections
from django.utils import timezone

from allocations import services
from allocations.models import Reservation
from common.errors import ApplicationError

log = logging.getLogger(__name__)

POOL = "l40s"
USERS = (("bob", "vision"), ("carol", "nlp"))
DEMO_USERS_SECONDS = 20.0
WAITING_WANTED = 3
QUICK_ROUNDS = 8
EARLY_RELEASE_CHANCE = 0.3


def step(rng: random.Random) -> str:
    """One round of the simulated users: ask, or release one booking early. Returns what it did."""
    User = get_user_model()
    live = list(Reservation.objects.filter(pool__slug=POOL, state=Reservation.State.ACTIVE,
                                           requested_by__username__in=[u for u, _ in USERS]))
    if live and rng.random() < EARLY_RELEASE_CHANCE:
        victim = rng.choice(live)
        services.reservation_release(actor=victim.requested_by, reservation_id=victim.pk)
        return f"released #{victim.pk} early"
    if Reservation.objects.filter(pool__slug=POOL, state=Reservation.State.PENDING).count() >= WAITING_WANTED:
        return "enough waiting"
    username, team = rng.choice(USERS)
    user = User.objects.filter(username=username).first()
    if user is None:
        return "no demo users"
    try:
        reservation = services.reservation_create(actor=user, request=services.ReservationRequest(
            team=team, pool=POOL, gpus=rng.choice((1, 1, 2)), duration=timedelta(minutes=rng.randrange(20, 91, 5))))
    except ApplicationError as refused:  # over quota or budget: people get told no too
        return f"{username} refused: {refused.message}"
    return f"{username} asked #{reservation.pk} ({reservation.state})"


def _loop(stop: threading.Event, seconds: float) -> None:
    rng = random.Random(7)
    rounds = 0
    # The first rounds come 3 s apart, so the pool fills and a queue shows within the demo's first minute.
    while not stop.wait(3.0 if rounds < QUICK_ROUNDS else seconds):
        rounds += 1
        close_old_connections()
        try:
            log.info("demo users: %s", step(rng))
        except Exception:  # noqa: BLE001 - a demo nicety must never take the demo down
            log.exception("demo users: a round failed")


def start_demo_users(seconds: float = DEMO_USERS_SECONDS) -> threading.Event:
    """Run the simulated users on a daemon thread; set the returned event to stop them."""
    stop = threading.Event()
    threading.Thread(target=_loop, args=(stop, seconds), name="demo-users", daemon=True).start()
    log.info("demo users start at %s", timezone.now())
    return stop
