"""State changes of a reservation, each recorded with who, when and why (the caller holds the row lock).

Plain SQL (common/sql.py says why): every create and release records one, and the ORM's
save() and create() cost ~0.5 ms of CPU each here.
"""
from __future__ import annotations

from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from allocations.models import Reservation
from common import sql


def record(reservation: Reservation, *, from_state: str, to_state: str, actor: AbstractBaseUser | None,
           reason: str = "", at: datetime | None = None) -> None:
    actor_id = actor.pk if actor is not None and actor.is_authenticated else None
    sql.execute(
        "INSERT INTO allocations_reservationevent (reservation_id, from_state, to_state, actor_id, at, reason) "
        "VALUES (%s, %s, %s, %s, %s, %s)",
        [reservation.pk, from_state, to_state, actor_id, sql.db_datetime(at or timezone.now()), reason],
    )


def move(reservation: Reservation, to_state: str, *, actor: AbstractBaseUser | None = None, reason: str = "",
         now: datetime | None = None) -> None:
    """Change state (the row must be locked by the caller) and record who, when and why."""
    from_state = reservation.state
    reservation.state = to_state
    reservation.reason = reason  # the reason always describes the current state
    reservation.updated_at = timezone.now()
    columns = ["state = %s", "reason = %s", "updated_at = %s"]
    params = [to_state, reason, sql.db_datetime(reservation.updated_at)]
    if to_state in Reservation.FINAL_STATES:
        reservation.ended_at = now or timezone.now()
        columns.append("ended_at = %s")
        params.append(sql.db_datetime(reservation.ended_at))
    sql.execute(f"UPDATE allocations_reservation SET {', '.join(columns)} WHERE id = %s", [*params, reservation.pk])
    record(reservation, from_state=from_state, to_state=to_state, actor=actor, reason=reason)
