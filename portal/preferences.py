"""A person's language and time zone.

The language is chosen in this order: the signed-in person's saved preference, the language cookie the
switcher sets, the browser's Accept-Language (Django's LocaleMiddleware does the last two). The time
zone's order is portal/timezones.zone_for's. The switcher in every page's header posts to `switch_language`;
the preferences page saves both for the person, so every browser and every email follows them.
"""
from __future__ import annotations

import zoneinfo

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import translation
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from portal.forms import LanguageForm, PreferenceForm
from teams.models import Preference
from teams.selectors import preference_of


class PreferenceMiddleware:
    """After authentication: a signed-in person's saved language beats the cookie and the browser."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request.preference = preference_of(request.user)
        if request.preference is not None and request.preference.language:
            translation.activate(request.preference.language)
            request.LANGUAGE_CODE = translation.get_language()
        return self.get_response(request)


def _back(request: HttpRequest, fallback: str) -> str:
    target = request.POST.get("next") or request.headers.get("referer") or ""
    if url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                       require_https=request.is_secure()):
        return target
    return fallback


def _remember(response: HttpResponse, language: str) -> HttpResponse:
    """This browser keeps `language` (also before signing in, and after signing out)."""
    response.set_cookie(settings.LANGUAGE_COOKIE_NAME, language, max_age=settings.LANGUAGE_COOKIE_AGE,
                        samesite="Lax", secure=settings.LANGUAGE_COOKIE_SECURE)
    return response


@require_POST
def switch_language(request: HttpRequest) -> HttpResponse:
    """The header's switcher: the cookie for this browser, and the saved preference when signed in."""
    form = LanguageForm(request.POST)
    response = redirect(_back(request, reverse("dashboard")))
    if not form.is_valid():
        return response
    language = form.cleaned_data["language"]
    if request.user.is_authenticated:
        Preference.objects.update_or_create(user=request.user, defaults={"language": language})
    return _remember(response, language)


@login_required
def preferences(request: HttpRequest) -> HttpResponse:
    saved = request.preference or Preference(user=request.user)
    form = PreferenceForm(request.POST or None, instance=saved)
    if request.method == "POST" and form.is_valid():
        form.save()
        with translation.override(form.instance.language or translation.get_language()):
            messages.success(request, _("Your preferences are saved."))
        response = redirect("preferences")
        return _remember(response, form.instance.language) if form.instance.language else response
    return render(request, "portal/preferences.html", {"form": form, "zones": sorted(zoneinfo.available_timezones())})
