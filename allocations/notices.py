"""Mail to the people a reservation concerns: whoever booked it and its team's managers.

Failover, the queue (started, did not start), preemption and expiry notices all go through
`notify_owners`; the message is sent after the commit (common.notifications). Each is also
announced to the notification channels of the team and the booker (teams/notify.py), as are
activations and failures to apply, which are not mailed.

The headline and the detail are messages (allocations.messages.Msg): each recipient reads the mail
in their own language and zone (teams.preferences.speaking_to); recipients who share both get one
mail. A channel is told in its own language: a person's in theirs, a team's in the portal's
(teams.notify.channel_language).
"""
from __future__ import annotations

from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone, translation

from allocations.messages import Msg
from allocations.models import Reservation
from common.notifications import mail_after_commit
from teams.models import Membership
from teams.notify import notify
from teams.preferences import speaking_to


def announce(reservation: Reservation, event: str, headline: Msg | str, detail: Msg | str) -> int:
    """Tell the notification channels of its team and of whoever booked it (teams/notify.py) that
    `event` happened to it; sent after the commit. Returns how many deliveries were recorded."""
    # Put in words per channel, in its language (teams.notify.channel_language).
    return notify(event=event, subject=lambda: str(headline), text=lambda: str(detail),
                  link=f"{settings.PORTAL_BASE_URL}/reservations/{reservation.pk}/",
                  data={"reservation": reservation.pk, "team_id": reservation.team_id, "state": reservation.state},
                  team_ids=[reservation.team_id], user_ids=[reservation.requested_by_id])


def _recipients(reservation: Reservation) -> list:
    """Whoever booked it and its team's managers, each once (by address), in a stable order."""
    users = list(get_user_model().objects.filter(memberships__team_id=reservation.team_id,
                                                 memberships__role=Membership.Role.MANAGER).order_by("pk"))
    if reservation.requested_by_id is not None:
        users.append(reservation.requested_by)
    seen, out = set(), []
    for user in users:
        if user.email and user.email not in seen:
            seen.add(user.email)
            out.append(user)
    return out


def notify_owners(reservation: Reservation, headline: Msg | str, detail: Msg | str, *, event: str) -> bool:
    """Email whoever booked it and the team's managers, after the commit, each in their language and zone,
    and announce `event` to their channels. Returns whether anyone is mailed."""
    announce(reservation, event, headline, detail)
    link = f"{settings.PORTAL_BASE_URL}/reservations/{reservation.pk}/"
    # Recipients who read the same language in the same zone get one mail, as before.
    groups: dict[tuple[str, str], list] = {}
    for user in _recipients(reservation):
        with speaking_to(user):
            key = (translation.get_language(), timezone.get_current_timezone_name())
        groups.setdefault(key, []).append(user)
    mailed = False
    for users in groups.values():
        with speaking_to(users[0]):
            mailed |= mail_after_commit(
                to=[user.email for user in users], subject=f"[GPU Pool] {headline}",
                template="allocations/email/reservation_notice",
                context={"reservation": reservation, "headline": str(headline), "detail": str(detail),
                         "link": link},
                about=f"reservation {reservation.pk}")
    return mailed
