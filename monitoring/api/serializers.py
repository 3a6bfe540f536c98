from __future__ import annotations

from rest_framework import serializers

from common.api import CleanModelSerializer, RefusesUnknownFields, SlugLookupField
from inventory.models import GpuPool
from monitoring.models import Alert, AlertRule, Silence


class AlertRuleSerializer(RefusesUnknownFields, CleanModelSerializer):
    pool = SlugLookupField(slug_field="slug", queryset=GpuPool.objects.all(), required=False,
                                        allow_null=True)

    class Meta:
        model = AlertRule
        fields = ["id", "name", "metric", "scope", "pool", "comparison", "threshold", "for_seconds", "repeat_seconds",
                  "severity", "notify_team_managers", "notify_team_members", "notify_staff", "extra_emails", "enabled",
                  "created_at"]
        read_only_fields = ["id", "created_at"]


class AlertSerializer(serializers.ModelSerializer):
    rule = serializers.CharField(source="rule.name")
    severity = serializers.CharField(source="rule.severity")
    # A GPU or node alert may concern no team, a team alert no pool: null then, and the schema says so.
    pool = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)

    class Meta:
        model = Alert
        fields = ["id", "rule", "severity", "subject", "subject_label", "pool", "node", "team", "state", "value",
                  "active_since", "fired_at", "resolved_at", "last_notified_at", "notifications"]
        read_only_fields = fields


class SilenceSerializer(RefusesUnknownFields, CleanModelSerializer):
    """Mutes the notifications of matching alerts (rule, subject, pool; empty matches all) until ends_at."""

    rule = serializers.PrimaryKeyRelatedField(queryset=AlertRule.objects.all(), required=False, allow_null=True)
    pool = SlugLookupField(slug_field="slug", queryset=GpuPool.objects.all(), required=False,
                                        allow_null=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True,
                                              allow_null=True)  # None once the account is deleted
    starts_at = serializers.DateTimeField(required=False)

    class Meta:
        model = Silence
        fields = ["id", "rule", "subject", "pool", "comment", "created_by", "starts_at", "ends_at"]
        read_only_fields = ["id", "created_by"]

    def validate(self, attrs):
        if "starts_at" not in attrs and self.instance is None:
            from django.utils import timezone

            attrs["starts_at"] = timezone.now()
        return super().validate(attrs)
