"""Reads of the usage ledger: sums of booked and used GE-hours grouped as a report asks."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import DateField, IntegerField, QuerySet, Sum, Value
from django.db.models.functions import Cast, TruncDay, TruncMonth, TruncWeek

from accounting import pricing
from accounting.models import LedgerDay, LedgerEntry, LedgerMonth, Statement
from inventory.models import GpuPool
from teams.models import Team
from teams.selectors import team_ids_of

DIMENSIONS = ("team", "pool", "model", "user", "mode")
PERIODS = ("day", "week", "month")
# The figures of every report row, in this order (the CSV's columns after the groups).
FIGURES = ("booked_ge_hours", "used_ge_hours", "idle_ge_hours", "no_data_ge_hours", "gpu_hours", "efficiency",
           "measured_efficiency", "cost", "currency")
# Each grouping's column in the ledger's tables.
COLUMNS = {"team": "team_id", "pool": "pool_id", "model": "gpu_model", "user": "user_id", "mode": "mode"}
TRUNC = {"day": TruncDay, "week": TruncWeek, "month": TruncMonth}
DECIMALS = 4
# PostgreSQL's work_mem for a report's UNION query (see _union_sums).
REPORT_WORK_MEM = "32MB"


@dataclass(frozen=True)
class UsageQuery:
    start: datetime  # whole hours, UTC
    end: datetime
    group_by: tuple[str, ...]  # DIMENSIONS and at most one of PERIODS
    team_ids: frozenset[int] | None  # None: every team
    named: bool = True  # teams, pools and users by slug/username; False: by id (statements keep ids)
    pool_ids: frozenset[int] | None = None  # None: every pool
    gpu_models: frozenset[str] | None = None  # None: every model


def _day_ceil(value: datetime) -> datetime:
    floor = value.replace(hour=0, minute=0, second=0, microsecond=0)
    return floor if floor == value else floor + timedelta(days=1)


def _month_floor(value: datetime) -> datetime:
    return value.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def _month_ceil(value: datetime) -> datetime:
    floor = _month_floor(value)
    return floor if floor == value else _month_floor(floor + timedelta(days=32))


def segments(query: UsageQuery, cuts: frozenset = frozenset()) -> list[tuple[type, str, datetime, datetime]]:
    """[start, end) cut into (table, its time column, from, to): whole months from the month sums (unless
    grouped by day or week, which a month's sums cannot split, or a month a day of `cuts` falls inside),
    whole days from the day sums, the hours at the edges from the entries; then cut again at each day of
    `cuts` (where prices change: inside a segment, every model's price in every pool is then one)."""
    start, end = query.start, query.end
    split = {day.replace(day=1) for day in cuts if day.day != 1}
    d0, d1 = _day_ceil(start), end.replace(hour=0)
    if d0 >= d1:
        out = [(LedgerEntry, "hour", start, end)]
    else:
        out = [(LedgerEntry, "hour", start, d0)] if start < d0 else []
        m0, m1 = _month_ceil(d0), _month_floor(d1)
        if m0 < m1 and not {"day", "week"} & set(query.group_by):
            out += [(LedgerDay, "day", d0, m0)] if d0 < m0 else []
            month = m0
            while month < m1:  # runs of whole months, each from the month sums, or from the days where split
                following = _month_floor(month + timedelta(days=32))
                table, column = (LedgerDay, "day") if month.date() in split else (LedgerMonth, "month")
                if out and out[-1][0] is table and out[-1][3] == month:
                    out[-1] = (table, column, out[-1][2], following)
                else:
                    out.append((table, column, month, following))
                month = following
            out += [(LedgerDay, "day", m1, d1)] if m1 < d1 else []
        else:
            out.append((LedgerDay, "day", d0, d1))
        out += [(LedgerEntry, "hour", d1, end)] if d1 < end else []
    marks = sorted(datetime(day.year, day.month, day.day, tzinfo=UTC) for day in cuts)
    cut = []
    for table, column, lo, hi in out:
        for mark in (m for m in marks if lo < m < hi):
            cut.append((table, column, lo, mark))
            lo = mark
        cut.append((table, column, lo, hi))
    return cut


def _segment_sums(query: UsageQuery, keys: list[str], table: type, when: str, lo: datetime,
                  hi: datetime) -> QuerySet:
    """One segment's rows, grouped by `keys` (group columns, period names g_day/g_week/g_month included)."""
    rows = _segment_rows(query, table, when, lo, hi)
    for name in query.group_by:
        if name in PERIODS:
            # Cast: PostgreSQL's DATE_TRUNC of a date is a timestamp, which the UNION query would read raw.
            rows = rows.annotate(**{f"g_{name}": Cast(TRUNC[name](when, output_field=DateField(),
                                                                  tzinfo=UTC if when == "hour" else None),
                                                      DateField())})
    return (rows.order_by().values(*keys)
            .annotate(b=Sum("booked_ge_hours"), u=Sum("used_ge_hours"), n=Sum("no_data_ge_hours"),
                      g=Sum("gpu_hours")))


def _segment_rows(query: UsageQuery, table: type, when: str, lo: datetime, hi: datetime) -> QuerySet:
    """One segment's rows of its table, narrowed to the query's teams, pool and model."""
    if when == "hour":
        rows = table.objects.filter(hour__gte=lo, hour__lt=hi)
    else:
        rows = table.objects.filter(**{f"{when}__gte": lo.date(), f"{when}__lt": hi.date()})
    if query.team_ids is not None:
        rows = rows.filter(team_id__in=query.team_ids)
    if query.pool_ids is not None:
        rows = rows.filter(pool_id__in=query.pool_ids)
    if query.gpu_models is not None:
        rows = rows.filter(gpu_model__in=query.gpu_models)
    return rows


def _sums(query: UsageQuery) -> tuple[list[str], Iterator[tuple]]:
    """The currencies prices are set in, and the report's sums, one row per group, in the groups' order:
    its group values, then booked, used, no data, GPU-hours, then its cost in each of those currencies.

    The database sums each segment (segments()) per group, and where prices are set also per GPU model,
    pool and segment: segments are cut where a price changes, so within one each model's price in each
    pool is one, and the cost is those few sums x their price (accounting.pricing), added up here per
    group. Several segments are read by one UNION ALL query, ordered by the groups."""
    periods = pricing.price_periods()
    currencies = sorted({p.currency for p in periods})
    cuts = segments(query, pricing.boundaries(periods) if periods else frozenset())
    keys = [f"g_{name}" if name in PERIODS else COLUMNS[name] for name in query.group_by]
    extra = [column for column in ("gpu_model", "pool_id") if periods and column not in keys]
    parts = [_segment_sums(query, keys + extra, *segment).annotate(seg=Value(i, output_field=IntegerField()))
             for i, segment in enumerate(cuts)] if keys or extra else []
    columns = keys + extra + (["seg"] if periods else [])
    if not columns:  # the totals, unpriced: one row, even over no entries
        totals = [part.aggregate(b=Sum("booked_ge_hours"), u=Sum("used_ge_hours"), n=Sum("no_data_ge_hours"),
                                 g=Sum("gpu_hours")) for part in (_segment_rows(query, *segment) for segment in cuts)]
        return currencies, iter([tuple(sum(t[k] or 0.0 for t in totals) for k in "bung")])
    if len(parts) == 1:
        rows = parts[0].values_list(*columns, "b", "u", "n", "g").order_by(*keys).iterator(chunk_size=2000)
    else:
        rows = _union_sums(parts, columns, keys)
    if not periods and keys:
        return currencies, rows
    return currencies, _priced(rows, keys, columns, [segment[2] for segment in cuts], periods, currencies)


def _priced(rows, keys: list[str], columns: list[str], starts: list[datetime], periods: list,
            currencies: list[str]) -> Iterator[tuple]:
    """Fold rows of (groups, model, pool, segment, sums) into one row per group, each with its cost per currency
    (None where nothing of it is priced in that currency). With no groups: one row, even over no rows."""
    width = len(keys)
    if periods:
        model_at, pool_at, seg_at = columns.index("gpu_model"), columns.index("pool_id"), columns.index("seg")
    prices: dict[tuple, pricing.Period | None] = {}
    current, sums, costs = None, [0.0] * 4, {}
    for row in rows:
        group = tuple(row[:width])
        if group != current and current is not None:
            yield current + tuple(sums) + tuple(costs.get(c) for c in currencies)
            sums, costs = [0.0] * 4, {}
        current = group
        figures = row[len(columns):]
        for i, value in enumerate(figures):
            sums[i] += value or 0.0
        if periods:
            key = (row[model_at], row[pool_at], row[seg_at])
            if key not in prices:
                prices[key] = pricing.price_at(periods, key[0], key[1], starts[key[2]].date())
            if (period := prices[key]) is not None:
                costs[period.currency] = costs.get(period.currency, 0.0) + (figures[0] or 0.0) * float(period.price)
    if current is not None or not keys:
        yield (current or ()) + tuple(sums) + tuple(costs.get(c) for c in currencies)


def _union_sums(parts: list[QuerySet], columns: list[str], keys: list[str]) -> Iterator[tuple]:
    quote = connection.ops.quote_name
    sqls, params = [], []
    for part in parts:
        sql, more = part.values_list(*columns, "b", "u", "n", "g").query.sql_with_params()
        sqls.append(f"SELECT * FROM ({sql}) AS s{len(sqls)}")
        params.extend(more)
    grouped = ", ".join(quote(column) for column in columns)
    ordered = ", ".join(quote(key) for key in keys) or grouped
    sql = (f"SELECT {grouped}, SUM(b), SUM(u), SUM(n), SUM(g) FROM ({' UNION ALL '.join(sqls)}) AS parts "
           f"GROUP BY {grouped} ORDER BY {ordered}")
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # Priced reports group by model, pool and piece too: PostgreSQL then guesses (far too many) groups,
            # finds no room for a hash table in the default 4 MB and sorts 100,000s of day rows by their model's
            # name instead (a year by team and month: 630 ms, 390 ms hashed). For this query only.
            cursor.execute(f"SET LOCAL work_mem = '{REPORT_WORK_MEM}'")
        cursor.execute(sql, params)
        while batch := cursor.fetchmany(2000):
            yield from batch


def _figures(currencies: list[str], sums: tuple) -> list:
    booked, used, no_data, gpu_hours = (v or 0.0 for v in sums[:4])
    measured = booked - no_data
    cost, currency = pricing.cost_and_currency(dict(zip(currencies, sums[4:])))
    return [round(booked, DECIMALS), round(used, DECIMALS), round(max(0.0, booked - used - no_data), DECIMALS),
            round(no_data, DECIMALS), round(gpu_hours, DECIMALS),
            round(used / booked, DECIMALS) if booked > 0 else None,
            round(used / measured, DECIMALS) if measured > 1e-9 else None, cost, currency]


def usage_header(query: UsageQuery) -> list[str]:
    return [*query.group_by, *FIGURES]


NAMED = {"team": (Team, "slug"), "pool": (GpuPool, "slug"), "user": (None, "username")}


def usage_rows(query: UsageQuery) -> Iterator[list]:
    """The report's rows (the groups' values, then FIGURES), ordered by the groups (teams, pools and users by
    id; named by slug or username once the database summed), periods as the ISO date they start on.
    Read in chunks (a server-side cursor on PostgreSQL), so a long report streams."""
    width = len(query.group_by)
    names: dict[str, dict] = {name: {} for name in NAMED if name in query.group_by and query.named}
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
                elif isinstance(value, datetime):  # a period the union query read raw: DATE_TRUNC of a date
                    out.append(value.astimezone(UTC).date().isoformat())  # is a timestamp, at midnight UTC
                elif isinstance(value, date):
                    out.append(value.isoformat())
                else:
                    out.append(value)
            yield out + _figures(currencies, row[width:])
        chunk.clear()

    currencies, sums = _sums(query)
    for row in sums:
        chunk.append(row)
        if len(chunk) >= 2000:
            yield from flush()
    if chunk:
        yield from flush()


def usage_totals(query: UsageQuery) -> dict[str, float | None]:
    currencies, [row] = _sums(dataclasses.replace(query, group_by=()))
    return dict(zip(FIGURES, _figures(currencies, row)))


def visible_team_ids(user) -> frozenset[int] | None:
    """The teams whose use the user may read: staff every team (None), members their teams, narrowed to
    a team-limited API token's (which acts as a plain member of them, never as staff: teams/tokens.py)."""
    if user.is_staff:
        return None
    return frozenset(team_ids_of(user))



# --- monthly statements ------------------------------------------------------------------

STATEMENT_FIGURES = ("booked_ge_hours", "used_ge_hours", "idle_ge_hours", "gpu_hours", "cost", "currency")


@dataclass(frozen=True)
class TeamStatement:
    team: Team
    month: date  # its first day
    closed_at: datetime | None  # None: provisional, computed from the ledger as it stands
    lines: list[dict]  # pool, pool_name, gpu_model, mode, then STATEMENT_FIGURES
    totals: dict

    @property
    def status(self) -> str:
        return "provisional" if self.closed_at is None else "closed"


def _line(pool: str, pool_name: str, gpu_model: str, mode: str, booked: float, used: float, gpu_hours: float,
          cost, currency: str) -> dict:
    return {"pool": pool, "pool_name": pool_name, "gpu_model": gpu_model, "mode": mode,
            "booked_ge_hours": round(booked, DECIMALS), "used_ge_hours": round(used, DECIMALS),
            "idle_ge_hours": round(booked - used, DECIMALS), "gpu_hours": round(gpu_hours, DECIMALS),
            "cost": None if cost is None else round(float(cost), 2), "currency": currency}


def _statement_totals(lines: list[dict]) -> dict:
    currencies = sorted({c for line in lines for c in line["currency"].split(",") if c})
    totals = {name: round(sum(line[name] for line in lines), DECIMALS) for name in STATEMENT_FIGURES[:4]}
    if len(currencies) == 1:
        totals.update(cost=round(sum(line["cost"] or 0.0 for line in lines), 2), currency=currencies[0])
    else:  # none priced, or several currencies: not added up
        totals.update(cost=None, currency=",".join(currencies))
    return totals


def team_statement(team: Team, month: date) -> TeamStatement:
    """The team's statement of `month`: the frozen one once the month is closed, else computed from the ledger
    now (provisional), per pool, GPU model and sharing mode. Idle here is booked - used."""
    month = month.replace(day=1)
    frozen = Statement.objects.filter(team=team, month=month).first()
    pools = dict(GpuPool.objects.values_list("pk", "name"))
    if frozen is not None:
        lines = [_line(slug, pools.get(pool_id, slug), model, mode, b, u, g, cost, currency)
                 for pool_id, slug, model, mode, b, u, g, cost, currency in frozen.lines.order_by(
                     "pool__slug", "gpu_model", "mode").values_list(
                     "pool_id", "pool__slug", "gpu_model", "mode", "booked_ge_hours", "used_ge_hours", "gpu_hours",
                     "cost", "currency")]
        return TeamStatement(team, month, frozen.closed_at, lines, _statement_totals(lines))
    start = datetime(month.year, month.month, 1, tzinfo=UTC)
    query = UsageQuery(start, _month_floor(start + timedelta(days=32)), ("pool", "model", "mode"),
                       frozenset([team.pk]), named=False)
    slugs = dict(GpuPool.objects.values_list("pk", "slug"))
    lines = []
    for pool_id, model, mode, *rest in usage_rows(query):
        f = dict(zip(FIGURES, rest))
        lines.append(_line(slugs[pool_id], pools[pool_id], model, mode, f["booked_ge_hours"], f["used_ge_hours"],
                           f["gpu_hours"], f["cost"], f["currency"]))
    lines.sort(key=lambda line: (line["pool"], line["gpu_model"], line["mode"]))
    return TeamStatement(team, month, None, lines, _statement_totals(lines))
