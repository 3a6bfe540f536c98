from django.contrib import admin

from inventory import services
from inventory.models import Cluster, Gpu, GpuPool, HostToken, Node


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "kind", "created_at"]
    list_filter = ["kind"]
    prepopulated_fields = {"slug": ["name"]}


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "cluster", "healthy", "schedulable", "last_seen_at"]
    list_filter = ["cluster", "healthy", "schedulable"]
    search_fields = ["name"]


@admin.register(GpuPool)
class GpuPoolAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "sharing_mode", "placement_policy"]
    list_filter = ["sharing_mode"]
    prepopulated_fields = {"slug": ["name"]}


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["uuid", "node", "index", "model_name", "memory_mib", "pool", "healthy"]
    list_filter = ["pool", "model_name", "healthy", "node__cluster"]
    search_fields = ["uuid", "node__name"]
    list_editable = ["pool", "healthy"]
    list_select_related = ["node__cluster", "pool"]


@admin.register(HostToken)
class HostTokenAdmin(admin.ModelAdmin):
    """Tokens are created through the API (the key is shown once); here staff see and revoke them."""

    list_display = ["cluster", "host_name", "prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["cluster", ("revoked_at", admin.EmptyFieldListFilter)]
    readonly_fields = ["cluster", "host_name", "prefix", "created_by", "created_at", "last_used_at"]
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        return False

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset) -> None:
        for token in queryset:
            services.host_token_revoke(actor=request.user, token=token)
