"""What a request gets while Redis or PostgreSQL is unreachable: 503 with Retry-After, never a bare 500.

Under /api/ and for the machine endpoints the API's JSON shape (rule `broker_unavailable` or
`database_unavailable`); for people a styled "temporarily unavailable" page that needs neither
service to render. DRF's views answer through the API's exception handler; OutageMiddleware
does it for the other views, and handler500 (config.exception_handler.server_error) for a
failure outside any view (a session saved after the view, for instance).
"""
from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string
from django.utils.translation import gettext_lazy as _

from common.errors import ServiceUnavailable
from common.outages import as_service_unavailable

# Paths whose callers are programs, not people.
MACHINE_PATHS = ("/api/", "/metrics", "/readyz", "/healthz", "/webhooks/")

SERVICE_NAMES = {"broker_unavailable": _("the message broker"), "database_unavailable": _("the database")}


def outage_response(request: HttpRequest, error: ServiceUnavailable) -> HttpResponse:
    from config.exception_handler import error_response

    rule = error.errors[0].rule
    if request.path.startswith(MACHINE_PATHS):
        return error_response(error)
    # Rendered without a request context: the page must not touch the session, the user or the database.
    page = render_to_string("unavailable.html", {"service": SERVICE_NAMES.get(rule, _("a service")),
                                                 "retry_after": error.retry_after})
    return HttpResponse(page, status=503, headers={"Retry-After": str(error.retry_after)})


class OutageMiddleware:
    """Turns an outage raised by a view outside DRF (the pages, /metrics) into its 503."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        error = as_service_unavailable(exception)
        return outage_response(request, error) if error is not None else None
