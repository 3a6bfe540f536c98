"""State changes of a reservation, each recorded with who, when and why (the caller holds the row lock)."""
from __future__ import annotations

from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from allocations.models import Reservation, ReservationEvent


def record(reservation: Reservation, *, from_state: str, to_state: str, actor: AbstractBaseUser | None,
           reason: str = "") -> None:
    ReservationEvent.objects.create(reservation=reservation, from_state=from_state, to_state=to_state,
                                    actor=actor if actor is not None and actor.is_authenticated else None,
                                    reason=reason)


def move(reservation: Reservation, to_state: str, *, actor: AbstractBaseUser | None = None, reason: str = "",
         now: datetime | None = None) -> None:
    """Change state (the row must be locked by the caller) and record who, when and why."""
    from_state = reservation.state
    reservation.state = to_state
    reservation.reason = reason  # the reason always describes the current state
    update = ["state", "reason", "updated_at"]
    if to_state in Reservation.FINAL_STATES:
        reservation.ended_at = now or timezone.now()
        update.append("ended_at")
    reservation.save(update_fields=update)
    record(reservation, from_state=from_state, to_state=to_state, actor=actor, reason=reason)
