"""The usage ledger in the admin: read-only (the closing task writes it; a hand edit would be lost at the next close)."""
from django.contrib import admin

from accounting.models import ClosedHour, LedgerDay, LedgerEntry, LedgerMonth


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnly):
    list_display = ["hour", "team", "pool", "gpu_model", "mode", "reservation_id", "booked_ge_hours", "used_ge_hours",
                    "no_data_ge_hours"]
    list_filter = ["mode", "pool"]
    list_select_related = ["team", "pool"]
    date_hierarchy = "hour"
    show_full_result_count = False


@admin.register(LedgerDay)
class LedgerDayAdmin(ReadOnly):
    list_display = ["day", "team", "user", "pool", "gpu_model", "mode", "booked_ge_hours", "used_ge_hours",
                    "no_data_ge_hours", "gpu_hours"]
    list_filter = ["mode", "pool"]
    list_select_related = ["team", "user", "pool"]
    date_hierarchy = "day"
    show_full_result_count = False


@admin.register(LedgerMonth)
class LedgerMonthAdmin(ReadOnly):
    list_display = ["month", "team", "user", "pool", "gpu_model", "mode", "booked_ge_hours", "used_ge_hours",
                    "no_data_ge_hours", "gpu_hours"]
    list_filter = ["mode", "pool"]
    list_select_related = ["team", "user", "pool"]
    show_full_result_count = False


@admin.register(ClosedHour)
class ClosedHourAdmin(ReadOnly):
    list_display = ["hour", "final", "entries", "closed_at"]
    list_filter = ["final"]
