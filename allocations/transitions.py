"""State changes of a reservation: which are allowed, and each recorded with who, when and why.

The caller holds the row lock and has checked the state it expects, so a change outside
ALLOWED is a bug in the caller: move() refuses it rather than write it. Plain SQL
(common/sql.py says why): every create and release records one, and the ORM's save() and
create() cost ~0.5 ms of CPU each here.
"""
from __future__ import annotations

from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from allocations.messages import Msg, json_param, stored
from allocations.models import Reservation
from audit.models import AuditEntry
from audit.services import audit_record
from common import sql


State = Reservation.State

#: from-state → the states it may move to. A move to the same state is a recorded event
#: without a change (failover moving a reservation that is scheduled or applying).
ALLOWED: dict[str, frozenset[str]] = {
    # Waiting in the queue: placed, refused at last (failed), withdrawn (released) or out of time.
    State.PENDING: frozenset({State.SCHEDULED, State.RELEASED, State.EXPIRED, State.FAILED}),
    # Placed, its window not started: applied at the start, cancelled, ended unapplied, or failed
    # when failover finds no room.
    State.SCHEDULED: frozenset({State.SCHEDULED, State.APPLYING, State.RELEASED, State.EXPIRED, State.FAILED}),
    State.APPLYING: frozenset({State.APPLYING, State.ACTIVE, State.RELEASING, State.FAILED}),
    # Active: released or ended (through releasing), moved by failover (applying again), or failed.
    State.ACTIVE: frozenset({State.RELEASING, State.APPLYING, State.FAILED}),
    State.RELEASING: frozenset({State.RELEASED, State.EXPIRED, State.FAILED}),
    State.RELEASED: frozenset(),
    State.EXPIRED: frozenset(),
    State.FAILED: frozenset(),
}


def ending_state(*, ends_at: datetime, released_at: datetime) -> str:
    """How a live reservation ends once it is let go at `released_at`: expired if its window was
    over by then (it held its GPUs to the end, by the sweep or by a late release), released if early."""
    return State.EXPIRED if ends_at <= released_at else State.RELEASED


class TransitionNotAllowed(RuntimeError):
    """A caller asked for a state change outside ALLOWED: a bug, never a user's mistake."""


def record(reservation: Reservation, *, from_state: str, to_state: str, actor: AbstractBaseUser | None,
           reason: Msg | str = "", at: datetime | None = None) -> None:
    """The ReservationEvent (the reservation's own history, shown on its page) and its audit entry (the
    one log of every change, where staff look), which points back at the event. `reason` is stored in
    English with its message, read in each reader's language (allocations.messages)."""
    actor_id = actor.pk if actor is not None and actor.is_authenticated else None
    text, message = stored(reason)
    (event_id,) = sql.fetch_one(
        "INSERT INTO allocations_reservationevent (reservation_id, from_state, to_state, actor_id, at, reason, "
        "reason_message) VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id",
        [reservation.pk, from_state, to_state, actor_id, sql.db_datetime(at or timezone.now()), text,
         json_param(message)],
    )
    audit_record(model=Reservation, object_id=reservation.pk, object_repr=f"reservation {reservation.pk}",
                 action=AuditEntry.Action.CREATE if not from_state else AuditEntry.Action.UPDATE,
                 changes={"state": [from_state or None, to_state]}, actor=actor,
                 additional_data={"reservation_event": event_id, "reason": text})


def move(reservation: Reservation, to_state: str, *, actor: AbstractBaseUser | None = None,
         reason: Msg | str = "", now: datetime | None = None) -> None:
    """Change state (the row must be locked by the caller) and record who, when and why."""
    from_state = reservation.state
    if to_state not in ALLOWED[from_state]:
        raise TransitionNotAllowed(f"reservation {reservation.pk}: {from_state} → {to_state} is not allowed")
    text, message = stored(reason)
    reservation.state = to_state
    # The reason always describes the current state.
    reservation.__dict__["reason"], reservation.__dict__["reason_message"] = text, message
    reservation.updated_at = timezone.now()
    columns = ["state = %s", "reason = %s", "reason_message = %s", "updated_at = %s"]
    params = [to_state, text, json_param(message), sql.db_datetime(reservation.updated_at)]
    if to_state in Reservation.FINAL_STATES:
        reservation.ended_at = now or timezone.now()
        columns.append("ended_at = %s")
        params.append(sql.db_datetime(reservation.ended_at))
    sql.execute(f"UPDATE allocations_reservation SET {', '.join(columns)} WHERE id = %s", [*params, reservation.pk])
    record(reservation, from_state=from_state, to_state=to_state, actor=actor, reason=reason)
