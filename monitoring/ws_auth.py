"""WebSocket authentication for scripts: `Authorization: Token <key>` (DRF tokens), beside the session.

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
    from portal.tokens import user_for_token

    return user_for_token(key)


class TokenAuthMiddleware:
    """Replaces the session user by the token's user when an `Authorization: Token …` header is given.

    A wrong token leaves an anonymous user, whom the consumers refuse.
    """

    def __init__(self, inner) -> None:
        self.inner = inner

    async def __call__(self, scope, receive, send):
        header = _header(scope, b"authorization")
        if header is not None:
            from django.contrib.auth.models import AnonymousUser

            parts = header.split()
            user = await _user_for_token(parts[1]) if len(parts) == 2 and parts[0] == "Token" else None
            scope = dict(scope, user=user or AnonymousUser())
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
