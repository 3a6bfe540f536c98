"""The usage ledger: what each grant held, and used, hour by hour (accounting/ledger.py keeps it).

`LedgerEntry` is the ledger itself: one row per grant (allocations.Allocation) and clock hour (UTC)
that it overlaps, written when the hour is closed and written again (never duplicated: unique on
grant and hour) when late telemetry re-closes it. It copies what a report groups by (team, user,
pool, GPU model, sharing mode) so reports, and later the prices per GE-hour per model and pool,
read it without joining the grants. `LedgerDay` sums the entries of one UTC day per team, user,
pool, model and mode, rebuilt from them whenever one of the day's hours is (re)closed, and
`LedgerMonth` sums a month's days the same way: a report reads whole months from the month sums,
whole days at its edges from the day sums, and hours at its edges from the entries (a year by team
is a few hundred thousand rows at most, not one per GPU-hour).

Hours are GE-hours unless named otherwise: `booked` is the grant's GE x the part of the hour it
held; `used` the part of that the GPU's minute telemetry says was busy (utilization above
TELEMETRY_IDLE_UTIL_PCT or memory above USAGE_BUSY_MEMORY_MIB), x GE; `no_data` the part no
minute of telemetry covers (counted apart, never as used); `gpu_hours` the physical share of a
card x hours, no model weight (a whole card for an hour is 1, 2 of 4 time-slicing shares 0.5).
"""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from allocations.models import Allocation
from inventory.models import GpuPool
from teams.models import Team


class UsageFigures(models.Model):
    booked_ge_hours = models.FloatField(verbose_name=_("booked GE-hours"))
    used_ge_hours = models.FloatField(verbose_name=_("used GE-hours"))
    no_data_ge_hours = models.FloatField(verbose_name=_("GE-hours without telemetry"))
    gpu_hours = models.FloatField(verbose_name=_("GPU-hours"), help_text=_("Share of a card held x hours, no weight"))

    class Meta:
        abstract = True


class LedgerEntry(UsageFigures):
    """One grant in one clock hour (UTC)."""

    allocation = models.ForeignKey(Allocation, verbose_name=_("GPU grant"), on_delete=models.SET_NULL, null=True,
                                   blank=True, related_name="ledger_entries",
                                   help_text=_("Empty once the grant was deleted: its use stays on record"))
    reservation_id = models.BigIntegerField(verbose_name=_("reservation"))
    hour = models.DateTimeField(verbose_name=_("hour"), help_text=_("Start of the clock hour, UTC"))
    team = models.ForeignKey(Team, verbose_name=_("team"), on_delete=models.PROTECT, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, verbose_name=_("requester"), on_delete=models.SET_NULL,
                             null=True, blank=True, related_name="+")
    pool = models.ForeignKey(GpuPool, verbose_name=_("pool"), on_delete=models.PROTECT, related_name="+")
    gpu_id = models.BigIntegerField(verbose_name=_("GPU"))
    gpu_model = models.CharField(verbose_name=_("GPU model"), max_length=128)
    mode = models.CharField(verbose_name=_("sharing mode"), max_length=16)
    ge = models.FloatField(verbose_name=_("GE"))
    milli = models.PositiveSmallIntegerField(verbose_name=_("worth (thousandths of a GPU)"))
    seconds = models.FloatField(verbose_name=_("seconds held"), help_text=_("Of this hour"))
    closed_at = models.DateTimeField(verbose_name=_("closed at"))

    class Meta:
        verbose_name = _("usage ledger entry")
        verbose_name_plural = _("usage ledger entries")
        ordering = ["hour", "allocation_id"]
        constraints = [models.UniqueConstraint(fields=["allocation", "hour"], name="ledger_one_entry_per_grant_hour")]
        indexes = [
            # Reports over hours, and the day summary's rebuild, read a range of hours (all teams or one team's).
            models.Index(fields=["hour"], name="ledger_entry_hour"),
            models.Index(fields=["team", "hour"], name="ledger_entry_team_hour"),
        ]

    def __str__(self) -> str:
        return f"grant {self.allocation_id} at {self.hour:%Y-%m-%d %H:00}: {self.booked_ge_hours:.3f} GE-h"


class UsageGroup(UsageFigures):
    """What a report groups by, beside the figures: the day and month sums keep one row per such group."""

    team = models.ForeignKey(Team, verbose_name=_("team"), on_delete=models.PROTECT, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, verbose_name=_("requester"), on_delete=models.SET_NULL,
                             null=True, blank=True, related_name="+")
    pool = models.ForeignKey(GpuPool, verbose_name=_("pool"), on_delete=models.PROTECT, related_name="+")
    gpu_model = models.CharField(verbose_name=_("GPU model"), max_length=128)
    mode = models.CharField(verbose_name=_("sharing mode"), max_length=16)

    class Meta:
        abstract = True


class LedgerDay(UsageGroup):
    """The ledger's entries of one UTC day, summed per team, user, pool, GPU model and sharing mode."""

    day = models.DateField(verbose_name=_("day"))

    class Meta:
        verbose_name = _("usage ledger day")
        verbose_name_plural = _("usage ledger days")
        ordering = ["day", "team_id"]
        indexes = [
            models.Index(fields=["day"], name="ledger_day_day"),
            models.Index(fields=["team", "day"], name="ledger_day_team_day"),
        ]

    def __str__(self) -> str:
        return f"{self.day} team {self.team_id}: {self.booked_ge_hours:.3f} GE-h"


class LedgerMonth(UsageGroup):
    """The month's day sums (LedgerDay), summed again per team, user, pool, GPU model and sharing mode."""

    month = models.DateField(verbose_name=_("month"), help_text=_("Its first day"))

    class Meta:
        verbose_name = _("usage ledger month")
        verbose_name_plural = _("usage ledger months")
        ordering = ["month", "team_id"]
        indexes = [
            models.Index(fields=["month"], name="ledger_month_month"),
            models.Index(fields=["team", "month"], name="ledger_month_team_month"),
        ]

    def __str__(self) -> str:
        return f"{self.month:%Y-%m} team {self.team_id}: {self.booked_ge_hours:.3f} GE-h"


class ClosedHour(models.Model):
    """A clock hour the ledger has closed: `final` once closed again after the late-telemetry grace."""

    hour = models.DateTimeField(verbose_name=_("hour"), unique=True)
    closed_at = models.DateTimeField(verbose_name=_("closed at"))
    final = models.BooleanField(verbose_name=_("final"), default=False,
                                help_text=_("Closed again after USAGE_LATE_TELEMETRY_SECONDS: late telemetry counted"))
    entries = models.PositiveIntegerField(verbose_name=_("entries"), default=0)

    class Meta:
        verbose_name = _("closed ledger hour")
        ordering = ["-hour"]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H:00} ({'final' if self.final else 'provisional'})"


class Price(models.Model):
    """What one GE-hour of a GPU model costs from `valid_from` (a UTC day) on, in `currency`; with `pool`,
    only in that pool, where it overrides the model's price. A change of price is a new row with a later
    `valid_from`: rows in force are never rewritten (services.price_update refuses it), so past costs stay
    what they were. Which row is in force for an hour: accounting.pricing."""

    gpu_model = models.CharField(verbose_name=_("GPU model"), max_length=128,
                                 help_text=_("The model name as inventory reports it (Gpu.model_name)"))
    pool = models.ForeignKey(GpuPool, verbose_name=_("pool"), on_delete=models.PROTECT, null=True, blank=True,
                             related_name="+", help_text=_("Only in this pool, overriding the model's price; "
                                                           "empty: every pool"))
    price_per_ge_hour = models.DecimalField(verbose_name=_("price per GE-hour"), max_digits=12, decimal_places=4)
    currency = models.CharField(verbose_name=_("currency"), max_length=3, help_text=_("ISO 4217 code, e.g. CNY, USD"))
    valid_from = models.DateField(verbose_name=_("valid from"), help_text=_("First UTC day it applies to"))
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, verbose_name=_("set by"), on_delete=models.SET_NULL,
                                   null=True, blank=True, related_name="+")
    created_at = models.DateTimeField(verbose_name=_("created at"), auto_now_add=True)

    class Meta:
        verbose_name = _("chargeback price")
        verbose_name_plural = _("chargeback prices")
        ordering = ["gpu_model", "pool_id", "valid_from"]
        constraints = [
            models.CheckConstraint(condition=models.Q(price_per_ge_hour__gte=0), name="price_not_negative"),
            # Two partial constraints, not NULLS NOT DISTINCT: the embedded mode's SQLite has no such thing.
            models.UniqueConstraint(fields=["gpu_model", "pool", "valid_from"], condition=models.Q(pool__isnull=False),
                                    name="price_one_per_model_pool_day"),
            models.UniqueConstraint(fields=["gpu_model", "valid_from"], condition=models.Q(pool__isnull=True),
                                    name="price_one_per_model_day"),
        ]

    def __str__(self) -> str:
        where = f" ({self.pool})" if self.pool_id else ""
        return f"{self.gpu_model}{where}: {self.price_per_ge_hour} {self.currency} from {self.valid_from}"


class Statement(models.Model):
    """A team's frozen monthly statement: written once its month is closed (every hour final), with the
    prices then in force; later price changes or ledger rewrites leave it as it is."""

    team = models.ForeignKey(Team, verbose_name=_("team"), on_delete=models.CASCADE, related_name="+")
    month = models.DateField(verbose_name=_("month"), help_text=_("Its first day"))
    closed_at = models.DateTimeField(verbose_name=_("closed at"))

    class Meta:
        verbose_name = _("monthly statement")
        verbose_name_plural = _("monthly statements")
        ordering = ["-month", "team_id"]
        constraints = [models.UniqueConstraint(fields=["team", "month"], name="statement_one_per_team_month")]

    def __str__(self) -> str:
        return f"{self.team} {self.month:%Y-%m}"


class StatementLine(models.Model):
    """One pool x GPU model x sharing mode of a statement. `cost` is empty where no price was in force, and
    where its hours were priced in more than one currency (`currency` then names them all)."""

    statement = models.ForeignKey(Statement, verbose_name=_("statement"), on_delete=models.CASCADE,
                                  related_name="lines")
    pool = models.ForeignKey(GpuPool, verbose_name=_("pool"), on_delete=models.PROTECT, related_name="+")
    gpu_model = models.CharField(verbose_name=_("GPU model"), max_length=128)
    mode = models.CharField(verbose_name=_("sharing mode"), max_length=16)
    booked_ge_hours = models.FloatField(verbose_name=_("booked GE-hours"))
    used_ge_hours = models.FloatField(verbose_name=_("used GE-hours"))
    gpu_hours = models.FloatField(verbose_name=_("GPU-hours"))
    cost = models.DecimalField(verbose_name=_("cost"), max_digits=16, decimal_places=2, null=True, blank=True)
    currency = models.CharField(verbose_name=_("currency"), max_length=32, blank=True)

    class Meta:
        verbose_name = _("statement line")
        verbose_name_plural = _("statement lines")
        ordering = ["statement_id", "pool_id", "gpu_model", "mode"]

    def __str__(self) -> str:
        return f"{self.statement}: {self.gpu_model} {self.mode}"
