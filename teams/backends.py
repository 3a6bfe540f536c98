"""Password sign-in for local accounts, and what the sign-in page offers."""
from __future__ import annotations

from django.conf import settings
from django.contrib.auth.backends import ModelBackend

from teams import oidc


class LocalAccountsBackend(ModelBackend):
    """Django's password check; with LOCAL_LOGIN=staff only staff may use it (the break-glass accounts
    for when the identity provider is down), everyone else signs in through the provider. API tokens
    made with a password (POST /api/v1/auth/token/) follow the same rule, since they ask this backend."""

    def user_can_authenticate(self, user) -> bool:
        if settings.LOCAL_LOGIN == "staff" and not (user.is_staff or user.is_superuser):
            return False
        return super().user_can_authenticate(user)


def sign_in_options(request) -> dict:
    """A context processor: whether the sign-in page shows the provider's button and the password form."""
    return {"sso_enabled": oidc.enabled(), "sso_name": settings.OIDC_PROVIDER_NAME,
            "local_login": settings.LOCAL_LOGIN}
