from django.apps import AppConfig, apps
from django.conf import settings
from django.utils.translation import gettext_lazy as _

# Left out of every tracked model's entries: what changes on each heartbeat, use or save.
ALWAYS_UNTRACKED = ("created_at", "updated_at", "last_used_at", "last_seen_at", "last_login")


class AuditConfig(AppConfig):
    name = "audit"
    verbose_name = _("Audit log")

    def ready(self) -> None:
        from auditlog.registry import auditlog

        from audit import context

        # Registered here, by label, so this app imports none of the apps it records. Reverse relations
        # are left out too: django-auditlog would write a created row's as "allocations.Quota.None".
        for label, untracked in settings.AUDIT_TRACKED_MODELS.items():
            model = apps.get_model(label)
            derived = [model._meta.pk.name, *(f.name for f in model._meta.get_fields() if f.auto_created and not f.concrete)]
            auditlog.register(model, exclude_fields=[*ALWAYS_UNTRACKED, *untracked, *derived])
        context.connect_celery_signals()
