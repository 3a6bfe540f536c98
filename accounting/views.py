"""Pages: a team's monthly statement (printable, and as CSV) and the Reports page (Plotly charts, each
chart's figures as CSV). Thin: the figures are accounting.selectors' and accounting.reports'."""
from __future__ import annotations

import csv
from datetime import UTC, date

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.utils.translation import gettext as _

from accounting import reports, selectors
from accounting.api.views import parse_month
from common.errors import ValidationFailed
from inventory.models import GpuPool
from teams.models import Team
from teams.selectors import teams_of

STATEMENT_COLUMNS = ("pool", "gpu_model", "mode", *selectors.STATEMENT_FIGURES)


def _month_or_404(raw: str) -> date:
    try:
        return parse_month(raw)
    except ValidationFailed:
        raise Http404(_("No such month: give it as YYYY-MM.")) from None


def _shift(month: date, months: int) -> date:
    index = month.year * 12 + month.month - 1 + months
    return date(index // 12, index % 12 + 1, 1)


def _csv_response(filename: str, header, rows) -> HttpResponse:
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    writer = csv.writer(response)
    writer.writerow(header)
    writer.writerows([["" if value is None else value for value in row] for row in rows])
    return response


@login_required
def statement(request: HttpRequest, slug: str, month: str) -> HttpResponse:
    """A team's statement of a month (members and staff; anyone else: 404, as the team page)."""
    team = get_object_or_404(teams_of(request.user), slug=slug)
    first = _month_or_404(month)
    found = selectors.team_statement(team, first)
    if request.GET.get("format") == "csv":
        rows = [[line[name] for name in STATEMENT_COLUMNS] for line in found.lines]
        rows.append([_("total"), "", "", *[found.totals[name] for name in selectors.STATEMENT_FIGURES]])
        return _csv_response(f"statement-{team.slug}-{first:%Y-%m}.csv", STATEMENT_COLUMNS, rows)
    this_month = timezone.now().astimezone(UTC).date().replace(day=1)
    return render(request, "accounting/statement.html", {
        "team": team, "statement": found, "month": first,
        "previous": f"{_shift(first, -1):%Y-%m}",
        "next": f"{_shift(first, 1):%Y-%m}" if first < this_month else None,
    })


def _report_filter(request: HttpRequest) -> tuple[reports.ReportFilter, dict]:
    """The Reports page's filters from the query string (bad or missing values fall back to the defaults:
    the last six months to this one, every pool and model)."""
    this_month = timezone.now().astimezone(UTC).date().replace(day=1)

    def month(name: str, default: date) -> date:
        try:
            return parse_month(request.GET.get(name, ""))
        except ValidationFailed:
            return default

    start, last = month("start", _shift(this_month, -5)), month("end", this_month)
    if last < start:
        start, last = last, start
    if (last.year - start.year) * 12 + last.month - start.month >= 36:  # the API's longest window
        start = _shift(last, -35)
    pool = GpuPool.objects.filter(slug=request.GET.get("pool", "")).first()
    team_ids = selectors.visible_team_ids(request.user)
    models = reports.gpu_models_seen(team_ids)
    model = request.GET.get("model") if request.GET.get("model") in models else None
    chosen = {"start": f"{start:%Y-%m}", "end": f"{last:%Y-%m}", "pool": pool.slug if pool else "",
              "model": model or ""}
    return reports.ReportFilter(start, _shift(last, 1), team_ids, pool.pk if pool else None, model), {
        "chosen": chosen, "models": models}


@login_required
def reports_page(request: HttpRequest) -> HttpResponse:
    """GPU use over months for the teams the viewer may see: staff every team, a member their teams."""
    report_filter, form = _report_filter(request)
    tables = {name: reports.chart_table(name, report_filter) for name in reports.CHARTS}
    team_ids = report_filter.team_ids
    teams = Team.objects.order_by("slug") if team_ids is None else Team.objects.filter(pk__in=team_ids).order_by("slug")
    query = request.GET.urlencode()
    return render(request, "accounting/reports.html", {
        **form, "pools": GpuPool.objects.order_by("slug").values_list("slug", "name"),
        "tables": {name: {"header": t.header, "rows": t.rows} for name, t in tables.items()},
        "query": query, "statement_teams": teams[:50], "statement_month": f"{_shift(report_filter.end, -1):%Y-%m}",
        "words": _chart_words(),
    })


@login_required
def report_csv(request: HttpRequest, chart: str) -> HttpResponse:
    if chart not in reports.CHARTS:
        raise Http404(_("No such chart."))
    report_filter, form = _report_filter(request)
    table = reports.chart_table(chart, report_filter)
    chosen = form["chosen"]
    return _csv_response(f"{chart}-{chosen['start']}-{chosen['end']}.csv", table.header, table.rows)


def _chart_words() -> dict[str, str]:
    """What static/js/reports.js writes on the charts, in the viewer's language (it has no catalogue)."""
    return {
        "ge_hours": _("GE-hours"), "booked": _("booked"), "used": _("used"), "efficiency": _("efficiency"),
        "idle": _("idle (telemetry says idle)"), "no_data": _("no telemetry"), "month": _("month"),
        "budget": _("monthly budget"), "booked_this_month": _("booked this month"),
        "nothing": _("Nothing to show for these filters."),
    }
