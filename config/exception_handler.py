"""The one DRF exception handler: every error body is {"detail": ..., "errors": [{field, rule, message}]}.

Also what Django itself answers under /api/ (its 400, 404 and 500 handlers, and the outage middleware
for views outside DRF) goes through `error_response`, so an API client never gets an HTML page.
"""
from __future__ import annotations

import re
import sys
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation, TooManyFieldsSent, TooManyFilesSent
from django.core.exceptions import ValidationError as DjangoValidationError

from django.db import IntegrityError
from django.db.models import ProtectedError, RestrictedError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.utils.translation import gettext as _
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from common.errors import ApplicationError, PayloadTooLarge, ServiceUnavailable, ValidationFailed
from common.outages import as_service_unavailable


def _flatten(detail: Any, prefix: str = "") -> list[dict[str, str]]:
    """Turn DRF's nested error detail into a flat list naming each field and rule."""
    if isinstance(detail, dict):
        out: list[dict[str, str]] = []
        for key, value in detail.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            out.extend(_flatten(value, name))
        return out
    if isinstance(detail, list):
        out = []
        for index, value in enumerate(detail):
            nested = isinstance(value, (dict, list))
            out.extend(_flatten(value, f"{prefix}.{index}" if nested and prefix else prefix))
        return out
    code = getattr(detail, "code", None) or "invalid"
    return [{"field": prefix or "non_field_errors", "rule": str(code), "message": str(detail)}]


def _body(errors: list[dict[str, str]], summary: str | None = None) -> dict[str, Any]:
    if summary is None:
        first = errors[0] if errors else {"field": "", "message": _("Invalid request.")}
        summary = first["message"] if first["field"] in ("", "non_field_errors", "body") else (
            f"{first['field']}: {first['message']}"
        )
    return {"detail": summary, "errors": errors}


def _unique_violation_field(exc: IntegrityError) -> str | None:
    """The field a unique index refused, or None for another integrity error. PostgreSQL says
    "Key (cluster_id, name)=(...) already exists." (SQLSTATE 23505), SQLite "UNIQUE constraint failed:
    inventory_node.cluster_id, inventory_node.name"; the last column is the one a person would change."""
    cause = exc.__cause__
    if getattr(cause, "sqlstate", None) == "23505":
        columns = re.match(r"Key \((.+?)\)=", getattr(getattr(cause, "diag", None), "message_detail", "") or "")
    elif "UNIQUE constraint failed" in str(exc):
        columns = re.search(r"UNIQUE constraint failed: (.+)$", str(exc))
    else:
        return None
    if not columns:
        return ""
    last = columns.group(1).split(",")[-1].strip().split(".")[-1]
    return last.removesuffix("_id")


def request_limit_error(exc: BaseException) -> ApplicationError | None:
    """The refusal for a body past Django's request limits (DATA_UPLOAD_MAX_*), naming `body`."""
    if isinstance(exc, RequestDataTooBig):
        return PayloadTooLarge(_("The request body is larger than %(bytes)s bytes.") % {
            "bytes": settings.DATA_UPLOAD_MAX_MEMORY_SIZE}, field="body", rule="too_large")
    if isinstance(exc, TooManyFieldsSent):
        return ValidationFailed(_("More than %(count)s fields in the request.") % {
            "count": settings.DATA_UPLOAD_MAX_NUMBER_FIELDS}, field="body", rule="too_many_fields")
    if isinstance(exc, TooManyFilesSent):
        return ValidationFailed(_("More than %(count)s files in the request.") % {
            "count": settings.DATA_UPLOAD_MAX_NUMBER_FILES}, field="body", rule="too_many_files")
    return None


def _headers(error: ApplicationError) -> dict[str, str] | None:
    return {"Retry-After": str(error.retry_after)} if isinstance(error, ServiceUnavailable) else None


def error_response(error: ApplicationError) -> JsonResponse:
    """An application error as the API answers it, for code outside DRF's views."""
    return JsonResponse(_body([e.as_dict() for e in error.errors], error.message), status=error.status,
                        headers=_headers(error))


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    # Redis or PostgreSQL unreachable (503 naming which), a body past Django's limits (413/400).
    if (outage := as_service_unavailable(exc)) is not None:
        exc = outage
    elif (too_big := request_limit_error(exc)) is not None:
        exc = too_big
    if isinstance(exc, IntegrityError) and (field := _unique_violation_field(exc)) is not None:
        # Two requests creating the same thing at once both pass the serializer's unique check and the
        # second meets the index: the answer a request a moment later gets from the check, not a 500.
        set_rollback()
        message = (_("Another %(field)s with these values was just created; it already exists.") % {"field": field}
                   if field else _("Another row with these values was just created; it already exists."))
        return Response(_body([{"field": field, "rule": "unique", "message": message}]),
                        status=status.HTTP_409_CONFLICT)
    if isinstance(exc, ApplicationError):
        return Response({**_body([e.as_dict() for e in exc.errors], exc.message), **exc.extra}, status=exc.status,
                        headers=_headers(exc))
    if isinstance(exc, (ProtectedError, RestrictedError)):
        blockers = sorted({str(type(obj)._meta.verbose_name_plural) for obj in exc.protected_objects})
        message = _("Still in use by %(objects)s; remove or move those first.") % {"objects": ", ".join(blockers)}
        return Response(_body([{"field": "", "rule": "protected", "message": message}]), status=status.HTTP_409_CONFLICT)
    if isinstance(exc, DjangoValidationError):
        detail = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        return Response(_body(_flatten(detail)), status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()

    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ParseError):
        errors = [{"field": "body", "rule": "malformed", "message": str(exc.detail)}]
    elif isinstance(exc, exceptions.ValidationError):
        errors = _flatten(exc.detail)
    else:
        errors = [{"field": "", "rule": str(getattr(exc, "default_code", "error")), "message": str(exc.detail)}]
    response.data = _body(errors)
    return response


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """The project's handler404: a URL under /api/ that matches no route (or a lookup its route refuses,
    such as a team slug with a NUL byte) answers the API's JSON shape; pages keep Django's page."""
    if request.path.startswith("/api/"):
        return JsonResponse(_body([{"field": "", "rule": "not_found", "message": _("Not found.")}]), status=404)
    return defaults.page_not_found(request, exception)


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """The project's handler400 (a body past Django's limits, a bad Host header, ...): JSON under /api/."""
    if request.path.startswith("/api/"):
        error = request_limit_error(exception) or ValidationFailed(
            _("Bad request.") if isinstance(exception, SuspiciousOperation) else str(exception) or _("Bad request."),
            field="", rule="bad_request")
        return error_response(error)
    return defaults.bad_request(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    """The project's handler500, for a failure no view or middleware answered: JSON under /api/, an outage
    as its 503 (config/outages.py), anything else Django's page."""
    from config.outages import outage_response

    exc = sys.exc_info()[1]
    outage = as_service_unavailable(exc) if exc is not None else None
    if outage is not None:
        return outage_response(request, outage)
    if request.path.startswith("/api/"):
        message = _("Internal server error; it has been logged.")
        return JsonResponse(_body([{"field": "", "rule": "server_error", "message": message}]), status=500)
    return defaults.server_error(request)
