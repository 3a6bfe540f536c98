"""Reads of the usage ledger: sums of booked and used GE-hours grouped as a report asks."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time

from django.contrib.auth import get_user_model
from django.db.models import DateField, QuerySet, Sum
from django.db.models.functions import TruncDay, TruncMonth, TruncWeek

from accounting.models import LedgerDay, LedgerEntry
from inventory.models import GpuPool
from teams.models import Team
from teams.selectors import team_ids_of

DIMENSIONS = ("team", "pool", "model", "user", "mode")
PERIODS = ("day", "week", "month")
# The figures of every report row, in this order (the CSV's columns after the groups).
FIGURES = ("booked_ge_hours", "used_ge_hours", "idle_ge_hours", "no_data_ge_hours", "gpu_hours", "efficiency",
           "measured_efficiency")
# Each grouping's column in the ledger's tables.
COLUMNS = {"team": "team_id", "pool": "pool_id", "model": "gpu_model", "user": "user_id", "mode": "mode"}
TRUNC = {"day": TruncDay, "week": TruncWeek, "month": TruncMonth}
DECIMALS = 4


@dataclass(frozen=True)
class UsageQuery:
    start: datetime  # whole hours, UTC
    end: datetime
    group_by: tuple[str, ...]  # DIMENSIONS and at most one of PERIODS
    team_ids: frozenset[int] | None  # None: every team


def _whole_days(query: UsageQuery) -> bool:
    return query.start.timetz() == time(0, tzinfo=UTC) and query.end.timetz() == time(0, tzinfo=UTC)


def _sums(query: UsageQuery) -> QuerySet | list[tuple]:
    """The report's sums, one row per group, from the day summary when the window is whole UTC days
    (a year is a few million rows at most) and from the hourly entries otherwise."""
    if _whole_days(query):
        rows = LedgerDay.objects.filter(day__gte=query.start.date(), day__lt=query.end.date())
        when = "day"
    else:
        rows = LedgerEntry.objects.filter(hour__gte=query.start, hour__lt=query.end)
        when = "hour"
    if query.team_ids is not None:
        rows = rows.filter(team_id__in=query.team_ids)
    groups = {}
    for name in query.group_by:
        if name in PERIODS:
            groups[name] = TRUNC[name](when, output_field=DateField(), tzinfo=UTC if when == "hour" else None)
        else:
            groups[name] = COLUMNS[name]
    keys = []
    for name, column in groups.items():
        if isinstance(column, str):
            keys.append(column)
        else:
            rows = rows.annotate(**{f"g_{name}": column})
            keys.append(f"g_{name}")
    if not keys:  # the totals: one row, even over no entries
        totals = rows.aggregate(b=Sum("booked_ge_hours"), u=Sum("used_ge_hours"), n=Sum("no_data_ge_hours"),
                                g=Sum("gpu_hours"))
        return [(totals["b"], totals["u"], totals["n"], totals["g"])]
    return (rows.order_by().values(*keys)
            .annotate(b=Sum("booked_ge_hours"), u=Sum("used_ge_hours"), n=Sum("no_data_ge_hours"),
                      g=Sum("gpu_hours"))
            .values_list(*keys, "b", "u", "n", "g").order_by(*keys).iterator(chunk_size=2000))


def _figures(booked: float, used: float, no_data: float, gpu_hours: float) -> list[float | None]:
    measured = booked - no_data
    return [round(booked, DECIMALS), round(used, DECIMALS), round(max(0.0, booked - used - no_data), DECIMALS),
            round(no_data, DECIMALS), round(gpu_hours, DECIMALS),
            round(used / booked, DECIMALS) if booked > 0 else None,
            round(used / measured, DECIMALS) if measured > 1e-9 else None]


def usage_header(query: UsageQuery) -> list[str]:
    return [*query.group_by, *FIGURES]


NAMED = {"team": (Team, "slug"), "pool": (GpuPool, "slug"), "user": (None, "username")}


def usage_rows(query: UsageQuery) -> Iterator[list]:
    """The report's rows (the groups' values, then FIGURES), ordered by the groups (teams, pools and users by
    id; named by slug or username once the database summed), periods as the ISO date they start on.
    Read in chunks (a server-side cursor on PostgreSQL), so a long report streams."""
    width = len(query.group_by)
    names: dict[str, dict] = {name: {} for name in NAMED if name in query.group_by}
    chunk: list[tuple] = []

    def flush() -> Iterator[list]:
        for name, known in names.items():
            at = query.group_by.index(name)
            ids = {row[at] for row in chunk if row[at] is not None} - set(known)
            if ids:
                model, field = NAMED[name]
                known.update((model or get_user_model()).objects.filter(pk__in=ids).values_list("pk", field))
        for row in chunk:
            out = []
            for name, value in zip(query.group_by, row[:width]):
                if name in names:
                    out.append(names[name].get(value))
                elif isinstance(value, (date, datetime)):
                    out.append(value.isoformat())
                else:
                    out.append(value)
            yield out + _figures(*(v or 0.0 for v in row[width:]))
        chunk.clear()

    for row in _sums(query):
        chunk.append(row)
        if len(chunk) >= 2000:
            yield from flush()
    if chunk:
        yield from flush()


def usage_totals(query: UsageQuery) -> dict[str, float | None]:
    [row] = _sums(UsageQuery(query.start, query.end, (), query.team_ids))
    return dict(zip(FIGURES, _figures(*(v or 0.0 for v in row))))


def visible_team_ids(user) -> frozenset[int] | None:
    """The teams whose use the user may read: staff every team (None), members their teams, narrowed to
    a team-limited API token's (which acts as a plain member of them, never as staff: teams/tokens.py)."""
    if user.is_staff:
        return None
    return frozenset(team_ids_of(user))

