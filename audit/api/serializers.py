from __future__ import annotations

from django.utils.translation import gettext_lazy as _
from rest_framework import serializers

from audit.models import AuditEntry


class AuditEntrySerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_label", read_only=True,
                                  help_text=_('The username of who acted, or "system".'))
    action = serializers.CharField(source="get_action_display", read_only=True)
    object_type = serializers.CharField(read_only=True, help_text=_("app_label.model, e.g. allocations.quota"))
    changes = serializers.JSONField(read_only=True, help_text=_("Each changed field: [before, after]."))
    additional_data = serializers.JSONField(
        read_only=True, help_text=_("What else is known: the task that acted; for a reservation, its event "
                                    "(reservation_event, the id in the reservation's events) and the reason."))

    class Meta:
        model = AuditEntry
        fields = ["id", "timestamp", "actor", "actor_id", "source", "action", "object_type", "object_id",
                  "object_repr", "changes", "additional_data"]
        read_only_fields = fields
