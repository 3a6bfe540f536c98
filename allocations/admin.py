from datetime import timedelta

from django.contrib import admin
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from allocations.models import Allocation, PriorityClass, Quota, Reservation, ReservationEvent
from allocations.selectors import quotas_with_held_ge


@admin.register(PriorityClass)
class PriorityClassAdmin(admin.ModelAdmin):
    list_display = ("name", "value", "preemptible", "description")


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    """Staff change quotas here; the next reservation is checked against the new numbers. The list shows what
    each team holds now beside its limit, so a change is made knowing the current use."""

    list_display = ["team", "pool", "in_use", "max_ge", "ge_hours_per_month", "priority_class", "updated_at"]
    list_filter = ["pool", "team"]
    list_editable = ["max_ge", "ge_hours_per_month"]
    list_select_related = ["team", "pool", "priority_class"]

    def get_queryset(self, request):
        return quotas_with_held_ge(super().get_queryset(request))

    @admin.display(description=_("held now (GE)"), ordering="held_ge")
    def in_use(self, quota: Quota) -> str:
        held = getattr(quota, "held_ge", 0.0) or 0.0
        limit = float(quota.max_ge)
        share = f" ({round(100 * held / limit)} %)" if limit else ""
        return f"{held:.2f}{share}"


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


class WindowFilter(admin.SimpleListFilter):
    """Reservations by where their window lies from now: the questions staff ask of a fleet's bookings."""

    title = _("window")
    parameter_name = "window"
    CHOICES = (("now", _("Holding now")), ("next24h", _("Starts in the next 24 h")),
               ("next7d", _("Starts in the next 7 days")), ("past7d", _("Ended in the last 7 days")))

    def lookups(self, request, model_admin):
        return self.CHOICES

    def queryset(self, request, queryset):
        now = timezone.now()
        match self.value():
            case "now":
                return queryset.filter(starts_at__lte=now, ends_at__gt=now)
            case "next24h":
                return queryset.filter(starts_at__gt=now, starts_at__lte=now + timedelta(hours=24))
            case "next7d":
                return queryset.filter(starts_at__gt=now, starts_at__lte=now + timedelta(days=7))
            case "past7d":
                return queryset.filter(ends_at__lte=now, ends_at__gt=now - timedelta(days=7))
        return queryset


class KeptFilter(admin.SimpleListFilter):
    """Staff see which reservations their teams keep from the idle reclaim (and why, on each)."""

    title = _("kept from idle reclaim")
    parameter_name = "kept"

    def lookups(self, request, model_admin):
        return [("yes", _("Kept")), ("no", _("Not kept"))]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(keep_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(keep_at__isnull=True)
        return queryset


@admin.register(Reservation)
class ReservationAdmin(admin.ModelAdmin):
    """Read-only here: reservations change through the services (release/extend), which keep the history."""

    list_display = ["id", "team", "requested_by", "pool", "gpus", "starts_at", "ends_at", "state"]
    list_filter = ["state", "pool", "team", ("requested_by", admin.RelatedOnlyFieldListFilter), KeptFilter,
                   WindowFilter, ("starts_at", admin.DateFieldListFilter)]
    list_select_related = ["team", "pool", "requested_by"]
    search_fields = ["=id", "requested_by__username", "team__slug", "team__name"]
    date_hierarchy = "starts_at"
    readonly_fields = ["team", "pool", "requested_by", "gpus", "starts_at", "ends_at", "state", "reason",
                       "ended_at", "idle_warned_at", "idle_since", "keep_reason", "keep_by", "keep_at", "created_at",
                       "updated_at",
                       # Read-only, not a choice among every reservation (a select of the whole history).
                       "preempted_for"]
    inlines = [AllocationInline, EventInline]

    def has_add_permission(self, request) -> bool:
        return False
