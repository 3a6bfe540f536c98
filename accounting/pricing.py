"""Which chargeback price is in force for a ledger row (accounting.selectors prices the report's sums with it).

Prices (accounting.models.Price) are few (a handful per GPU model), rows of the ledger many: so the
prices are turned into periods, each (GPU model, pool or every pool, [from, to), price, currency).
A report's window is cut at the days where a period starts or ends (selectors.segments), the
database sums booked GE-hours per group, GPU model, pool and piece, and each such sum is priced
once here (price_at): nothing is priced row by row, neither in Python nor in SQL.

Rule: for a row of model M in pool P at time t, the price in force is the latest of M's prices for P
with valid_from <= t; where M has none for P in force yet, the latest of M's prices for every pool
(pool empty). A row no price covers costs nothing (its cost is empty).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from decimal import Decimal

from accounting.models import Price


@dataclass(frozen=True)
class Period:
    gpu_model: str
    pool_id: int | None
    start: date
    end: date | None  # exclusive; None: open
    price: Decimal
    currency: str


def price_periods() -> list[Period]:
    """Every price as the period it is in force, pool-specific ones first (they win over the model's)."""
    rows = list(Price.objects.order_by("gpu_model", "pool_id", "valid_from").values_list(
        "gpu_model", "pool_id", "valid_from", "price_per_ge_hour", "currency"))
    periods = []
    for i, (model, pool, start, price, currency) in enumerate(rows):
        following = rows[i + 1] if i + 1 < len(rows) else None
        end = following[2] if following and following[:2] == (model, pool) else None
        periods.append(Period(model, pool, start, end, price, currency))
    return sorted(periods, key=lambda p: p.pool_id is None)


def boundaries(periods: list[Period]) -> frozenset[date]:
    """The days on which some price starts or ends: between two of them every price is one."""
    return frozenset({p.start for p in periods} | {p.end for p in periods if p.end is not None})


def price_at(periods: list[Period], gpu_model: str, pool_id: int, day: date) -> Period | None:
    """The price in force on `day` for the model in the pool (see the module), or None."""
    for period in periods:  # the pool's own prices first
        if (period.gpu_model == gpu_model and period.pool_id in (pool_id, None) and period.start <= day
                and (period.end is None or day < period.end)):
            return period
    return None


def cost_and_currency(costs: dict[str, float | None]) -> tuple[float | None, str]:
    """A group's cost and its currency from its sums per currency: one currency, its sum; none, no cost;
    several, no cost (they are not added up) and the currencies named, comma-separated."""
    priced = {currency: value for currency, value in costs.items() if value is not None}
    if not priced:
        return None, ""
    if len(priced) > 1:
        return None, ",".join(sorted(priced))
    [(currency, value)] = priced.items()
    return round(value, 2), currency
