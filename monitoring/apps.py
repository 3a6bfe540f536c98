from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class MonitoringConfig(AppConfig):
    name = "monitoring"
    verbose_name = _("Monitoring: telemetry and alerts")

    def ready(self) -> None:
        from django.db.models.signals import pre_delete

        from monitoring import alerts
        from monitoring.models import AlertRule

        pre_delete.connect(alerts.on_rule_deleted, sender=AlertRule, dispatch_uid="monitoring.alert_rule_deleted")
