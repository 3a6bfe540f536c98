"""API tokens (DRF's `Authorization: Token …`) looked up through the cache.

Scripts send a token with every request; reading the token and its user from the
database each time was one query per API call. The user is cached under a hash of the
key (raw keys never become cache keys) for TOKEN_CACHE_SECONDS. Any save or delete of a
token or a user drops what was cached for that user's token, at once and again after
commit, so a revoked token, a deactivated user or a changed staff flag holds from the
next request on (receivers wired in portal/apps.py).
"""
from __future__ import annotations

import hashlib

from django.core.cache import cache
from django.db import transaction
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token
from rest_framework.exceptions import AuthenticationFailed

TOKEN_CACHE_SECONDS = 300
UNKNOWN_KEY_SECONDS = 10
_NO_USER = "-"


def _cache_key(key: str) -> str:
    return "auth:token:" + hashlib.sha256(key.encode()).hexdigest()


def user_for_token(key: str):
    """The active user holding this API token key, or None."""
    cache_key = _cache_key(key)
    user = cache.get(cache_key)
    if user is None:
        token = Token.objects.select_related("user").filter(key=key).first()
        user = token.user if token is not None and token.user.is_active else _NO_USER
        # Unknown keys are remembered briefly too, so a stream of wrong keys costs no queries.
        cache.set(cache_key, user, TOKEN_CACHE_SECONDS if user != _NO_USER else UNKNOWN_KEY_SECONDS)
    return None if user == _NO_USER else user


def token_forget(sender=None, instance=None, **kwargs) -> None:
    """Drop the cached lookup of a token, or of a user's token (a post_save/post_delete receiver)."""
    if instance is None:
        return
    if isinstance(instance, Token):
        keys = [instance.key]
    else:
        keys = list(Token.objects.filter(user_id=instance.pk).values_list("key", flat=True))
    cache_keys = [_cache_key(key) for key in keys if key]
    if not cache_keys:
        return
    cache.delete_many(cache_keys)
    # Again after commit: another process may have cached the old rows in between.
    transaction.on_commit(lambda: cache.delete_many(cache_keys))


class CachedTokenAuthentication(TokenAuthentication):
    """DRF's TokenAuthentication, reading through user_for_token. request.auth is the key."""

    def authenticate_credentials(self, key: str):
        user = user_for_token(key)
        if user is None:
            raise AuthenticationFailed("Invalid token, or its user is inactive.")
        return user, key
