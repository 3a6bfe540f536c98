"""WebSocket authentication for scripts: `Authorization: Token <key>` (API tokens, teams/tokens.py), beside the session.

Browsers always send an Origin header, and AllowedHostsOriginValidator checks it.
Scripts and host agents send none; a connection with no Origin but an `Authorization:
Token …` (scripts) or `Host …` (agents, /ws/agent/) header is let through to its
credential check (it cannot ride on a browser's cookies, so the origin check has nothing
to protect there).
"""
from __future__ import annotations

from channels.db import database_sync_to_async
from channels.security.websocket import AllowedHostsOriginValidator


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


@database_sync_to_async
def _user_for_token(key: str):
    from teams.tokens import user_for_token

    return user_for_token(key)


async def current_user(scope):
    """Who the connection's credential names now: the `Authorization: Token …` header's user, else the
    session's (re-read, so a logout, a deactivation or a password change shows). AnonymousUser when none."""
    from django.contrib.auth.models import AnonymousUser

    header = _header(scope, b"authorization")
    if header is not None:
        parts = header.split()
        user = await _user_for_token(parts[1]) if len(parts) == 2 and parts[0] == "Token" else None
        return user or AnonymousUser()
    if "session" not in scope:
        return AnonymousUser()
    from importlib import import_module

    from channels.auth import get_user
    from django.conf import settings

    # A fresh store of the same key: the connection's own keeps what it read at connect.
    session = import_module(settings.SESSION_ENGINE).SessionStore(scope["session"].session_key)
    return await get_user(dict(scope, session=session))


class TokenAuthMiddleware:
    """Replaces the session user by the token's user when an `Authorization: Token …` header is given.

    A wrong token leaves an anonymous user, whom the consumers refuse.
    """

    def __init__(self, inner) -> None:
        self.inner = inner

    async def __call__(self, scope, receive, send):
        if _header(scope, b"authorization") is not None:
            scope = dict(scope, user=await current_user(scope))
        return await self.inner(scope, receive, send)


class BrowserOriginOrTokenValidator:
    """AllowedHostsOriginValidator for browsers; scripts (no Origin, a Token header) skip it."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.validated = AllowedHostsOriginValidator(inner)

    async def __call__(self, scope, receive, send):
        # Host agents (`Host <key>`) are scripts too.
        if _header(scope, b"origin") is None and (_header(scope, b"authorization") or "").startswith(("Token ", "Host ")):
            return await self.inner(scope, receive, send)
        return await self.validated(scope, receive, send)
