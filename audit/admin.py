"""The audit log in the admin: read-only (no add, change or delete, not even by a superuser)."""
from auditlog.admin import LogEntryAdmin
from auditlog.filters import ResourceTypeFilter
from django.contrib import admin
from django.utils.translation import gettext_lazy as _

from audit.models import AuditEntry

# django-auditlog's admin registers whichever entry model is configured; ours replaces it.
if admin.site.is_registered(AuditEntry):
    admin.site.unregister(AuditEntry)


@admin.register(AuditEntry)
class AuditEntryAdmin(LogEntryAdmin):
    list_display = ["created", "resource_url", "action", "msg_short", "user_url", "source"]
    # No correlation-id filter: entries carry none (auditlog's middleware, which reads one, is not used).
    list_filter = ["source", "action", ResourceTypeFilter]
    list_select_related = ["content_type"]
    search_fields = ["object_repr", "actor_username", "actor_email"]
    fieldsets = [
        (None, {"fields": ["created", "user_url", "source", "resource_url"]}),
        (_("Changes"), {"fields": ["action", "msg"]}),
    ]
    readonly_fields = [*LogEntryAdmin.readonly_fields, "source"]

    @admin.display(description=_("Actor"))
    def user_url(self, obj: AuditEntry) -> str:
        # The username written with the entry: the account may be gone (entries outlive it). "system"
        # is the API's code for no person; here it is a word to read.
        return obj.actor_username or _("system")

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
