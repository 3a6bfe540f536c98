"""What GET /api/v1/usage/ and the statements answer (the views build their bodies), and the prices."""
from __future__ import annotations

from django.utils.translation import gettext_lazy as _
from rest_framework import serializers

from accounting.models import Price
from common.api import RefusesUnknownFields, SlugLookupField
from inventory.models import GpuPool


class UsageFiguresSerializer(serializers.Serializer):
    booked_ge_hours = serializers.FloatField(help_text=_("GE-hours held: each grant's GE x the hours it held"))
    used_ge_hours = serializers.FloatField(
        help_text=_("GE-hours of those the telemetry says were busy (utilization or memory in use)"))
    idle_ge_hours = serializers.FloatField(help_text=_("Booked, with telemetry, and idle"))
    no_data_ge_hours = serializers.FloatField(help_text=_("Booked GE-hours no telemetry covers (not counted as used)"))
    gpu_hours = serializers.FloatField(help_text=_("Share of a card held x hours, without the model's weight"))
    efficiency = serializers.FloatField(allow_null=True, help_text=_("used / booked; null when nothing was booked"))
    measured_efficiency = serializers.FloatField(
        allow_null=True, help_text=_("used / (booked - no data): over the hours with telemetry only"))


class UsageReportSerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    group_by = serializers.ListField(child=serializers.CharField())
    columns = serializers.ListField(child=serializers.CharField(),
                                    help_text=_("The groups, then the figures: the CSV's header"))
    totals = UsageFiguresSerializer()
    rows = serializers.ListField(
        child=serializers.DictField(),
        help_text=_("One per group: its values (team, pool, model, user, mode, day/week/month) and the figures"))


class PriceSerializer(RefusesUnknownFields, serializers.ModelSerializer):
    """A chargeback price: one GE-hour of `gpu_model` (in `pool` only, or every pool) from `valid_from` on.
    Unknown fields are refused (`unknown_field`); the rules (known model and currency, not negative, never
    rewriting a price in force) are accounting.services'."""

    pool = SlugLookupField(slug_field="slug", queryset=GpuPool.objects.all(), required=False, allow_null=True,
                           help_text=_("Only in this pool, overriding the model's price; null: every pool"))
    price_per_ge_hour = serializers.DecimalField(max_digits=12, decimal_places=4, coerce_to_string=False,
                                                 help_text=_("Price of one GE-hour, >= 0"))
    currency = serializers.CharField(max_length=3, help_text=_("ISO 4217 code, e.g. CNY, USD"))
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True,
                                              help_text=_("Who set it; null: set outside the API, or the account is gone"))

    class Meta:
        model = Price
        fields = ["id", "gpu_model", "pool", "price_per_ge_hour", "currency", "valid_from", "created_by",
                  "created_at"]
        read_only_fields = ["created_at"]
        validators: list = []  # uniqueness and history are the service's (409), not a 400 here


class StatementLineSerializer(serializers.Serializer):
    pool = serializers.CharField()
    gpu_model = serializers.CharField()
    mode = serializers.CharField()
    booked_ge_hours = serializers.FloatField()
    used_ge_hours = serializers.FloatField()
    idle_ge_hours = serializers.FloatField(help_text=_("booked - used"))
    gpu_hours = serializers.FloatField()
    cost = serializers.FloatField(allow_null=True)
    currency = serializers.CharField(help_text=_("Empty: no price in force; several, comma-separated: not added up"))


class StatementSerializer(serializers.Serializer):
    team = serializers.CharField()
    month = serializers.CharField(help_text=_("YYYY-MM"))
    status = serializers.ChoiceField(choices=["closed", "provisional"])
    closed_at = serializers.DateTimeField(allow_null=True)
    lines = StatementLineSerializer(many=True)
    totals = serializers.DictField()
