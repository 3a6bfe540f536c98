from django.contrib import admin

from monitoring.models import Alert, AlertRule, ClusterTelemetry, Silence


@admin.register(AlertRule)
class AlertRuleAdmin(admin.ModelAdmin):
    list_display = ["name", "metric", "scope", "pool", "comparison", "threshold", "for_seconds", "severity", "enabled"]
    list_filter = ["metric", "scope", "severity", "enabled"]
    search_fields = ["name"]


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):
    list_display = ["rule", "subject_label", "state", "observed", "active_since", "fired_at", "resolved_at",
                    "notifications"]
    list_filter = ["state", "rule"]
    search_fields = ["subject", "subject_label"]
    # Every field read-only; the value as `observed` in its place.
    readonly_fields = [f.name if f.name != "value" else "observed" for f in Alert._meta.fields]
    exclude = ["value"]

    @admin.display(description="value", ordering="value")
    def observed(self, alert: Alert) -> str:
        """The value as people read it (95.0), not the float's every digit (95.00086828167058)."""
        return f"{alert.value:.1f}"

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
