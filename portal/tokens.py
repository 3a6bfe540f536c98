"""The API tokens page: a person's own tokens, made and revoked in the browser.

The key of a new token is in the answer to the POST that made it, and nowhere else: that page is
never cached and the key is never put in a URL or a flash message (which lives in the session)."""
from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache

from common.errors import ApplicationError
from portal.forms import TokenForm, TokenRevokeForm
from teams import services as team_services
from teams.models import ApiToken
from teams.selectors import teams_of


def _form(request: HttpRequest, data=None) -> TokenForm:
    choices = [(team.slug, team.name) for team in teams_of(request.user).order_by("name")]
    return TokenForm(data, team_choices=choices, max_days=settings.API_TOKEN_MAX_AGE_DAYS)


def _page(request: HttpRequest, form: TokenForm, *, new_key: str = "", status: int = 200) -> HttpResponse:
    tokens = ApiToken.objects.filter(user_id=request.user.pk).prefetch_related("teams").order_by("-created_at")
    return render(request, "portal/tokens.html", {
        "form": form, "tokens": tokens, "new_key": new_key, "now": timezone.now(),
        "max_days": settings.API_TOKEN_MAX_AGE_DAYS,
    }, status=status)


@never_cache
@login_required
def tokens(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _page(request, _form(request))
    form = _form(request, request.POST)
    if not form.is_valid():
        return _page(request, form, status=400)
    data = form.cleaned_data
    try:
        token, key = team_services.api_token_create(
            user=request.user, name=data["name"], scope=data["scope"], team_slugs=data["teams"],
            expires_at=timezone.now() + timedelta(days=data["days"]))
    except ApplicationError as error:
        form.add_error(None, error.message)
        return _page(request, form, status=400)
    return _page(request, _form(request), new_key=key)


@never_cache
@login_required
def token_revoke(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return redirect("tokens")
    form = TokenRevokeForm(request.POST)
    if not form.is_valid():
        messages.error(request, _("Name the token to revoke by its prefix."))
        return redirect("tokens")
    prefix = form.cleaned_data["prefix"]
    token = ApiToken.objects.filter(user_id=request.user.pk, prefix=prefix).first()
    if token is not None and request.POST.get("confirm") != "yes":
        # As release does: without JavaScript's dialog (which adds confirm=yes), a page asks first.
        words = {"prefix": token.prefix, "name": token.name}
        detail = (_("Revoke token %(prefix)s… (%(name)s)? Scripts using it are refused from then on.") if token.name
                  else _("Revoke token %(prefix)s…? Scripts using it are refused from then on.")) % words
        return render(request, "portal/confirm.html", {
            "question": _("Revoke token %(prefix)s…?") % words, "button": _("Revoke"), "back": reverse("tokens"),
            "detail": detail,
            "action": reverse("token-revoke"), "fields": [("prefix", token.prefix)]})
    try:
        team_services.api_token_revoke(actor=request.user, prefix=prefix)
    except ApplicationError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, _("Token %(prefix)s… revoked: scripts using it are refused from now on.") % {
            "prefix": prefix})
    return redirect("tokens")
