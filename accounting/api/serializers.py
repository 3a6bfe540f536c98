"""What GET /api/v1/usage/ answers, for the OpenAPI schema (the view builds the body itself)."""
from __future__ import annotations

from django.utils.translation import gettext_lazy as _
from rest_framework import serializers


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
