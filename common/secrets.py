"""Shared secrets sent in `Authorization: Bearer <secret>` (the /metrics token, the admission webhooks')."""
from __future__ import annotations

import hmac

from django.http import HttpRequest


def bearer_token(request: HttpRequest) -> str | None:
    """What follows `Bearer ` in the Authorization header, or None without one."""
    header = request.headers.get("Authorization", "")
    return header[7:] if header.startswith("Bearer ") else None


def same_secret(given: str, expected: str) -> bool:
    """Constant-time comparison, as bytes: hmac.compare_digest refuses str with non-ASCII
    characters (a TypeError, a 500), and `given` is whatever the client sent."""
    return hmac.compare_digest(given.encode(), expected.encode())
