"""One application error family.

Services raise these; the DRF exception handler and the page views turn them into a
4xx whose body names the field and the rule that was broken. Nothing else in the code
base decides status codes for domain rules.
"""
from __future__ import annotations

from dataclasses import dataclass


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


class ValidationFailed(ApplicationError):
    status = 400


class PermissionDenied(ApplicationError):
    status = 403


class NotFound(ApplicationError):
    status = 404


class Conflict(ApplicationError):
    """The request is well-formed but the current state refuses it (no room, over quota, wrong state)."""

    status = 409
