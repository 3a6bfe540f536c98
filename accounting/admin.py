"""The usage ledger in the admin: read-only (the closing task writes it; a hand edit would be lost at the next
close); the chargeback prices; the frozen statements, read-only."""
from django import forms
from django.contrib import admin

from accounting import services
from accounting.models import ClosedHour, LedgerDay, LedgerEntry, LedgerMonth, Price, Statement, StatementLine
from common.errors import ApplicationError


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


class PriceForm(forms.ModelForm):
    class Meta:
        model = Price
        fields = ["gpu_model", "pool", "price_per_ge_hour", "currency", "valid_from"]

    def clean(self):
        data = super().clean()
        try:
            services.price_check(gpu_model=data.get("gpu_model", ""), currency=data.get("currency", ""),
                                 price_per_ge_hour=data.get("price_per_ge_hour") or 0)
        except ApplicationError as error:
            raise forms.ValidationError({e.field: e.message for e in error.errors}) from None
        return data


@admin.register(Price)
class PriceAdmin(admin.ModelAdmin):
    """Prices: added here or by the API; one in force is history (not changed, not deleted): set a new one."""

    form = PriceForm
    list_display = ["gpu_model", "pool", "price_per_ge_hour", "currency", "valid_from", "created_by", "created_at"]
    list_filter = ["currency", "pool"]
    search_fields = ["gpu_model"]

    def has_change_permission(self, request, obj=None) -> bool:
        return super().has_change_permission(request, obj) and (obj is None or obj.valid_from > services.today_utc())

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def save_model(self, request, obj, form, change) -> None:
        if not change:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)


class StatementLineInline(admin.TabularInline):
    model = StatementLine
    extra = 0
    can_delete = False
    readonly_fields = ["pool", "gpu_model", "mode", "booked_ge_hours", "used_ge_hours", "gpu_hours", "cost",
                       "currency"]

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Statement)
class StatementAdmin(ReadOnly):
    list_display = ["month", "team", "closed_at"]
    list_filter = ["month"]
    inlines = [StatementLineInline]
