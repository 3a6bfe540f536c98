from urllib.parse import urlsplit

from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _
from rest_framework import serializers

from common import crypto
from common.api import RefusesUnknownFields
from teams.models import ApiToken, Delivery, GroupMapping, Membership, NotificationChannel, Team
from teams.notify import EVENTS


class TeamSerializer(RefusesUnknownFields, serializers.ModelSerializer):
    """A team; staff create, rename and cap it. Unknown fields are refused (`unknown_field`)."""

    # A JSON number (not DRF's default string), like the quotas'; null: no team-wide cap.
    max_ge = serializers.DecimalField(
        max_digits=8, decimal_places=2, min_value=0, allow_null=True, required=False, coerce_to_string=False,
        help_text=_("Most GPU-equivalents the team may hold across all pools at once (staff set it); null = no cap"))

    class Meta:
        model = Team
        fields = ["id", "slug", "name", "max_ge", "created_at"]


class MembershipSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username")

    class Meta:
        model = Membership
        fields = ["username", "role", "joined_at"]


class MembershipAddInput(RefusesUnknownFields, serializers.Serializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Membership.Role.choices, default=Membership.Role.MEMBER)


class MembershipChangeInput(RefusesUnknownFields, serializers.Serializer):
    role = serializers.ChoiceField(choices=Membership.Role.choices)


class TokenLimitsInput(RefusesUnknownFields, serializers.Serializer):
    """What a new token may do and how long it lives (every field optional)."""

    name = serializers.CharField(max_length=64, required=False, default="", allow_blank=True,
                                 help_text=_("What the token is for, to tell your tokens apart"))
    scope = serializers.ChoiceField(choices=ApiToken.Scope.choices, default=ApiToken.Scope.WRITE,
                                    help_text=_("read: it may only read; write: it may also book, extend and release"))
    teams = serializers.ListField(child=serializers.SlugField(max_length=64), required=False, default=list,
                                  max_length=100,
                                  help_text=_("Slugs of the teams it may see and act for; empty: all of yours. "
                                              "A team-limited token never carries staff powers"))
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None,
                                           help_text=_("When it stops working; default API_TOKEN_DEFAULT_DAYS "
                                                       "from now, at most API_TOKEN_MAX_AGE_DAYS"))


class TokenInput(TokenLimitsInput):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=4096, style={"input_type": "password"}, trim_whitespace=False)


class TokenOutput(serializers.Serializer):
    token = serializers.CharField(help_text=_("The key: shown this once, only its digest is stored"))
    prefix = serializers.CharField(help_text=_("The key's first characters, which name it in lists"))
    name = serializers.CharField()
    scope = serializers.CharField()
    teams = serializers.ListField(child=serializers.CharField())
    expires_at = serializers.DateTimeField()


class ApiTokenSerializer(serializers.ModelSerializer):
    """One of your tokens as lists show it: never its key or digest."""

    teams = serializers.SlugRelatedField(slug_field="slug", many=True, read_only=True)
    expires_at = serializers.DateTimeField(source="ends_at", read_only=True,
                                           help_text=_("When it stops working (its expiry or the maximum age)"))

    class Meta:
        model = ApiToken
        fields = ["prefix", "name", "scope", "teams", "created_at", "expires_at", "last_used_at"]
        read_only_fields = fields


def token_output(token: ApiToken, key: str) -> dict:
    return {"token": key, **ApiTokenSerializer(token).data}


class MyTeamSerializer(serializers.Serializer):
    slug = serializers.CharField()
    name = serializers.CharField()
    role = serializers.CharField(help_text=_("member, manager, or staff (a team staff see without being in it)"))


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    is_staff = serializers.BooleanField(help_text=_("Staff powers on this request (never through a team-limited token)"))
    teams = MyTeamSerializer(many=True, help_text=_("The teams this request may see and act for"))
    token = ApiTokenSerializer(allow_null=True, help_text=_("The token the request came with; null for a session"))


class GroupMappingSerializer(RefusesUnknownFields, serializers.ModelSerializer):
    """An identity provider group and what it gives: a team with a role, staff powers, or both."""

    # default=None: without it DRF's check of the (group, team) unique constraint made `team` required.
    team = serializers.SlugRelatedField(slug_field="slug", queryset=Team.objects.all(), allow_null=True,
                                        default=None, help_text=_("The team's slug; null when it only grants staff"))

    class Meta:
        model = GroupMapping
        fields = ["id", "group", "team", "role", "staff"]

    def validate(self, attrs: dict) -> dict:
        team = attrs.get("team", getattr(self.instance, "team", None))
        staff = attrs.get("staff", getattr(self.instance, "staff", False))
        if team is None and not staff:
            raise serializers.ValidationError({"team": serializers.ErrorDetail(
                _("A mapping gives a team, staff powers, or both."), code="gives_nothing")})
        return attrs


class ChannelSerializer(RefusesUnknownFields, serializers.ModelSerializer):
    """A notification channel: where a team's or your notifications go, and for which events. The URL and
    secret are write-only (a chat webhook's URL is itself a credential): `url_host` tells it apart."""

    team = serializers.SlugRelatedField(slug_field="slug", queryset=Team.objects.all(), allow_null=True,
                                        required=False, help_text=_("The team's slug; null: a channel of your own"))
    url = serializers.URLField(write_only=True, required=False, allow_blank=True, max_length=2000,
                               help_text=_("webhook, slack, dingtalk, wecom, feishu: the incoming webhook URL"))
    secret = serializers.CharField(write_only=True, required=False, allow_blank=True, max_length=256, help_text=_(
        "webhook: the HMAC-SHA256 key of X-GpuPool-Signature; dingtalk, feishu: the robot's signing secret"))
    events = serializers.ListField(child=serializers.CharField(max_length=64), max_length=50, help_text=format_lazy(
        _("Which events it receives: {events}"), events=", ".join(EVENTS)))
    url_host = serializers.SerializerMethodField(help_text=_("The URL's host, to tell channels apart"))

    class Meta:
        model = NotificationChannel
        fields = ["id", "name", "kind", "team", "email", "url", "secret", "url_host", "events", "enabled",
                  "created_at", "last_attempt_at", "last_error", "failing_since"]
        read_only_fields = ["created_at", "last_attempt_at", "last_error", "failing_since"]

    def get_url_host(self, channel: NotificationChannel) -> str | None:
        return urlsplit(crypto.decrypt(channel.url_encrypted)).hostname if channel.url_encrypted else None


class ChannelUpdateSerializer(ChannelSerializer):
    class Meta(ChannelSerializer.Meta):
        read_only_fields = [*ChannelSerializer.Meta.read_only_fields, "kind", "team"]


class DeliverySerializer(serializers.ModelSerializer):
    class Meta:
        model = Delivery
        fields = ["id", "event", "status", "attempts", "next_attempt_at", "response_status", "last_error",
                  "created_at", "delivered_at"]
        read_only_fields = fields
