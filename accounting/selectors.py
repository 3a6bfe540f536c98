"""Reads of the usage ledger: sums of booked and used GE-hours grouped as a report asks."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import DateField, QuerySet, Sum
from django.db.models.functions import TruncDay, TruncMonth, TruncWeek

from accounting.models import LedgerDay, LedgerEntry, LedgerMonth
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


def _day_ceil(value: datetime) -> datetime:
    floor = value.replace(hour=0, minute=0, second=0, microsecond=0)
    return floor if floor == value else floor + timedelta(days=1)


def _month_floor(value: datetime) -> datetime:
    return value.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def _month_ceil(value: datetime) -> datetime:
    floor = _month_floor(value)
    return floor if floor == value else _month_floor(floor + timedelta(days=32))


def segments(query: UsageQuery) -> list[tuple[type, str, datetime, datetime]]:
    """[start, end) cut into (table, its time column, from, to): whole months from the month sums (unless
    grouped by day or week, which a month's sums cannot split), whole days from the day sums, the hours
    at the edges from the entries."""
    start, end = query.start, query.end
    d0, d1 = _day_ceil(start), end.replace(hour=0)
    if d0 >= d1:
        return [(LedgerEntry, "hour", start, end)]
    out = [(LedgerEntry, "hour", start, d0)] if start < d0 else []
    m0, m1 = _month_ceil(d0), _month_floor(d1)
    if m0 < m1 and not {"day", "week"} & set(query.group_by):
        out += [(LedgerDay, "day", d0, m0)] if d0 < m0 else []
        out.append((LedgerMonth, "month", m0, m1))
        out += [(LedgerDay, "day", m1, d1)] if m1 < d1 else []
    else:
        out.append((LedgerDay, "day", d0, d1))
    out += [(LedgerEntry, "hour", d1, end)] if d1 < end else []
    return out


def _segment_sums(query: UsageQuery, model: type, when: str, lo: datetime, hi: datetime) -> tuple[QuerySet, list]:
    """One segment's sums per group, and the names of its group columns (no groups: its rows, unsummed)."""
    if when == "hour":
        rows = model.objects.filter(hour__gte=lo, hour__lt=hi)
    else:
        rows = model.objects.filter(**{f"{when}__gte": lo.date(), f"{when}__lt": hi.date()})
    if query.team_ids is not None:
        rows = rows.filter(team_id__in=query.team_ids)
    keys = []
    for name in query.group_by:
        if name in PERIODS:
            rows = rows.annotate(**{f"g_{name}": TRUNC[name](when, output_field=DateField(),
                                                             tzinfo=UTC if when == "hour" else None)})
            keys.append(f"g_{name}")
        else:
            keys.append(COLUMNS[name])
    if not keys:
        return rows, keys
    return (rows.order_by().values(*keys)
            .annotate(b=Sum("booked_ge_hours"), u=Sum("used_ge_hours"), n=Sum("no_data_ge_hours"),
                      g=Sum("gpu_hours"))), keys


def _sums(query: UsageQuery) -> Iterator[tuple] | list[tuple]:
    """The report's sums, one row per group (its group values, then booked, used, no data, GPU-hours), summed
    by the database: one segment's query, or several segments' sums added up by one UNION ALL query."""
    parts = [_segment_sums(query, *segment) for segment in segments(query)]
    keys = parts[0][1]
    if not keys:  # the totals: one row, even over no entries
        totals = [part.aggregate(b=Sum("booked_ge_hours"), u=Sum("used_ge_hours"), n=Sum("no_data_ge_hours"),
                                 g=Sum("gpu_hours")) for part, _ in parts]
        return [tuple(sum(t[k] or 0.0 for t in totals) for k in "bung")]
    if len(parts) == 1:
        return parts[0][0].values_list(*keys, "b", "u", "n", "g").order_by(*keys).iterator(chunk_size=2000)
    return _union_sums(parts, keys)


def _union_sums(parts: list[tuple[QuerySet, list]], keys: list[str]) -> Iterator[tuple]:
    quote = connection.ops.quote_name
    sqls, params = [], []
    for part, _ in parts:
        sql, more = part.values_list(*keys, "b", "u", "n", "g").query.sql_with_params()
        sqls.append(f"SELECT * FROM ({sql}) AS s{len(sqls)}")
        params.extend(more)
    columns = ", ".join(quote(key) for key in keys)
    sql = (f"SELECT {columns}, SUM(b), SUM(u), SUM(n), SUM(g) FROM ({' UNION ALL '.join(sqls)}) AS parts "
           f"GROUP BY {columns} ORDER BY {columns}")
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        while batch := cursor.fetchmany(2000):
            yield from batch


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

