"""Marks every request's audit entries with its source (API, admin or page) and its user."""
from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.urls import reverse

from audit.context import Source, acting


class AuditSourceMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.admin_prefix = reverse("admin:index")
        self.api_prefix = reverse("api:api-root")

    def source_of(self, request: HttpRequest) -> str:
        if request.path.startswith(self.admin_prefix):
            return Source.ADMIN
        if request.path.startswith(self.api_prefix):
            return Source.API
        return Source.PAGE

    def __call__(self, request: HttpRequest) -> HttpResponse:
        def actor():
            user = getattr(request, "user", None)
            return user if user is not None and user.is_authenticated else None

        with acting(self.source_of(request), actor=actor):
            return self.get_response(request)
