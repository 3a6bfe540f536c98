from __future__ import annotations

from rest_framework import serializers

from common.api import CleanModelSerializer
from inventory.models import GpuPool
from monitoring.models import Alert, AlertRule


class AlertRuleSerializer(CleanModelSerializer):
    pool = serializers.SlugRelatedField(slug_field="slug", queryset=GpuPool.objects.all(), required=False,
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
    pool = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = Alert
        fields = ["id", "rule", "severity", "subject", "subject_label", "pool", "node", "team", "state", "value",
                  "active_since", "fired_at", "resolved_at", "last_notified_at", "notifications"]
        read_only_fields = fields
