"""Mail to the people a reservation concerns: whoever booked it and its team's managers.

Failover, the queue (started, did not start) and preemption notices all go through
`notify_owners`; the message is sent after the commit (common.notifications).
"""
from __future__ import annotations

from django.conf import settings

from allocations.models import Reservation
from common.notifications import mail_after_commit
from teams.models import Membership


def notify_owners(reservation: Reservation, headline: str, detail: str) -> bool:
    """Email whoever booked it and the team's managers, after the commit. Returns whether anyone is mailed."""
    recipients = set(Membership.objects.filter(team_id=reservation.team_id, role=Membership.Role.MANAGER)
                     .values_list("user__email", flat=True))
    if reservation.requested_by_id is not None:
        recipients.add(reservation.requested_by.email)
    return mail_after_commit(to=recipients, subject=f"[GPU Pool] {headline}",
                             template="allocations/email/reservation_notice",
                             context={"reservation": reservation, "headline": headline, "detail": detail,
                                      "link": f"{settings.PORTAL_BASE_URL}/reservations/{reservation.pk}/"},
                             about=f"reservation {reservation.pk}")
