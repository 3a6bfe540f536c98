"""A password change or a deactivation ends the user's API tokens and sessions.

Whatever makes the change (the admin, `changepassword`, the shell, a service), it is a save
of the user row, so two receivers (wired in teams/apps.py) see it: before the save they
compare the password and the active flag with the row's, after it they revoke. Deleting the
tokens drops their cached lookups at once and after commit (teams/tokens.py); open
WebSockets close at their next access re-check (monitoring/consumers.py).

Django alone would already refuse a session after a password change (the session keeps a
hash of the password) and a session of an inactive user; deleting the sessions ends them
for every backend and frees their rows. Sessions are found by reading the session table,
which costs one pass over the live sessions per revocation (rare: an admin's act).
"""
from __future__ import annotations

from importlib import import_module

from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from teams.models import ApiToken

_WATCHED = frozenset({"password", "is_active"})


def user_sessions(user_id: int) -> list[str]:
    """Keys of the live sessions signed in as this user (none for session engines that cannot be listed)."""
    store = import_module(settings.SESSION_ENGINE).SessionStore
    if not hasattr(store, "get_model_class"):  # signed cookies, plain cache: nothing server-side to list
        return []
    wanted = str(user_id)
    sessions = store.get_model_class().objects.filter(expire_date__gt=timezone.now())
    return [key for key, data in sessions.values_list("session_key", "session_data").iterator()
            if store().decode(data).get(SESSION_KEY) == wanted]


@transaction.atomic
def user_credentials_revoke(*, user: AbstractBaseUser) -> None:
    """Delete every API token and session of `user`."""
    ApiToken.objects.filter(user_id=user.pk).delete()
    store = import_module(settings.SESSION_ENGINE).SessionStore
    for session_key in user_sessions(user.pk):
        store(session_key=session_key).delete()


def credentials_changing(sender, instance, raw: bool = False, update_fields=None, **kwargs) -> None:
    """pre_save of the user: note whether this save changes the password or deactivates the account."""
    instance._revoke_credentials = False
    if raw or instance._state.adding or instance.pk is None:
        return
    fields = set(_WATCHED if update_fields is None else _WATCHED & set(update_fields))
    fields -= instance.get_deferred_fields()  # a deferred column is not written by this save
    if not fields:
        return
    before = sender._default_manager.filter(pk=instance.pk).values(*fields).first()
    if before is None:
        return
    instance._revoke_credentials = (
        ("password" in fields and before["password"] != instance.password)
        or ("is_active" in fields and before["is_active"] and not instance.is_active)
    )


def credentials_changed(sender, instance, raw: bool = False, **kwargs) -> None:
    """post_save of the user: revoke when credentials_changing said so."""
    if not raw and getattr(instance, "_revoke_credentials", False):
        instance._revoke_credentials = False
        user_credentials_revoke(user=instance)
