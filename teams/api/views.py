"""Auth tokens, teams and their members over REST."""
from __future__ import annotations

from django.contrib.auth import authenticate
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import AllowAny, IsAdminUser, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from common.errors import ApplicationError
from teams import services
from teams.api.serializers import (
    MembershipAddInput,
    MembershipChangeInput,
    MembershipSerializer,
    TeamSerializer,
    TokenInput,
    TokenOutput,
)
from teams.models import Team
from teams.selectors import teams_of
from teams.tokens import CachedTokenAuthentication


class InvalidCredentials(ApplicationError):
    status = 400


class TokenView(APIView):
    """POST: trade a username and password for a new API token, shown once (throttled; repeated failures
    lock the pair out). DELETE with `Authorization: Token <key>`: delete that token."""

    permission_classes = [AllowAny]
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "login"

    def get_authenticators(self):
        # Signing in needs no credential (and a stale token must not stand in its way); signing out does.
        if self.request is None or self.request.method == "DELETE":
            return [CachedTokenAuthentication()]
        return []

    def get_permissions(self):
        return [IsAuthenticated()] if self.request.method == "DELETE" else super().get_permissions()

    def get_throttles(self):
        return [] if self.request.method == "DELETE" else super().get_throttles()

    @extend_schema(request=TokenInput, responses=TokenOutput)
    def post(self, request: Request) -> Response:
        data = TokenInput(data=request.data)
        data.is_valid(raise_exception=True)
        user = authenticate(request._request, username=data.validated_data["username"],
                            password=data.validated_data["password"])
        if user is None or not user.is_active:
            raise InvalidCredentials("Unable to sign in with the username and password given.",
                                     field="password", rule="invalid_credentials")
        request.user = user  # who signed in is who made the token (the audit log reads the request's user)
        token, key = services.api_token_create(user=user, name=data.validated_data["name"])
        return Response({"token": key, "prefix": token.prefix, "name": token.name})

    @extend_schema(request=None, responses={204: None})
    def delete(self, request: Request) -> Response:
        services.api_token_delete(actor=request.user, key=request.auth)
        return Response(status=status.HTTP_204_NO_CONTENT)


class TeamViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                  mixins.UpdateModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """Everyone signed in sees their teams; staff create, rename and delete teams."""

    serializer_class = TeamSerializer
    lookup_field = "slug"
    # Only slugs reach the database: DRF's default ([^/.]+) let /teams/a%00b/ through, and PostgreSQL
    # refuses a NUL byte in text with a DataError (a 500). Anything else is the API's JSON 404.
    lookup_value_regex = r"[-a-zA-Z0-9_]+"

    def get_permissions(self):
        # Create too, before the input is validated: the slug's unique check answered a member 400
        # "already exists" for another team's slug and 403 otherwise, telling them which teams exist.
        if self.action in ("create", "update", "partial_update", "destroy"):
            return [IsAdminUser()]
        return super().get_permissions()

    def get_queryset(self):
        return teams_of(self.request.user)

    def perform_create(self, serializer: TeamSerializer) -> None:
        serializer.instance = services.team_create(actor=self.request.user, **serializer.validated_data)

    def perform_update(self, serializer: TeamSerializer) -> None:
        serializer.instance = services.team_update(actor=self.request.user, team=serializer.instance,
                                                   **serializer.validated_data)

    @extend_schema(methods=["get"], responses=MembershipSerializer(many=True))
    @extend_schema(methods=["post"], request=MembershipAddInput, responses={201: MembershipSerializer})
    @action(detail=True, methods=["get", "post"])
    def members(self, request: Request, slug: str) -> Response:
        team: Team = self.get_object()
        if request.method == "GET":
            # Paged like every other list of the API (limit/offset; count, next, previous, results).
            page = self.paginate_queryset(team.memberships.select_related("user").order_by("user__username"))
            return self.get_paginated_response(MembershipSerializer(page, many=True).data)
        data = MembershipAddInput(data=request.data)
        data.is_valid(raise_exception=True)
        membership = services.membership_add(actor=request.user, team=team, **data.validated_data)
        return Response(MembershipSerializer(membership).data, status=status.HTTP_201_CREATED)

    @extend_schema(methods=["patch"], request=MembershipChangeInput, responses=MembershipSerializer)
    @extend_schema(methods=["delete"], request=None, responses={204: None})
    @action(detail=True, methods=["patch", "delete"], url_path=r"members/(?P<username>[\w.@+-]+)")
    def member(self, request: Request, slug: str, username: str) -> Response:
        team: Team = self.get_object()
        if request.method == "DELETE":
            services.membership_remove(actor=request.user, team=team, username=username)
            return Response(status=status.HTTP_204_NO_CONTENT)
        data = MembershipChangeInput(data=request.data)
        data.is_valid(raise_exception=True)
        membership = services.membership_change_role(actor=request.user, team=team, username=username,
                                                     role=data.validated_data["role"])
        return Response(MembershipSerializer(membership).data)
