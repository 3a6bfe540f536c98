"""GET /api/v1/advice/: right-sizing advice (accounting.advice) for the caller's teams (staff: every team)."""
from __future__ import annotations

from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils.translation import gettext as _
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounting.advice import advice
from common.api import RefusesUnknownQueryParameters
from common.errors import NotFound
from teams.selectors import teams_of


class AdviceView(RefusesUnknownQueryParameters, APIView):
    """Per team (and user): the smallest shape that would have held what its last ended bookings used, with
    the GE-hours a month it would save and the figures it rests on. Members see their teams', staff every
    team's."""

    def known_query_parameters(self) -> set[str]:
        return {"team", "user"}

    @extend_schema(parameters=[
        OpenApiParameter("team", OpenApiTypes.STR, description="A team's slug (default: every team you may see)"),
        OpenApiParameter("user", OpenApiTypes.STR, description="A username: only that user's bookings")],
        responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request) -> Response:
        teams = teams_of(request.user).order_by("slug")
        slug = request.query_params.get("team")
        if slug:
            teams = teams.filter(slug=slug)
            if not teams.exists():
                raise NotFound(_("Team %(team)s does not exist.") % {"team": slug}, field="team",
                               rule="does_not_exist")
        user = None
        username = request.query_params.get("user")
        if username:
            user = get_user_model().objects.filter(username=username).first()
            if user is None:
                raise NotFound(_("User %(user)s does not exist.") % {"user": username}, field="user",
                               rule="does_not_exist")
        found = advice(teams=teams, user=user)
        return Response({"reservations_read": settings.ADVICE_RESERVATIONS, "advice": [a.data() for a in found]})
