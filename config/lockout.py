"""What a locked-out sign-in gets (django-axes calls this): JSON for the API, a page for people."""
from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils.translation import ngettext


def lockout_response(request: HttpRequest, original_response: HttpResponse | None = None,
                     credentials: dict | None = None) -> HttpResponse:
    minutes = int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)
    message = ngettext("Too many failed sign-ins for this username from this address; try again in %(minutes)d minute.",
                       "Too many failed sign-ins for this username from this address; try again in %(minutes)d minutes.",
                       minutes) % {"minutes": minutes}
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": message, "errors": [{"field": "username", "rule": "locked_out",
                                                            "message": message}]}, status=429)
    return render(request, "registration/locked_out.html", {"message": message}, status=429)
