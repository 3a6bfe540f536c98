"""The audit log's filters, shared by the API and the page."""
from __future__ import annotations

import django_filters
from auditlog.registry import auditlog
from django.apps import apps
from django.db.models import QuerySet
from django.utils.text import capfirst
from django.utils.translation import gettext_lazy as _

from audit.models import AuditEntry

# Written by hand (audit.services.audit_record), not by a registered model's signals.
RECORDED_BY_HAND = ("allocations.reservation",)


def object_types() -> list[tuple[str, str]]:
    """Every `app_label.model` the log holds entries for, each named by its model's name in the reader's
    language (the value stays the code the API takes)."""
    labels = {f"{model._meta.app_label}.{model._meta.model_name}" for model in auditlog.get_models()}
    choices = []
    for label in sorted({*labels, *RECORDED_BY_HAND}):
        try:
            name = capfirst(apps.get_model(label)._meta.verbose_name)
        except LookupError:  # a model since removed whose entries stay in the log
            name = label
        choices.append((label, name))
    return sorted(choices, key=lambda choice: str(choice[1]))


class AuditEntryFilterSet(django_filters.FilterSet):
    actor = django_filters.CharFilter(method="filter_actor", max_length=150,
                                      help_text=_('A username, or "system" for the entries no person made.'))
    object_type = django_filters.ChoiceFilter(choices=object_types, method="filter_object_type",
                                              help_text=_("app_label.model, e.g. allocations.quota"))
    object_id = django_filters.NumberFilter(min_value=0, max_value=2**63 - 1)
    since = django_filters.IsoDateTimeFilter(field_name="timestamp", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="timestamp", lookup_expr="lt")
    source = django_filters.ChoiceFilter(choices=AuditEntry._meta.get_field("source").choices)

    class Meta:
        model = AuditEntry
        fields = ["actor", "object_type", "object_id", "since", "until", "source"]

    def filter_actor(self, queryset: QuerySet[AuditEntry], name: str, value: str) -> QuerySet[AuditEntry]:
        if value == "system":
            return queryset.filter(actor_id__isnull=True)
        return queryset.filter(actor_username=value)

    def filter_object_type(self, queryset: QuerySet[AuditEntry], name: str, value: str) -> QuerySet[AuditEntry]:
        app_label, model = value.split(".", 1)
        return queryset.filter(content_type__app_label=app_label, content_type__model=model)
