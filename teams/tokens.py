"""API tokens (`Authorization: Token <key>`) checked against their stored digest, through the cache.

A key is found by its prefix and proven by its SHA-256 (common.secrets); the database never
holds a key. Scripts send a token with every request, so what authentication needs is
cached under the key's digest for TOKEN_CACHE_SECONDS: the user's id and the few columns a
request reads (names, e-mail, the active/staff/superuser flags), as plain values. Never the
User object: a pickled User carries its password hash. The user is rebuilt from those values
with its other columns deferred (a request that reads one loads it; a save writes only the
loaded ones).

Any save or delete of a token or a user drops what was cached for that user's tokens, at
once and again after commit, so a deleted token, a deactivated user or a changed staff flag
holds from the next request on (receivers wired in teams/apps.py).
"""
from __future__ import annotations

import hmac

from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db import DEFAULT_DB_ALIAS, transaction
from django.utils import timezone
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

from common.secrets import key_digest, key_prefix
from teams.models import ApiToken

TOKEN_CACHE_SECONDS = 300
UNKNOWN_KEY_SECONDS = 10
_NO_USER = "-"
# The user columns a request may read without another query.
USER_FIELDS = ("id", "username", "first_name", "last_name", "email", "is_active", "is_staff", "is_superuser")


def _cache_key(digest: str) -> str:
    return "auth:token:" + digest


def _lookup(key: str, digest: str) -> tuple | str:
    """The user's cached columns for a valid key of an active user, else _NO_USER (one query)."""
    row = (ApiToken.objects.filter(prefix=key_prefix(key))
           .values_list("pk", "digest", *(f"user__{field}" for field in USER_FIELDS)).first())
    if row is None or not hmac.compare_digest(row[1], digest):
        return _NO_USER
    user_values = row[2:]
    if not user_values[USER_FIELDS.index("is_active")]:
        return _NO_USER
    # Refreshed once per cache period at most, so a stale token shows without a write per request.
    ApiToken.objects.filter(pk=row[0]).update(last_used_at=timezone.now())
    return user_values


def user_for_token(key: str):
    """The active user holding this API token key, or None."""
    digest = key_digest(key)
    cache_key = _cache_key(digest)
    values = cache.get(cache_key)
    if values is None:
        values = _lookup(key, digest)
        # Unknown keys are remembered briefly too, so a stream of wrong keys costs no queries.
        cache.set(cache_key, values, TOKEN_CACHE_SECONDS if values != _NO_USER else UNKNOWN_KEY_SECONDS)
    if values == _NO_USER:
        return None
    # from_db takes the values in the model's field order, not in the order of the names it is given.
    user_model = get_user_model()
    by_name = dict(zip(USER_FIELDS, values))
    names = [field.attname for field in user_model._meta.concrete_fields if field.attname in by_name]
    return user_model.from_db(DEFAULT_DB_ALIAS, names, [by_name[name] for name in names])


def token_forget(sender=None, instance=None, **kwargs) -> None:
    """Drop the cached lookup of a token, or of a user's tokens (a post_save/post_delete receiver)."""
    if instance is None:
        return
    if isinstance(instance, ApiToken):
        digests = [instance.digest]
    else:
        digests = list(ApiToken.objects.filter(user_id=instance.pk).values_list("digest", flat=True))
    cache_keys = [_cache_key(digest) for digest in digests if digest]
    if not cache_keys:
        return
    cache.delete_many(cache_keys)
    # Again after commit: another process may have cached the old rows in between.
    transaction.on_commit(lambda: cache.delete_many(cache_keys))


class CachedTokenAuthentication(TokenAuthentication):
    """`Authorization: Token <key>`, read through user_for_token. request.auth is the key."""

    model = ApiToken

    def authenticate_credentials(self, key: str):
        user = user_for_token(key)
        if user is None:
            raise AuthenticationFailed("Invalid token, or its user is inactive.")
        return user, key
