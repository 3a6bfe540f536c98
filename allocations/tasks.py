"""Celery tasks: thin wrappers that take ids and call one service. All are safe to run twice."""
from __future__ import annotations

import logging

from celery import shared_task

from allocations import services

log = logging.getLogger(__name__)


@shared_task(name="allocations.tasks.activate_reservation")
def activate_reservation(reservation_id: int) -> bool:
    return services.reservation_activate(reservation_id=reservation_id)


@shared_task(name="allocations.tasks.finish_release")
def finish_release(reservation_id: int) -> bool:
    return services.reservation_finish_release(reservation_id=reservation_id)


@shared_task(name="allocations.tasks.sweep_reservations")
def sweep_reservations() -> dict[str, int]:
    """Move every time-driven state the database says is due. Tasks are nudges; this is the guarantee."""
    steps = {
        "activate": services.reservation_activate,
        "expire": services.reservation_expire,
        "finish_release": services.reservation_finish_release,
    }
    done = {name: 0 for name in steps}
    for name, ids in services.due_reservation_ids().items():
        for reservation_id in ids:
            try:
                done[name] += int(steps[name](reservation_id=reservation_id))
            except Exception:  # one broken row must not stop the sweep for the others
                log.exception("sweep: %s of reservation %s failed", name, reservation_id)
    return done
