"""Auth tokens, teams and their members over REST."""
from __future__ import annotations

from django.contrib.auth import authenticate
from django.utils.translation import gettext as _
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import AllowAny, IsAdminUser, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from common.errors import ApplicationError
from common.secrets import key_prefix
from teams import services
from teams.api.serializers import (
    ChannelSerializer,
    ChannelUpdateSerializer,
    DeliverySerializer,
    GroupMappingSerializer,
    MeSerializer,
    ApiTokenSerializer,
    TokenLimitsInput,
    token_output,
    MembershipAddInput,
    MembershipChangeInput,
    MembershipSerializer,
    TeamSerializer,
    TokenInput,
    TokenOutput,
)
from teams.models import ApiToken, GroupMapping, Team
from teams.selectors import channels_visible_to, role_in, teams_of
from teams.tokens import CachedTokenAuthentication, TokenGrant


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
            raise InvalidCredentials(_("Unable to sign in with the username and password given."),
                                     field="password", rule="invalid_credentials")
        request.user = user  # who signed in is who made the token (the audit log reads the request's user)
        limits = {k: v for k, v in data.validated_data.items() if k not in ("username", "password")}
        token, key = services.api_token_create(user=user, **_token_limits(limits))
        return Response(token_output(token, key))

    @extend_schema(request=None, responses={204: None})
    def delete(self, request: Request) -> Response:
        services.api_token_delete(actor=request.user, key=request.auth.key)
        return Response(status=status.HTTP_204_NO_CONTENT)


def _token_limits(validated: dict) -> dict:
    """A TokenLimitsInput's fields as api_token_create takes them."""
    return {"name": validated["name"], "scope": validated["scope"], "expires_at": validated["expires_at"],
            "team_slugs": validated["teams"]}


class MeView(APIView):
    """Who the request is signed in as, in which teams with which role, and what its token allows."""

    permission_classes = [IsAuthenticated]

    @extend_schema(responses=MeSerializer)
    def get(self, request: Request) -> Response:
        user = request.user
        grant = request.auth if isinstance(request.auth, TokenGrant) else None
        token = None
        if grant is not None:
            token = ApiToken.objects.filter(prefix=key_prefix(grant.key)).prefetch_related("teams").first()
        return Response(MeSerializer({
            "username": user.username, "is_staff": user.is_staff,
            "teams": [{"slug": team.slug, "name": team.name, "role": role_in(user, team) or "staff"}
                      for team in teams_of(user).order_by("slug")],
            "token": token,
        }).data)


class ApiTokenViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Your API tokens: list them, make one (signed in, by session or another token), revoke one.

    Keys are shown once, in the answer that makes them. A token made with a token never does more
    or lives longer than the one that made it."""

    serializer_class = ApiTokenSerializer
    lookup_field = "prefix"
    lookup_value_regex = r"[-a-zA-Z0-9_]+"

    def get_queryset(self):
        return ApiToken.objects.filter(user_id=self.request.user.pk).prefetch_related("teams").order_by("-created_at")

    @extend_schema(request=TokenLimitsInput, responses={201: TokenOutput})
    def create(self, request: Request) -> Response:
        data = TokenLimitsInput(data=request.data)
        data.is_valid(raise_exception=True)
        made_with = request.auth if isinstance(request.auth, TokenGrant) else None
        token, key = services.api_token_create(user=request.user, made_with=made_with,
                                               **_token_limits(data.validated_data))
        return Response(token_output(token, key), status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={204: None})
    def destroy(self, request: Request, prefix: str) -> Response:
        services.api_token_revoke(actor=request.user, prefix=prefix)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ChannelViewSet(viewsets.ModelViewSet):
    """Notification channels: your own, and your teams' (their managers and staff change those).
    POST .../test/ sends a test message; GET .../deliveries/ lists what was sent and how it went."""

    serializer_class = ChannelSerializer

    def get_queryset(self):
        return channels_visible_to(self.request.user)

    def get_serializer_class(self):
        return ChannelUpdateSerializer if self.action in ("update", "partial_update") else ChannelSerializer

    def perform_create(self, serializer: ChannelSerializer) -> None:
        serializer.instance = services.channel_create(actor=self.request.user, **serializer.validated_data)

    def perform_update(self, serializer: ChannelSerializer) -> None:
        serializer.instance = services.channel_update(actor=self.request.user, channel=serializer.instance,
                                                      **serializer.validated_data)

    def perform_destroy(self, instance) -> None:
        services.channel_delete(actor=self.request.user, channel=instance)

    @extend_schema(request=None, responses={202: DeliverySerializer})
    @action(detail=True, methods=["post"])
    def test(self, request: Request, pk: str) -> Response:
        delivery = services.channel_test(actor=request.user, channel=self.get_object())
        return Response(DeliverySerializer(delivery).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses=DeliverySerializer(many=True))
    @action(detail=True, methods=["get"])
    def deliveries(self, request: Request, pk: str) -> Response:
        page = self.paginate_queryset(self.get_object().deliveries.order_by("-created_at", "-pk"))
        return self.get_paginated_response(DeliverySerializer(page, many=True).data)


class GroupMappingViewSet(viewsets.ModelViewSet):
    """Staff map identity provider groups to teams, roles and staff powers; they apply at each sign-in."""

    serializer_class = GroupMappingSerializer
    permission_classes = [IsAdminUser]
    queryset = GroupMapping.objects.select_related("team").order_by("group", "id")


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
