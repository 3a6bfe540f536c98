"""The demo's simulated users fill the L40S pool until requests wait, and release some early."""
from __future__ import annotations

import random

from allocations.models import QueueEntry, Reservation
from config import demo_users
from config.demo import load_demo


def test_the_simulated_users_make_a_queue_and_release_early(db, monkeypatch):
    load_demo()
    rng = random.Random(1)
    monkeypatch.setattr(demo_users, "EARLY_RELEASE_CHANCE", 0.0)
    outcomes = [demo_users.step(rng) for _ in range(12)]
    waiting = Reservation.objects.filter(pool__slug="l40s", state="pending")
    assert waiting.count() == demo_users.WAITING_WANTED, outcomes
    assert outcomes[-1] == "enough waiting"
    assert all(entry.start_by is not None and entry.position for entry in QueueEntry.objects.filter(
        reservation__in=waiting))
    # Bookings the agents made active can be released early, which the estimate learns from.
    Reservation.objects.filter(pool__slug="l40s", state="scheduled").update(state="active")
    monkeypatch.setattr(demo_users, "EARLY_RELEASE_CHANCE", 1.0)
    assert demo_users.step(rng).startswith("released #")
