"""One application error family.

Services raise these; the DRF exception handler and the page views turn them into a
4xx whose body names the field and the rule that was broken. Nothing else in the code
base decides status codes for domain rules.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from django.utils.translation import gettext as _


def instant(value: datetime) -> str:
    """How a message names an instant: ISO 8601 in UTC, to the minute ("2026-11-24T18:30+00:00"), which a
    script can parse; the pages write it in the viewer's zone (portal.timezones.people_times)."""
    return value.astimezone(UTC).isoformat(timespec="minutes")


@dataclass(frozen=True)
class FieldError:
    field: str
    rule: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"field": self.field, "rule": self.rule, "message": self.message}


class ApplicationError(Exception):
    """A request the portal refuses; `status` is the HTTP status it maps to."""

    status = 400

    def __init__(self, message: str, *, field: str = "non_field_errors", rule: str = "invalid",
                 errors: list[FieldError] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.errors = errors or [FieldError(field=field, rule=rule, message=message)]
        # More of the answer's body beside `detail` and `errors` (e.g. a refused booking's `alternatives`).
        self.extra: dict = {}


class ValidationFailed(ApplicationError):
    status = 400


class PermissionDenied(ApplicationError):
    status = 403


class NotFound(ApplicationError):
    status = 404


class Conflict(ApplicationError):
    """The request is well-formed but the current state refuses it (no room, over quota, wrong state)."""

    status = 409


class PayloadTooLarge(ApplicationError):
    status = 413


class ServiceUnavailable(ApplicationError):
    """A service the request needs is unreachable (rule `broker_unavailable`: Redis; `database_unavailable`:
    PostgreSQL). Nothing was half-written; the client should try again after `retry_after` seconds."""

    status = 503
    retry_after = 5

    def __init__(self, message: str, *, rule: str, retry_after: int | None = None) -> None:
        super().__init__(message, field="", rule=rule)
        if retry_after is not None:
            self.retry_after = retry_after


def broker_unavailable() -> ServiceUnavailable:
    return ServiceUnavailable(_("The message broker (Redis) is unreachable; try again shortly."),
                              rule="broker_unavailable")


def database_unavailable() -> ServiceUnavailable:
    return ServiceUnavailable(_("The database is unreachable; try again shortly."), rule="database_unavailable")
