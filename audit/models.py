"""The audit entry: django-auditlog's entry (object, action, changed fields before and after, actor,
time) plus where the change came from. Entries are append-only: see append_only() below and the
PostgreSQL trigger in migrations/0002_append_only.py."""
from __future__ import annotations

from auditlog.models import AbstractLogEntry, LogEntryManager
from django.conf import settings
from django.db import models
from django.utils import translation
from django.utils.translation import gettext_lazy as _

from audit.context import Source, current


class AppendOnly(RuntimeError):
    """Code tried to change or delete an audit entry: a bug, never a user's mistake."""


class AuditEntryQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise AppendOnly("audit entries are never updated")

    def delete(self):
        raise AppendOnly("audit entries are deleted only by the retention task (audit.services)")


class AuditEntryManager(LogEntryManager.from_queryset(AuditEntryQuerySet)):
    """django-auditlog writes an entry's object_repr (and an m2m change's members) as str() of the objects,
    which speaks the active language: a person working in Chinese would write Chinese into a log that
    someone else reads and searches later. Entries are written in the portal's default language
    (settings.LANGUAGE_CODE), whoever acts."""

    def log_create(self, *args, **kwargs):
        with translation.override(settings.LANGUAGE_CODE):
            return super().log_create(*args, **kwargs)

    def log_m2m_changes(self, *args, **kwargs):
        with translation.override(settings.LANGUAGE_CODE):
            return super().log_m2m_changes(*args, **kwargs)


class AuditEntry(AbstractLogEntry):
    source = models.CharField(_("source"), max_length=8, choices=Source.choices, default=Source.SYSTEM,
                              db_index=True)
    # Entries outlive what they name: deleting a user or a model's content type must neither cascade
    # into the log nor rewrite it (SET_NULL would be an UPDATE, which the trigger refuses). The
    # username and e-mail written beside the id say who it was after the account is gone.
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.DO_NOTHING, db_constraint=False,
                              null=True, blank=True, related_name="+", verbose_name=_("actor"))
    actor_username = models.CharField(_("actor username"), max_length=150, blank=True, default="")
    content_type = models.ForeignKey("contenttypes.ContentType", on_delete=models.PROTECT, related_name="+",
                                     verbose_name=_("content type"))

    objects = AuditEntryManager()

    class Meta(AbstractLogEntry.Meta):
        verbose_name = _("audit entry")
        verbose_name_plural = _("audit entries")
        # The API's and the page's filters: an object's history, and one person's changes, newest first.
        indexes = [models.Index(fields=["content_type", "object_id", "-timestamp"], name="audit_object_time"),
                   models.Index(fields=["actor_username", "-timestamp"], name="audit_actor_time")]

    def save(self, *args, **kwargs) -> None:
        if not self._state.adding:
            raise AppendOnly("audit entries are never updated")
        acting = current()
        if not self.source or self.source == Source.SYSTEM:
            self.source = acting.source
        if self.actor_id is None:
            actor = acting.actor()
            if actor is not None:
                self.actor = actor
        if self.actor_id is not None:
            self.actor_username = self.actor.get_username()
            self.actor_email = getattr(self.actor, "email", None) or None
        if acting.detail:
            self.additional_data = {"task": acting.detail, **(self.additional_data or {})}
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AppendOnly("audit entries are deleted only by the retention task (audit.services)")

    @property
    def object_type(self) -> str:
        return f"{self.content_type.app_label}.{self.content_type.model}"

    @property
    def actor_label(self) -> str:
        return self.actor_username or "system"
