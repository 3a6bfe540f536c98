from __future__ import annotations

from rest_framework import generics, permissions

from audit.api.serializers import AuditEntrySerializer
from audit.filters import AuditEntryFilterSet
from audit.selectors import audit_entries
from common.api import RefusesUnknownQueryParameters


class AuditEntryListView(RefusesUnknownQueryParameters, generics.ListAPIView):
    """Who changed what, when and from where (staff only), newest first: `?actor=<username>|system`,
    `object_type=<app_label.model>`, `object_id=`, `since=` and `until=` (ISO 8601), `source=`."""

    serializer_class = AuditEntrySerializer
    filterset_class = AuditEntryFilterSet
    permission_classes = [permissions.IsAdminUser]

    def get_queryset(self):
        return audit_entries()
