"""Single sign-on with an OpenID Connect provider (Keycloak, Azure AD, Okta, Authing, ...), through
mozilla-django-oidc: the authorization code flow with PKCE, the ID token checked against the provider's
keys (RS256 by default), then the userinfo claims.

Why mozilla-django-oidc rather than django-allauth: the portal needs one relying party configured from
the environment, not allauth's account management, e-mail flows and provider catalogue; mozilla's is
a small, well-kept library whose views and backend each override in a line or two.

Configured from the environment (config/settings.py): OIDC_ISSUER (its discovery document names the
endpoints; OIDC_OP_* settings override them one by one), OIDC_RP_CLIENT_ID, the client secret read
from OIDC_RP_CLIENT_SECRET_FILE, OIDC_RP_SCOPES. Accounts are matched by OIDC_USERNAME_CLAIM
(preferred_username), created at the first sign-in without a local password, and their teams follow
OIDC_GROUPS_CLAIM through the staff's group mappings (teams/identity.py).
"""
from __future__ import annotations

import logging

import requests
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.http import Http404
from django.shortcuts import redirect
from django.utils.translation import gettext as _
from django.views import View
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from teams.identity import memberships_follow_groups

log = logging.getLogger(__name__)

# Setting → the discovery document's key it defaults to.
DISCOVERED = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}
DISCOVERY_CACHE_SECONDS = 3600


def enabled() -> bool:
    return bool(getattr(settings, "OIDC_ISSUER", "") and getattr(settings, "OIDC_RP_CLIENT_ID", ""))


def discovery() -> dict:
    """The provider's /.well-known/openid-configuration, cached an hour (fetched on first use, not at
    start: a provider down at deploy time must not stop the portal, only sign-ins through it)."""
    issuer = settings.OIDC_ISSUER.rstrip("/")
    key = f"oidc:discovery:{issuer}"
    document = cache.get(key)
    if document is None:
        answer = requests.get(f"{issuer}/.well-known/openid-configuration", timeout=settings.OIDC_TIMEOUT)
        answer.raise_for_status()
        document = answer.json()
        if document.get("issuer", "").rstrip("/") != issuer:
            raise ImproperlyConfigured(f"The provider at {issuer} calls itself {document.get('issuer')!r}")
        cache.set(key, document, DISCOVERY_CACHE_SECONDS)
    return document


def setting(name: str, *default):
    """A mozilla-django-oidc setting, an endpoint coming from discovery unless set explicitly."""
    explicit = getattr(settings, name, None)
    if name in DISCOVERED and not explicit and enabled():
        return discovery()[DISCOVERED[name]]
    return import_from_settings(name, *default)


class PortalOIDCBackend(OIDCAuthenticationBackend):
    """Accounts by username claim; teams and staff from the groups claim."""

    get_settings = staticmethod(setting)

    def __init__(self, *args, **kwargs):
        # Django builds every backend for every sign-in, passwords included: reading the endpoints
        # (discovery, a request to the provider) waits until this backend is really asked.
        self.UserModel = get_user_model()

    def authenticate(self, request, **kwargs):
        if not enabled() or request is None or "code" not in request.GET:
            return None
        super().__init__()
        return super().authenticate(request, **kwargs)

    def _username(self, claims: dict) -> str:
        username = str(claims.get(settings.OIDC_USERNAME_CLAIM) or "").strip()
        if not username or len(username) > 150:
            raise SuspiciousOperation(f"the {settings.OIDC_USERNAME_CLAIM} claim is missing or too long")
        return username

    def verify_claims(self, claims: dict) -> bool:
        return bool(claims.get(settings.OIDC_USERNAME_CLAIM))

    def filter_users_by_claims(self, claims: dict):
        return self.UserModel.objects.filter(username=self._username(claims))

    def create_user(self, claims: dict):
        user = self.UserModel(username=self._username(claims))
        user.set_unusable_password()  # signs in through the provider only
        return self.update_user(user, claims)

    def update_user(self, user, claims: dict):
        if not user.is_active:
            raise SuspiciousOperation(f"{user.username} is deactivated in the portal")
        user.email = claims.get("email") or user.email
        user.first_name = (claims.get("given_name") or user.first_name)[:150]
        user.last_name = (claims.get("family_name") or user.last_name)[:150]
        user.save()
        groups = claims.get(settings.OIDC_GROUPS_CLAIM) or []
        if isinstance(groups, str):
            groups = [groups]
        memberships_follow_groups(user=user, groups=groups, source="oidc")
        return user


def _provider_unreachable(request, error: Exception):
    log.warning("single sign-on failed: %s", error)
    messages.error(request, _("The identity provider could not be reached or refused the sign-in; try again, "
                              "or ask staff."))
    return redirect("login")


class PortalOIDCRequestView(OIDCAuthenticationRequestView):
    """/oidc/authenticate/: off (404) while single sign-on is not configured."""

    get_settings = staticmethod(setting)

    def __init__(self, *args, **kwargs):
        # The parent reads the authorization endpoint here, at every request's view instance; it is
        # read in get() instead, so a provider that is down answers a message, not a 500.
        View.__init__(self, *args, **kwargs)

    def get(self, request):
        if not enabled():
            raise Http404(_("Single sign-on is not configured."))
        try:
            OIDCAuthenticationRequestView.__init__(self)
        except (requests.RequestException, ImproperlyConfigured, ValueError) as error:
            return _provider_unreachable(request, error)
        return super().get(request)


class PortalOIDCCallbackView(OIDCAuthenticationCallbackView):
    get_settings = staticmethod(setting)

    def get(self, request):
        if not enabled():
            raise Http404(_("Single sign-on is not configured."))
        try:
            return super().get(request)
        except (requests.RequestException, ImproperlyConfigured, ValueError) as error:
            return _provider_unreachable(request, error)

    def login_failure(self):
        messages.error(self.request, _("Single sign-on did not sign you in (refused, expired or deactivated)."))
        return redirect("login")
