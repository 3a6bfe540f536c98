"""Mail to the people a reservation concerns: whoever booked it and its team's managers.

Failover, the queue (started, did not start), preemption and expiry notices all go through
`notify_owners`; the message is sent after the commit (common.notifications). Each is also
announced to the notification channels of the team and the booker (teams/notify.py), as are
activations and failures to apply, which are not mailed.
"""
from __future__ import annotations

from django.conf import settings

from allocations.models import Reservation
from common.notifications import mail_after_commit
from teams.models import Membership
from teams.notify import notify


def announce(reservation: Reservation, event: str, headline: str, detail: str) -> int:
    """Tell the notification channels of its team and of whoever booked it (teams/notify.py) that
    `event` happened to it; sent after the commit. Returns how many deliveries were recorded."""
    return notify(event=event, subject=headline, text=detail,
                  link=f"{settings.PORTAL_BASE_URL}/reservations/{reservation.pk}/",
                  data={"reservation": reservation.pk, "team_id": reservation.team_id, "state": reservation.state},
                  team_ids=[reservation.team_id], user_ids=[reservation.requested_by_id])


def notify_owners(reservation: Reservation, headline: str, detail: str, *, event: str) -> bool:
    """Email whoever booked it and the team's managers, after the commit, and announce `event` to their
    channels. Returns whether anyone is mailed."""
    announce(reservation, event, headline, detail)
    recipients = set(Membership.objects.filter(team_id=reservation.team_id, role=Membership.Role.MANAGER)
                     .values_list("user__email", flat=True))
    if reservation.requested_by_id is not None:
        recipients.add(reservation.requested_by.email)
    return mail_after_commit(to=recipients, subject=f"[GPU Pool] {headline}",
                             template="allocations/email/reservation_notice",
                             context={"reservation": reservation, "headline": headline, "detail": detail,
                                      "link": f"{settings.PORTAL_BASE_URL}/reservations/{reservation.pk}/"},
                             about=f"reservation {reservation.pk}")
