"""Encryption at rest for secrets the portal must read back (kubeconfigs, telemetry credentials, webhook
URLs and signing keys): Fernet with keys from the environment.

``FIELD_ENCRYPTION_KEY`` holds one or more Fernet keys (comma-separated); the first
encrypts, every one decrypts (MultiFernet), so a key is rotated by putting the new one
first. Without it a key is derived from SECRET_KEY, so the embedded demo and the tests need
no extra setting; production sets its own key (see the README).
"""
from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings


class DecryptionFailed(Exception):
    """The stored value was encrypted with a key the portal no longer has."""


def _fernet() -> MultiFernet:
    keys = [key.strip() for key in getattr(settings, "FIELD_ENCRYPTION_KEYS", []) if key.strip()]
    if not keys:
        # Derived, not the SECRET_KEY itself: a domain-separated SHA-256 makes a valid 32-byte key.
        digest = hashlib.sha256(b"gpupool-field-encryption:" + settings.SECRET_KEY.encode()).digest()
        keys = [base64.urlsafe_b64encode(digest).decode()]
    return MultiFernet([Fernet(key.encode()) for key in keys])


def encrypt(plaintext: str) -> str:
    return _fernet().encrypt(plaintext.encode()).decode()


def decrypt(token: str) -> str:
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken as exc:
        raise DecryptionFailed("the stored credentials cannot be decrypted with FIELD_ENCRYPTION_KEY") from exc
