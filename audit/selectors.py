from __future__ import annotations

from django.db.models import QuerySet

from audit.models import AuditEntry


def audit_entries() -> QuerySet[AuditEntry]:
    """Newest first, with what each entry's row shows."""
    return AuditEntry.objects.select_related("content_type").order_by("-timestamp", "-id")
