"""How often a page asks again for a reservation that is still moving (HTMX polling of its row or body).

Polling rather than the WebSocket: the pages are served over plain HTTP (WSGI), a state change is made
by a worker, a sweep or a release in several places (allocations.transitions), and a poll reads the
database, which is the truth; a settled reservation answers without a trigger, so polling stops.
"""
from __future__ import annotations

from django import template

register = template.Library()

# A change is due within seconds: the apply task runs or the release is being undone.
MOVING_SECONDS = 1
# Nothing is due yet but something may come (a queue pass places it, the window starts).
WAITING_SECONDS = 10


@register.filter
def poll_seconds(reservation, now) -> int:
    """Seconds between two looks at `reservation` while its state may change by itself; 0 once settled."""
    state = reservation.state
    if state in ("applying", "releasing") or (state == "scheduled" and reservation.starts_at <= now):
        return MOVING_SECONDS
    if state in ("pending", "scheduled"):
        return WAITING_SECONDS
    return 0

