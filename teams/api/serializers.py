from rest_framework import serializers

from common.api import RefusesUnknownFields
from teams.models import Membership, Team


class TeamSerializer(RefusesUnknownFields, serializers.ModelSerializer):
    """A team; staff create, rename and cap it. Unknown fields are refused (`unknown_field`)."""

    # A JSON number (not DRF's default string), like the quotas'; null: no team-wide cap.
    max_ge = serializers.DecimalField(
        max_digits=8, decimal_places=2, min_value=0, allow_null=True, required=False, coerce_to_string=False,
        help_text="Most GPU-equivalents the team may hold across all pools at once (staff set it); null = no cap")

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


class TokenInput(RefusesUnknownFields, serializers.Serializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=4096, style={"input_type": "password"}, trim_whitespace=False)
    name = serializers.CharField(max_length=64, required=False, default="", allow_blank=True,
                                 help_text="What the token is for, to tell your tokens apart")


class TokenOutput(serializers.Serializer):
    token = serializers.CharField(help_text="The key: shown this once, only its digest is stored")
    prefix = serializers.CharField(help_text="The key's first characters, which name it in lists")
    name = serializers.CharField()
