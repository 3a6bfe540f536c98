"""GET /api/v1/usage/ (sums of the usage ledger, grouped, JSON or streamed CSV), the prices, the statements."""
from __future__ import annotations

import csv
import re
from datetime import UTC, date, datetime, timedelta

from django.http import StreamingHttpResponse
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from django.utils.translation import gettext as _
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework import viewsets
from rest_framework.views import APIView

from accounting import selectors, services
from accounting.api.serializers import PriceSerializer, StatementSerializer, UsageReportSerializer
from accounting.models import Price
from common.api import IsStaffOrReadOnly, RefusesUnknownQueryParameters
from common.errors import FieldError, NotFound, ValidationFailed
from teams.selectors import teams_of

# The longest window a report may cover.
MAX_DAYS = 3 * 366
FORMATS = ("json", "csv")
_SPACED_OFFSET = re.compile(r" (\d\d(:?\d\d)?)$")


class _NoFormatOverride:
    URL_FORMAT_OVERRIDE = None


class AcceptHeaderNegotiation(DefaultContentNegotiation):
    """`format` is this view's own parameter (json or csv), not DRF's renderer override."""

    settings = _NoFormatOverride


def _month_start(value: datetime) -> datetime:
    return value.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def _instant(name: str, raw: str, errors: list[FieldError]) -> datetime | None:
    # A '+' left unencoded in a query string arrives as a space: "…T00:00 00:00" meant "+00:00".
    text = _SPACED_OFFSET.sub(r"+\1", raw.strip())
    try:
        value = parse_datetime(text)
        if value is None and (day := parse_date(text)) is not None:
            value = datetime(day.year, day.month, day.day)
        if value is not None:
            value = (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)
    except (ValueError, OverflowError):
        value = None
    if value is None:
        errors.append(FieldError(name, "invalid", _(
            "Enter a date (YYYY-MM-DD) or an ISO 8601 instant on the hour, e.g. 2026-01-01T00:00+00:00.")))
        return None
    if value.minute or value.second or value.microsecond:
        errors.append(FieldError(name, "whole_hour", _(
            "Give a whole hour (minutes and seconds zero): the ledger counts clock hours.")))
        return None
    return value


def usage_query(request: Request) -> tuple[selectors.UsageQuery, str]:
    """The report the query string asks for, and its format; every fault a 400 naming field and rule."""
    params = request.query_params
    errors: list[FieldError] = []
    now = timezone.now()
    default_start = _month_start(now)
    default_end = _month_start(default_start + timedelta(days=32))
    start = _instant("start", params["start"], errors) if "start" in params else default_start
    end = _instant("end", params["end"], errors) if "end" in params else default_end
    if start is not None and end is not None:
        if end <= start:
            errors.append(FieldError("end", "not_after_start", _("The end must come after the start.")))
        elif end - start > timedelta(days=MAX_DAYS):
            errors.append(FieldError("end", "max_range", _("A report covers at most %(days)d days.") % {
                "days": MAX_DAYS}))
    group_by: list[str] = []
    for name in (part.strip() for part in params.get("group_by", "").split(",")):
        if not name:
            continue
        if name not in selectors.DIMENSIONS + selectors.PERIODS:
            errors.append(FieldError("group_by", "invalid_choice", _(
                "Unknown grouping %(name)s: choose among %(choices)s.") % {
                "name": repr(name), "choices": ", ".join(selectors.DIMENSIONS + selectors.PERIODS)}))
        elif name in group_by:
            errors.append(FieldError("group_by", "repeated", _("The grouping %(name)s is named twice.") % {
                "name": repr(name)}))
        else:
            group_by.append(name)
    if len([name for name in group_by if name in selectors.PERIODS]) > 1:
        errors.append(FieldError("group_by", "one_period", _("Group by at most one of day, week and month.")))
    fmt = params.get("format", "json")
    if fmt not in FORMATS:
        errors.append(FieldError("format", "invalid_choice", _("Choose json or csv.")))
    if errors:
        raise ValidationFailed(errors[0].message, errors=errors)
    return selectors.UsageQuery(start=start, end=end, group_by=tuple(group_by),
                                team_ids=selectors.visible_team_ids(request.user)), fmt


class _Echo:
    def write(self, value: str) -> str:
        return value


def _csv_lines(query: selectors.UsageQuery):
    writer = csv.writer(_Echo())
    yield writer.writerow(selectors.usage_header(query))
    for row in selectors.usage_rows(query):
        yield writer.writerow(["" if value is None else value for value in row])


class UsageView(RefusesUnknownQueryParameters, APIView):
    """GPU use from the usage ledger: booked and used GE-hours, GE-hours without telemetry, GPU-hours and
    efficiency (used / booked), summed over [start, end) and grouped by any of team, pool, model, user and
    mode and at most one of day, week and month (UTC). Members read their teams' use, staff every
    team's; a team-limited token narrows either to its teams. `start` and `end` are dates or whole hours
    (default: this calendar month, UTC); `format=csv` streams the same rows as CSV with a header row."""

    content_negotiation_class = AcceptHeaderNegotiation

    def known_query_parameters(self) -> set[str]:
        return {"start", "end", "group_by", "format"}

    @extend_schema(
        parameters=[
            OpenApiParameter("start", OpenApiTypes.STR, description="Date (YYYY-MM-DD) or ISO 8601 instant on the "
                             "hour; default: the start of this month (UTC)"),
            OpenApiParameter("end", OpenApiTypes.STR, description="Date or instant on the hour, exclusive; default: "
                             "the start of next month (UTC)"),
            OpenApiParameter("group_by", OpenApiTypes.STR, description="Comma-separated: team, pool, model, user, "
                             "mode, and at most one of day, week, month"),
            OpenApiParameter("format", OpenApiTypes.STR, enum=list(FORMATS), description="json (default) or csv"),
        ],
        responses={(200, "application/json"): UsageReportSerializer, (200, "text/csv"): OpenApiTypes.STR},
    )
    def get(self, request: Request):
        query, fmt = usage_query(request)
        if fmt == "csv":
            response = StreamingHttpResponse(_csv_lines(query), content_type="text/csv; charset=utf-8")
            response["Content-Disposition"] = (
                f'attachment; filename="usage-{query.start:%Y%m%dT%H}-{query.end:%Y%m%dT%H}.csv"')
            return response
        columns = selectors.usage_header(query)
        return Response({
            "start": query.start, "end": query.end, "group_by": list(query.group_by), "columns": columns,
            "totals": selectors.usage_totals(query),
            "rows": [dict(zip(columns, row)) for row in selectors.usage_rows(query)],
        })


class PriceViewSet(viewsets.ModelViewSet):
    """Chargeback prices per GE-hour, per GPU model and optionally per pool, each from a day on. Everyone
    signed in reads them; staff add them (POST) and correct one not yet in force (PATCH). A price in force
    is history: a change of price is a new price from a later day."""

    serializer_class = PriceSerializer
    permission_classes = [IsStaffOrReadOnly]
    queryset = Price.objects.select_related("pool", "created_by")
    http_method_names = ["get", "post", "patch", "head", "options"]

    def perform_create(self, serializer: PriceSerializer) -> None:
        data = dict(serializer.validated_data)
        serializer.instance = services.price_create(actor=self.request.user, pool=data.pop("pool", None), **data)

    def perform_update(self, serializer: PriceSerializer) -> None:
        serializer.instance = services.price_update(actor=self.request.user, price=serializer.instance,
                                                    **serializer.validated_data)


def parse_month(raw: str) -> date:
    """YYYY-MM as the month's first day; anything else a 400 naming `month`."""
    try:
        year, month = (int(part) for part in raw.split("-"))
        if len(raw) != 7:
            raise ValueError(raw)
        return date(year, month, 1)
    except ValueError:
        raise ValidationFailed(_("Give the month as YYYY-MM, e.g. 2026-03."), field="month", rule="invalid") from None


def statement_body(statement: selectors.TeamStatement) -> dict:
    return {"team": statement.team.slug, "month": f"{statement.month:%Y-%m}", "status": statement.status,
            "closed_at": statement.closed_at, "lines": statement.lines, "totals": statement.totals}


class StatementView(APIView):
    """A team's monthly statement: booked, used and idle (booked - used) GE-hours, GPU-hours and cost per pool,
    GPU model and sharing mode. `closed` once the month is final in the ledger (frozen, with the prices then in
    force); `provisional` before (computed from the ledger now). Members and staff read it; for anyone else
    the team does not exist (404)."""

    @extend_schema(responses=StatementSerializer)
    def get(self, request: Request, slug: str, month: str) -> Response:
        team = teams_of(request.user).filter(slug=slug).first()
        if team is None:
            raise NotFound(_("Team '%(slug)s' does not exist.") % {"slug": slug}, field="slug", rule="does_not_exist")
        return Response(statement_body(selectors.team_statement(team, parse_month(month))))
