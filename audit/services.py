"""Writes to the audit log that django-auditlog's signals cannot see, and its retention.

Saves and deletes of the tracked models are recorded by auditlog's signal receivers. A bulk
`QuerySet.update()` (a heartbeat marking a host healthy again, a discovery marking GPUs gone) and
the raw SQL of the reservation transitions send no signal: their code records what it changed here.
"""
from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.contenttypes.models import ContentType
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, models, transaction
from django.utils import timezone

from audit.context import current
from audit.models import AuditEntry
from common import sql

# The PostgreSQL trigger lets a DELETE through only for rows older than this many days, and only in a
# transaction that set it (audit_entries_delete_expired); see migrations/0002_append_only.py.
RETENTION_SETTING = "audit.retention_days"


# benchmarks/api_floor.py sends the same statement (a reservation create and release write two).
INSERT_ENTRY = (
    "INSERT INTO audit_auditentry (content_type_id, object_pk, object_id, object_repr, action, changes_text, "
    "changes, actor_id, actor_username, actor_email, timestamp, additional_data, source) "
    "VALUES (%s, %s, %s, %s, %s, '', %s, %s, %s, %s, %s, %s, %s)")


def audit_record(*, model: type[models.Model], object_id: int, object_repr: str, changes: dict[str, list[Any]],
                 action: int = AuditEntry.Action.UPDATE, actor: AbstractBaseUser | None = None,
                 additional_data: dict[str, Any] | None = None) -> None:
    """One entry for a change made without a model save: `changes` maps each field to [before, after].

    One INSERT by hand (common/sql.py says why): the reservation transitions call this on the
    create and release paths, where the ORM's create() would cost more than the change itself."""
    acting = current()
    if actor is None or not actor.is_authenticated:
        actor = acting.actor()
    if acting.detail:
        additional_data = {"task": acting.detail, **(additional_data or {})}
    sql.execute(
        INSERT_ENTRY,
        [ContentType.objects.get_for_model(model).pk, str(object_id), object_id, object_repr, action,
         json.dumps(changes, cls=DjangoJSONEncoder),
         actor.pk if actor is not None else None, actor.get_username() if actor is not None else "",
         (getattr(actor, "email", "") or None) if actor is not None else None,
         sql.db_datetime(timezone.now()),
         json.dumps(additional_data, cls=DjangoJSONEncoder) if additional_data else None, acting.source])


def audit_entries_delete_expired(*, now: datetime | None = None, retention_days: int | None = None) -> int:
    """Delete the entries older than the retention (AUDIT_RETENTION_DAYS); returns how many.

    The one path that deletes audit entries. On PostgreSQL it first sets RETENTION_SETTING for its
    own transaction, which the trigger requires before it lets a DELETE through, and then only for
    rows older than that many days by the database's clock, so even this path cannot delete a recent
    entry."""
    days = settings.AUDIT_RETENTION_DAYS if retention_days is None else retention_days
    if days < 1:
        raise ValueError("the audit retention is at least one day")
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                # The database's clock, which the trigger reads: a cutoff from this machine's clock,
                # a little ahead of it, would ask to delete rows the trigger refuses.
                cursor.execute("SELECT set_config(%s, %s, true), now()", [RETENTION_SETTING, str(days)])
                database_now = cursor.fetchone()[1]
            now = min(now, database_now) if now is not None else database_now
        cutoff = (now or timezone.now()) - timedelta(days=days)
        # models.QuerySet.delete, not AuditEntryQuerySet.delete, which refuses every other caller.
        deleted, _ = models.QuerySet.delete(AuditEntry.objects.filter(timestamp__lt=cutoff))
    return deleted
