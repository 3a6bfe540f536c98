"""The Reports page's figures (accounting.views.reports draws them; each chart's CSV writes the same table).

Every chart is a table: a header and rows, read from the usage ledger through accounting.selectors over
whole months [start, end), narrowed to the teams the viewer may see and, optionally, a pool and a GPU
model. Charts by team show the TOP_TEAMS teams that booked most and sum the rest into one row,
"(others)" (a bar per team of a thousand is unreadable); top holders show the TOP_USERS users."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from django.utils import timezone
from django.utils.translation import gettext as _

from accounting.models import LedgerMonth
from accounting.selectors import FIGURES, UsageQuery, usage_rows
from allocations.models import Quota

TOP_TEAMS = 12
TOP_USERS = 10
CHARTS = ("ge_hours_by_team", "efficiency", "idle", "top_holders", "quota")


@dataclass(frozen=True)
class ReportFilter:
    start: date  # first day of the first month
    end: date  # first day of the month after the last
    team_ids: frozenset[int] | None
    pool_id: int | None = None
    gpu_model: str | None = None


@dataclass(frozen=True)
class Table:
    header: list[str]
    rows: list[list]


def _query(f: ReportFilter, group_by: tuple[str, ...], start: date | None = None, end: date | None = None) -> UsageQuery:
    start, end = start or f.start, end or f.end
    return UsageQuery(datetime(start.year, start.month, 1, tzinfo=UTC), datetime(end.year, end.month, 1, tzinfo=UTC),
                      group_by, f.team_ids, pool_ids=None if f.pool_id is None else frozenset([f.pool_id]),
                      gpu_models=None if f.gpu_model is None else frozenset([f.gpu_model]))


def _figures(rows, width: int) -> list[tuple[list, dict]]:
    return [(row[:width], dict(zip(FIGURES, row[width:]))) for row in rows]


def _by_team(f: ReportFilter) -> list[tuple[str, dict]]:
    """(team, figures) over the period, most booked first, beyond TOP_TEAMS summed into '(others)'."""
    teams = sorted(((keys[0], figs) for keys, figs in _figures(usage_rows(_query(f, ("team",))), 1)),
                   key=lambda item: (-item[1]["booked_ge_hours"], item[0]))
    if len(teams) <= TOP_TEAMS:
        return teams
    rest = teams[TOP_TEAMS:]
    others = {name: sum(figs[name] for _, figs in rest) for name in
              ("booked_ge_hours", "used_ge_hours", "idle_ge_hours", "no_data_ge_hours")}
    return teams[:TOP_TEAMS] + [(_("(others)"), others)]


def _ratio(used: float, booked: float) -> float | None:
    return round(used / booked, 4) if booked > 0 else None


def ge_hours_by_team(f: ReportFilter) -> Table:
    """Booked GE-hours per month and team (the stacked bars), the top teams of the period and '(others)'."""
    top = {team for team, _ in _by_team(f)[:TOP_TEAMS]}
    sums: dict[tuple[str, str], float] = {}
    for (team, month), figs in _figures(usage_rows(_query(f, ("team", "month"))), 2):
        key = (month[:7], team if team in top else _("(others)"))
        sums[key] = sums.get(key, 0.0) + figs["booked_ge_hours"]
    return Table(["month", "team", "booked_ge_hours"],
                 [[month, team, round(value, 4)] for (month, team), value in sorted(sums.items())])


def efficiency(f: ReportFilter) -> Table:
    return Table(["team", "booked_ge_hours", "used_ge_hours", "efficiency"],
                 [[team, round(figs["booked_ge_hours"], 4), round(figs["used_ge_hours"], 4),
                   _ratio(figs["used_ge_hours"], figs["booked_ge_hours"])] for team, figs in _by_team(f)])


def idle(f: ReportFilter) -> Table:
    """Held but idle: booked GE-hours whose telemetry says idle, beside those no telemetry covers."""
    return Table(["team", "idle_ge_hours", "no_data_ge_hours"],
                 [[team, round(figs["idle_ge_hours"], 4), round(figs["no_data_ge_hours"], 4)]
                  for team, figs in _by_team(f)])


def top_holders(f: ReportFilter) -> Table:
    users = sorted(((keys[0] or _("(deleted user)"), figs) for keys, figs in _figures(
        usage_rows(_query(f, ("user",))), 1)), key=lambda item: (-item[1]["booked_ge_hours"], item[0]))
    return Table(["user", "booked_ge_hours", "used_ge_hours", "efficiency"],
                 [[user, figs["booked_ge_hours"], figs["used_ge_hours"], figs["efficiency"]]
                  for user, figs in users[:TOP_USERS]])


def quota_use(f: ReportFilter, now: datetime | None = None) -> Table:
    """This month's booked GE-hours per team and pool (closed hours of the ledger) against the quota's monthly
    GE-hour budget, for the quotas that set one (whatever the period: a budget is per calendar month)."""
    now = (now or timezone.now()).astimezone(UTC)
    month = now.date().replace(day=1)
    quotas = Quota.objects.filter(ge_hours_per_month__isnull=False).select_related("team", "pool").order_by(
        "team__slug", "pool__slug")
    if f.team_ids is not None:
        quotas = quotas.filter(team_id__in=f.team_ids)
    if f.pool_id is not None:
        quotas = quotas.filter(pool_id=f.pool_id)
    current = dataclasses.replace(f, gpu_model=None)  # a budget counts every model of the pool
    used = {(team, pool): figs["booked_ge_hours"] for (team, pool), figs in _figures(usage_rows(
        _query(current, ("team", "pool"), month, (month + timedelta(days=32)).replace(day=1))), 2)}
    return Table(["team", "pool", "month", "booked_ge_hours", "ge_hours_per_month"],
                 [[q.team.slug, q.pool.slug, f"{month:%Y-%m}", used.get((q.team.slug, q.pool.slug), 0.0),
                   float(q.ge_hours_per_month)] for q in quotas])


BUILDERS = {"ge_hours_by_team": ge_hours_by_team, "efficiency": efficiency, "idle": idle,
            "top_holders": top_holders, "quota": quota_use}


def chart_table(name: str, f: ReportFilter) -> Table:
    return BUILDERS[name](f)


def gpu_models_seen(team_ids: frozenset[int] | None) -> list[str]:
    """The GPU models the ledger holds (for the filter), those of the viewer's teams."""
    rows = LedgerMonth.objects.all()
    if team_ids is not None:
        rows = rows.filter(team_id__in=team_ids)
    return list(rows.order_by("gpu_model").values_list("gpu_model", flat=True).distinct())
