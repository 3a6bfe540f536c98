from django.contrib import admin

from allocations.models import Allocation, PriorityClass, Quota, Reservation, ReservationEvent


@admin.register(PriorityClass)
class PriorityClassAdmin(admin.ModelAdmin):
    list_display = ("name", "value", "description")


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    """Staff change quotas here; the next reservation is checked against the new numbers."""

    list_display = ["team", "pool", "max_ge", "ge_hours_per_month", "priority_class", "updated_at"]
    list_filter = ["pool", "team"]
    list_editable = ["max_ge", "ge_hours_per_month"]


class AllocationInline(admin.TabularInline):
    model = Allocation
    extra = 0
    can_delete = False
    readonly_fields = ["gpu", "starts_at", "ends_at"]


class EventInline(admin.TabularInline):
    model = ReservationEvent
    extra = 0
    can_delete = False
    readonly_fields = ["from_state", "to_state", "actor", "at", "reason"]


@admin.register(Reservation)
class ReservationAdmin(admin.ModelAdmin):
    """Read-only here: reservations change through the services (release/extend), which keep the history."""

    list_display = ["id", "team", "pool", "gpus", "starts_at", "ends_at", "state"]
    list_filter = ["state", "pool", "team"]
    readonly_fields = ["team", "pool", "requested_by", "gpus", "starts_at", "ends_at", "state", "reason",
                       "ended_at", "created_at", "updated_at"]
    inlines = [AllocationInline, EventInline]

    def has_add_permission(self, request) -> bool:
        return False
