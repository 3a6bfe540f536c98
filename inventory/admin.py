from django.contrib import admin

from inventory.models import Cluster, Gpu, GpuPool, Node


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
