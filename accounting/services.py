"""Writes of the accounting app: chargeback prices, and closing a month into frozen statements.

Each function is one transaction. A price in force is never rewritten: a change of price is a new
price from a later day (price_create), and only a price not yet in force may be corrected
(price_update). A closed month's statements are written once (statements_close) and never again."""
from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from accounting import selectors
from accounting.currencies import ISO_4217
from accounting.models import ClosedHour, Price, Statement, StatementLine
from common.errors import Conflict, FieldError, PermissionDenied, ValidationFailed
from inventory.models import Gpu, GpuModel, GpuPool
from teams.models import Team


def today_utc() -> date:
    return timezone.now().astimezone(UTC).date()


def price_check(*, gpu_model: str, currency: str, price_per_ge_hour: Decimal) -> None:
    errors = []
    if not (GpuModel.objects.filter(name=gpu_model).exists() or Gpu.objects.filter(model_name=gpu_model).exists()):
        errors.append(FieldError("gpu_model", "does_not_exist", _(
            "No GPU model %(name)s is known: give a model name as the GPUs report it.") % {"name": repr(gpu_model)}))
    if currency not in ISO_4217:
        errors.append(FieldError("currency", "invalid_choice", _(
            "%(code)s is not an ISO 4217 currency code (e.g. CNY, USD, EUR).") % {"code": repr(currency)}))
    if price_per_ge_hour < 0:
        errors.append(FieldError("price_per_ge_hour", "min_value", _("A price cannot be negative.")))
    if errors:
        raise ValidationFailed(errors[0].message, errors=errors)


def _same_key(gpu_model: str, pool: GpuPool | None):
    return Price.objects.filter(gpu_model=gpu_model, pool=pool)


@transaction.atomic
def price_create(*, actor, gpu_model: str, pool: GpuPool | None, price_per_ge_hour: Decimal, currency: str,
                 valid_from: date) -> Price:
    """A new price for a model (in one pool, or every pool) from `valid_from` on. It may not start on or
    before a price of the same model and pool already in force: that would rewrite what past hours cost."""
    if not actor.is_staff:
        raise PermissionDenied(_("Only staff can set prices."), field="price", rule="staff_required")
    price_check(gpu_model=gpu_model, currency=currency, price_per_ge_hour=price_per_ge_hour)
    # One writer per model at a time: the check below and the insert see the same history.
    list(Price.objects.select_for_update().filter(gpu_model=gpu_model))
    latest_in_force = (_same_key(gpu_model, pool).filter(valid_from__lte=today_utc()).order_by("-valid_from")
                       .values_list("valid_from", flat=True).first())
    if latest_in_force is not None and valid_from <= latest_in_force:
        raise Conflict(_("A price of this model and pool is in force since %(day)s: a new price must start after "
                         "it (prices in force are history and are not rewritten).") % {"day": latest_in_force},
                       field="valid_from", rule="before_price_in_force")
    if _same_key(gpu_model, pool).filter(valid_from=valid_from).exists():
        raise Conflict(_("This model and pool already have a price from %(day)s: change that one instead.")
                       % {"day": valid_from}, field="valid_from", rule="exists")
    try:
        with transaction.atomic():
            return Price.objects.create(gpu_model=gpu_model, pool=pool, price_per_ge_hour=price_per_ge_hour,
                                        currency=currency, valid_from=valid_from, created_by=actor)
    except IntegrityError:  # a concurrent create of the same day (another pool's lock did not cover it)
        raise Conflict(_("This model and pool already have a price from %(day)s: change that one instead.")
                       % {"day": valid_from}, field="valid_from", rule="exists") from None


@transaction.atomic
def price_update(*, actor, price: Price, **changes) -> Price:
    """Correct a price not yet in force (its amount, currency or first day; not its model or pool)."""
    if not actor.is_staff:
        raise PermissionDenied(_("Only staff can set prices."), field="price", rule="staff_required")
    price = Price.objects.select_for_update().get(pk=price.pk)
    today = today_utc()
    if price.valid_from <= today:
        raise Conflict(_("This price is in force since %(day)s and is history now: set a new price from a later "
                         "day instead.") % {"day": price.valid_from}, field="valid_from", rule="in_force")
    for name in ("gpu_model", "pool"):
        if name in changes and changes[name] != getattr(price, name):
            raise ValidationFailed(_("The model and pool of a price cannot change: set a new price instead."),
                                   field=name, rule="read_only")
    new = {name: changes.get(name, getattr(price, name)) for name in ("price_per_ge_hour", "currency", "valid_from")}
    price_check(gpu_model=price.gpu_model, currency=new["currency"], price_per_ge_hour=new["price_per_ge_hour"])
    if new["valid_from"] <= today:
        raise ValidationFailed(_("A correction cannot start the price today or earlier: set a new price instead."),
                               field="valid_from", rule="not_future")
    if _same_key(price.gpu_model, price.pool).filter(valid_from=new["valid_from"]).exclude(pk=price.pk).exists():
        raise Conflict(_("This model and pool already have a price from %(day)s: change that one instead.")
                       % {"day": new["valid_from"]}, field="valid_from", rule="exists")
    for name, value in new.items():
        setattr(price, name, value)
    price.save()
    return price


# --- statements ---------------------------------------------------------------------------

def month_bounds(month: date) -> tuple[datetime, datetime]:
    start = datetime(month.year, month.month, 1, tzinfo=UTC)
    return start, (start + timedelta(days=32)).replace(day=1)


def month_is_final(month: date, now: datetime) -> bool:
    """The month has ended, its last hour is closed for good, and none of its hours is provisional (hours
    close in order, so every hour of it the ledger ever held is final)."""
    start, end = month_bounds(month)
    if end > now:
        return False
    hours = ClosedHour.objects.filter(hour__gte=start, hour__lt=end)
    return (hours.filter(hour=end - timedelta(hours=1), final=True).exists()
            and not hours.filter(final=False).exists())


@transaction.atomic
def statements_close(*, month: date, now: datetime | None = None) -> int:
    """Freeze every team's statement of `month` (all its hours final), with the prices in force now; returns
    how many were written (0: not final yet, or closed already)."""
    now = now or timezone.now()
    month = month.replace(day=1)
    if not month_is_final(month, now):
        return 0
    start, end = month_bounds(month)
    written = 0
    for team in Team.objects.order_by("pk").exclude(
            pk__in=Statement.objects.filter(month=month).values("team_id")):
        query = selectors.UsageQuery(start, end, ("pool", "model", "mode"), frozenset([team.pk]), named=False)
        try:
            with transaction.atomic():
                # Two closing runs at once: the second waits on the unique (team, month) and gives way.
                statement = Statement.objects.create(team=team, month=month, closed_at=now)
                StatementLine.objects.bulk_create([
                    StatementLine(statement=statement, pool_id=pool, gpu_model=model, mode=mode,
                                  booked_ge_hours=figures["booked_ge_hours"], used_ge_hours=figures["used_ge_hours"],
                                  gpu_hours=figures["gpu_hours"], cost=figures["cost"], currency=figures["currency"])
                    for pool, model, mode, *rest in selectors.usage_rows(query)
                    for figures in [dict(zip(selectors.FIGURES, rest))]])
        except IntegrityError:
            continue
        written += 1
    return written


def statements_close_due(*, now: datetime | None = None) -> int:
    """Close each ended month not closed yet whose hours are all final (the ledger's closing run calls it)."""
    now = now or timezone.now()
    closed = set(Statement.objects.values_list("month", flat=True).distinct())
    months = {hour.date() for hour in ClosedHour.objects.filter(hour__lt=now).datetimes("hour", "month", tzinfo=UTC)}
    return sum(statements_close(month=month, now=now) for month in sorted(months - closed))
