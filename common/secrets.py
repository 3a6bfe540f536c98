"""Secrets: the random keys we hand out (API tokens, host tokens) and the shared secrets sent in
`Authorization: Bearer <secret>` (the /metrics token, the admission webhooks').

A key we hand out is shown once and only its digest is stored. SHA-256 is the right digest
for keys of 256 random bits: there is no dictionary to try, so the slow hashers that
passwords need would only add latency to every request. Where a key is looked up by a
prefix (API tokens), the digest is then compared in constant time.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets

from django.http import HttpRequest

# Characters of a key kept in clear to find its row: 12 URL-safe (or, for API tokens made before
# they were hashed, hex) characters, 72 (48) bits, so two keys sharing one is not a concern.
KEY_PREFIX_LENGTH = 12


def new_key() -> str:
    """A fresh random key: 256 bits, URL-safe (43 characters)."""
    return secrets.token_urlsafe(32)


def key_digest(key: str) -> str:
    """What is stored of a key: its SHA-256, hex."""
    return hashlib.sha256(key.encode()).hexdigest()


def key_prefix(key: str) -> str:
    """The part of a key stored in clear, to find its row and tell keys apart."""
    return key[:KEY_PREFIX_LENGTH]


def bearer_token(request: HttpRequest) -> str | None:
    """What follows `Bearer ` in the Authorization header, or None without one."""
    header = request.headers.get("Authorization", "")
    return header[7:] if header.startswith("Bearer ") else None


def same_secret(given: str, expected: str) -> bool:
    """Constant-time comparison, as bytes: hmac.compare_digest refuses str with non-ASCII
    characters (a TypeError, a 500), and `given` is whatever the client sent."""
    return hmac.compare_digest(given.encode(), expected.encode())
