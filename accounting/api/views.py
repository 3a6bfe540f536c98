"""GET /api/v1/usage/: sums of the usage ledger over a window, grouped, as JSON or streamed CSV."""
from __future__ import annotations

import csv
import re
from datetime import UTC, datetime, timedelta

from django.http import StreamingHttpResponse
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from django.utils.translation import gettext as _
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounting import selectors
from accounting.api.serializers import UsageReportSerializer
from common.api import RefusesUnknownQueryParameters
from common.errors import FieldError, ValidationFailed

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
