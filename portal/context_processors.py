"""What every page's header needs: the teams the viewer may open, and what their reservations list is."""
from __future__ import annotations

from django.http import HttpRequest
from django.utils.translation import gettext as _

from teams.selectors import teams_of


def navigation(request: HttpRequest) -> dict:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    # Staff see (and may open) every team; the list page shows the whole fleet's bookings, not theirs.
    return {"nav_teams": teams_of(user).order_by("name"),
            "reservations_label": _("All reservations") if user.is_staff else _("My reservations")}
