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
import time
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db import DEFAULT_DB_ALIAS, transaction
from django.utils import timezone
from django.utils.translation import gettext as _
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import SAFE_METHODS

from common.errors import PermissionDenied

from common.secrets import key_digest, key_prefix
from teams.models import ApiToken

TOKEN_CACHE_SECONDS = 300
UNKNOWN_KEY_SECONDS = 10
_NO_USER = "-"
# The user columns a request may read without another query.
USER_FIELDS = ("id", "username", "first_name", "last_name", "email", "is_active", "is_staff", "is_superuser")


def _cache_key(digest: str) -> str:
    return "auth:token2:" + digest  # 2: the value now carries the key's limits


@dataclass(frozen=True)
class TokenGrant:
    """What a request's token allows (request.auth): its key, when it ends, its scope and its teams."""

    key: str
    ends_at: float  # a Unix time
    read_only: bool
    team_ids: frozenset[int] | None  # None: every team of its user

    def __str__(self) -> str:
        return self.key


def _lookup(key: str, digest: str) -> tuple | str:
    """(user columns, token limits) for a valid key of an active user, else _NO_USER (two queries)."""
    row = (ApiToken.objects.filter(prefix=key_prefix(key))
           .values_list("pk", "digest", "created_at", "expires_at", "scope",
                        *(f"user__{field}" for field in USER_FIELDS)).first())
    if row is None or not hmac.compare_digest(row[1], digest):
        return _NO_USER
    pk, _digest, created_at, expires_at, scope = row[:5]
    user_values = row[5:]
    if not user_values[USER_FIELDS.index("is_active")]:
        return _NO_USER
    ends_at = ApiToken(created_at=created_at, expires_at=expires_at).ends_at()
    team_ids = list(ApiToken.teams.through.objects.filter(apitoken_id=pk).values_list("team_id", flat=True))
    # Refreshed once per cache period at most, so a stale token shows without a write per request.
    ApiToken.objects.filter(pk=pk).update(last_used_at=timezone.now())
    return user_values, ends_at.timestamp(), scope == ApiToken.Scope.READ, sorted(team_ids) or None


def _user_and_grant(key: str) -> tuple | None:
    digest = key_digest(key)
    cache_key = _cache_key(digest)
    values = cache.get(cache_key)
    if values is None:
        values = _lookup(key, digest)
        # Unknown keys are remembered briefly too, so a stream of wrong keys costs no queries.
        cache.set(cache_key, values, TOKEN_CACHE_SECONDS if values != _NO_USER else UNKNOWN_KEY_SECONDS)
    if values == _NO_USER:
        return None
    user_values, ends_at, read_only, team_ids = values
    # Checked on every request, not when cached: a key ends on time even while its lookup is cached.
    if time.time() >= ends_at:
        return None
    grant = TokenGrant(key=key, ends_at=ends_at, read_only=read_only,
                       team_ids=frozenset(team_ids) if team_ids else None)
    columns = dict(zip(USER_FIELDS, user_values))
    if grant.team_ids is None:
        return _user_from_values(columns), grant
    # A key limited to some teams acts as a plain member of them: no staff powers. The user object is
    # this request's alone; marked so that nothing saves the lowered flags.
    user = _user_from_values({**columns, "is_staff": False, "is_superuser": False})
    user.token_team_ids = grant.team_ids
    return user, grant


def _user_from_values(values: dict):
    """A User with these columns set and the others deferred. Model.from_db takes the values in the
    model's field order, whatever order the names come in: given USER_FIELDS' order it once set
    is_superuser to the username and username to the first name."""
    model = get_user_model()
    names = [field.attname for field in model._meta.concrete_fields if field.attname in values]
    return model.from_db(DEFAULT_DB_ALIAS, names, [values[name] for name in names])


def user_for_token(key: str):
    """The active user holding this unexpired API token key, or None."""
    found = _user_and_grant(key)
    return found[0] if found else None


def refuse_saving_a_limited_user(sender=None, instance=None, **kwargs) -> None:
    """A pre_save receiver: a user object built for a team-limited token has its staff flags
    lowered for that request; saving it would write them."""
    if getattr(instance, "token_team_ids", None) is not None:
        raise RuntimeError("a user object built for a team-limited API token is never saved")


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
    """`Authorization: Token <key>`, read through the cache. request.auth is the TokenGrant.

    A read-only key is refused here for any method that writes, so no view can forget it."""

    model = ApiToken

    def authenticate_credentials(self, key: str):
        found = _user_and_grant(key)
        if found is None:
            raise AuthenticationFailed(_("Invalid or expired token, or its user is inactive."))
        return found

    def authenticate(self, request):
        result = super().authenticate(request)
        if result is not None and result[1].read_only and request.method not in SAFE_METHODS:
            raise PermissionDenied(_("This API token is read-only: it cannot change anything."),
                                   field="token", rule="token_read_only")
        return result
