from django.contrib import admin
from django.utils.formats import number_format
from django.utils.translation import gettext_lazy as _

from monitoring.models import Alert, AlertRule, ClusterTelemetry, Silence


@admin.register(AlertRule)
class AlertRuleAdmin(admin.ModelAdmin):
    list_display = ["name", "metric", "scope", "pool", "comparison", "threshold", "for_seconds", "severity", "enabled"]
    list_filter = ["metric", "scope", "severity", "enabled"]
    search_fields = ["name"]


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):
    list_display = ["rule", "subject_label", "state", "shown_value", "active_since", "fired_at", "resolved_at",
                    "notifications"]
    list_filter = ["state", "rule"]
    search_fields = ["subject", "subject_label"]
    # The measured value as people read it (95.0, not 95.00086828167058), in the field's place.
    fields = readonly_fields = [("shown_value" if f.name == "value" else f.name) for f in Alert._meta.fields
                                if f.name != "id"]

    @admin.display(description=_("value"), ordering="value")
    def shown_value(self, alert: Alert) -> str:
        # In the viewer's language's number format (grouped thousands).
        if abs(alert.value) < 1000:
            return number_format(alert.value, 1)
        return number_format(alert.value, 0, force_grouping=True)

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(Silence)
class SilenceAdmin(admin.ModelAdmin):
    list_display = ["__str__", "rule", "subject", "pool", "starts_at", "ends_at", "created_by"]
    list_filter = ["rule"]

    def save_model(self, request, obj, form, change) -> None:
        if not change and obj.created_by_id is None:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)


@admin.register(ClusterTelemetry)
class ClusterTelemetryAdmin(admin.ModelAdmin):
    """Read-only: the portal writes these after each read of a cluster's telemetry."""

    list_display = ["cluster", "source", "last_success_at", "lag_seconds", "sample_period_seconds", "series_read",
                    "unknown_gpus", "error"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
