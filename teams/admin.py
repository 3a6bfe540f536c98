from django.contrib import admin
from django.utils.translation import gettext_lazy as _

from teams.models import ApiToken, GroupMapping, Membership, Team


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "max_ge", "created_at"]
    fields = ["slug", "name", "max_ge"]
    search_fields = ["slug", "name"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["team", "user", "role", "joined_at"]
    list_filter = ["role", "team"]
    search_fields = ["user__username", "team__slug"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Staff see and delete API tokens; keys are made by their users (POST /api/v1/auth/token/), shown once."""

    list_display = ["prefix", "user", "name", "scope", "created_at", "ends", "last_used_at"]
    list_filter = ["scope"]
    search_fields = ["user__username", "prefix", "name"]
    readonly_fields = ["user", "name", "prefix", "scope", "teams", "created_at", "expires_at", "last_used_at"]
    exclude = ["digest"]

    def has_add_permission(self, request) -> bool:
        return False

    @admin.display(description=_("ends at"))
    def ends(self, token: ApiToken):
        return token.ends_at()


@admin.register(GroupMapping)
class GroupMappingAdmin(admin.ModelAdmin):
    """Which identity provider groups give which team, role and staff powers (teams/identity.py)."""

    list_display = ["group", "team", "role", "staff"]
    list_filter = ["role", "staff", "team"]
    search_fields = ["group", "team__slug", "team__name"]
