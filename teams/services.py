"""Writes about teams, members and API tokens. Each is one transaction and checks who asks."""
from __future__ import annotations

from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from decimal import Decimal
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.translation import gettext as _, ngettext

from common.errors import Conflict, NotFound, PermissionDenied, ValidationFailed
from common import crypto
from common.secrets import key_digest, key_prefix, new_key
from teams.models import ApiToken, Membership, NotificationChannel, Team
from teams.selectors import can_manage_team, role_in
from teams.notify import EVENTS, send_test
from teams.tokens import TokenGrant

User = get_user_model()


def _require_manager(actor: AbstractBaseUser, team: Team) -> None:
    if not can_manage_team(actor, team):
        raise PermissionDenied(_("Only the team's managers or staff can change its members."), field="team",
                               rule="manager_required")


def _lock_team(team: Team) -> None:
    """Serialize the writes about one team's members on its row: two requests adding the same user
    both passed the duplicate check and the second INSERT hit the unique constraint (a 500), and the
    last-manager check must not rest on which rows a query happens to join and lock. Taken before the
    actor's role is read, so a manager demoted a moment ago no longer acts as one."""
    Team.objects.select_for_update().filter(pk=team.pk).order_by().values_list("pk", flat=True).first()


def _validated_role(role: str) -> str:
    if role not in Membership.Role.values:
        raise ValidationFailed(_("role must be one of %(roles)s.") % {"roles": ", ".join(Membership.Role.values)},
                               field="role",
                               rule="invalid_choice")
    return role


@transaction.atomic
def team_create(*, actor: AbstractBaseUser, slug: str, name: str, max_ge: Decimal | None = None) -> Team:
    if not actor.is_staff:
        raise PermissionDenied(_("Only staff can create teams."), field="team", rule="staff_required")
    if Team.objects.filter(slug=slug).exists():
        raise Conflict(_("A team with slug %(slug)r already exists.") % {"slug": slug}, field="slug", rule="unique")
    team = Team(slug=slug, name=name, max_ge=max_ge)
    team.full_clean()
    try:
        # A savepoint: two requests for one new slug both pass the checks above, and the second
        # INSERT meets the unique index (an IntegrityError, a 500, before this).
        with transaction.atomic():
            team.save()
    except IntegrityError:
        raise Conflict(_("A team with slug %(slug)r already exists.") % {"slug": slug}, field="slug",
                       rule="unique") from None
    return team


_TEAM_FIELDS = ("slug", "name", "max_ge")


@transaction.atomic
def team_update(*, actor: AbstractBaseUser, team: Team, **fields: object) -> Team:
    """Rename a team or change its team-wide GE cap (`max_ge`, None = no cap): staff only. A lower
    cap binds new bookings; what the team holds stays."""
    if not actor.is_staff:
        raise PermissionDenied(_("Only staff can change teams."), field="team", rule="staff_required")
    unknown = sorted(set(fields) - set(_TEAM_FIELDS))
    if unknown:
        raise ValidationFailed(_("Unknown field %(field)r.") % {"field": unknown[0]}, field=unknown[0],
                               rule="unknown_field")
    _lock_team(team)
    for name, value in fields.items():
        setattr(team, name, value)
    team.full_clean(validate_unique=False)
    if "slug" in fields and Team.objects.filter(slug=team.slug).exclude(pk=team.pk).exists():
        raise Conflict(_("A team with slug %(slug)r already exists.") % {"slug": team.slug}, field="slug",
                       rule="unique")
    team.save()
    return team


@transaction.atomic
def membership_add(*, actor: AbstractBaseUser, team: Team, username: str, role: str = Membership.Role.MEMBER
                   ) -> Membership:
    _lock_team(team)
    _require_manager(actor, team)  # after the lock: a concurrent demotion of the actor counts
    role = _validated_role(role)
    user = User.objects.filter(username=username, is_active=True).first()
    if user is None:
        raise ValidationFailed(_("No active user named %(username)r.") % {"username": username}, field="username",
                               rule="does_not_exist")
    if Membership.objects.filter(team=team, user=user).exists():
        raise Conflict(_("%(username)s is already in %(team)s.") % {"username": username, "team": team.slug},
                       field="username", rule="unique")
    return Membership.objects.create(team=team, user=user, role=role)


def _membership(team: Team, username: str) -> Membership:
    membership = Membership.objects.select_for_update().filter(team=team, user__username=username).first()
    if membership is None:
        raise NotFound(_("%(username)s is not in %(team)s.") % {"username": username, "team": team.slug},
                       field="username", rule="not_a_member")
    return membership


def _would_leave_no_manager(team: Team, membership: Membership) -> bool:
    if membership.role != Membership.Role.MANAGER:
        return False
    return not team.memberships.filter(role=Membership.Role.MANAGER).exclude(pk=membership.pk).exists()


@transaction.atomic
def membership_change_role(*, actor: AbstractBaseUser, team: Team, username: str, role: str) -> Membership:
    _lock_team(team)
    _require_manager(actor, team)  # after the lock: a concurrent demotion of the actor counts
    role = _validated_role(role)
    membership = _membership(team, username)
    if role == Membership.Role.MEMBER and _would_leave_no_manager(team, membership) and not actor.is_staff:
        raise Conflict(_("A team keeps at least one manager."), field="role", rule="last_manager")
    membership.role = role
    membership.save(update_fields=["role"])
    return membership


@transaction.atomic
def membership_remove(*, actor: AbstractBaseUser, team: Team, username: str) -> None:
    _lock_team(team)
    _require_manager(actor, team)  # after the lock: a concurrent demotion of the actor counts
    membership = _membership(team, username)
    if _would_leave_no_manager(team, membership) and not actor.is_staff:
        raise Conflict(_("A team keeps at least one manager."), field="username", rule="last_manager")
    membership.delete()


def _token_teams(*, user: AbstractBaseUser, team_slugs: list[str], within: frozenset[int] | None) -> list[Team]:
    """The teams a new token is limited to: each must be one of the user's (any team, for staff),
    and a token made with a team-limited token stays within that token's teams."""
    teams = []
    for slug in dict.fromkeys(team_slugs):
        team = Team.objects.filter(slug=slug).first()
        if team is None or not (user.is_staff or role_in(user, team) is not None):
            raise ValidationFailed(_("You are not a member of a team named %(slug)r.") % {"slug": slug}, field="teams",
                                   rule="not_your_team")
        teams.append(team)
    if within is not None and (not teams or any(team.pk not in within for team in teams)):
        raise PermissionDenied(_("A token limited to some teams can only make tokens limited to those teams."),
                               field="teams", rule="beyond_token_teams")
    return teams


@transaction.atomic
def api_token_create(*, user: AbstractBaseUser, name: str = "", scope: str = ApiToken.Scope.WRITE,
                     expires_at: datetime | None = None, team_slugs: list[str] = (),
                     made_with: TokenGrant | None = None) -> tuple[ApiToken, str]:
    """A new API token of `user`; returns it with the key, which is never stored or shown again.

    It ends at `expires_at` (default API_TOKEN_DEFAULT_DAYS from now; at most API_TOKEN_MAX_AGE_DAYS).
    A token made through another token (`made_with`) never does more or lives longer than that one.
    A user keeps at most API_TOKENS_PER_USER tokens: making one more deletes the oldest, so a
    script that asks for a token on every run does not pile them up without end."""
    now = timezone.now()
    longest = now + timedelta(days=settings.API_TOKEN_MAX_AGE_DAYS)
    if expires_at is None:
        expires_at = min(now + timedelta(days=settings.API_TOKEN_DEFAULT_DAYS), longest)
    if expires_at <= now:
        raise ValidationFailed(_("The expiry must be in the future."), field="expires_at", rule="in_past")
    if expires_at > longest:
        days = settings.API_TOKEN_MAX_AGE_DAYS
        raise ValidationFailed(ngettext("A token lives at most %(days)d day.", "A token lives at most %(days)d days.",
                                        days) % {"days": days},
                               field="expires_at", rule="too_long")
    if made_with is not None:
        expires_at = min(expires_at, datetime.fromtimestamp(made_with.ends_at, tz=dt_timezone.utc))
    teams = _token_teams(user=user, team_slugs=list(team_slugs),
                         within=made_with.team_ids if made_with is not None else None)
    key = new_key()
    token = ApiToken(user=user, name=name, prefix=key_prefix(key), digest=key_digest(key),
                     scope=scope, expires_at=expires_at, created_at=now)
    token.full_clean(validate_unique=False)  # the prefix is 72 random bits
    token.save()
    if teams:
        token.teams.set(teams)
    older = list(ApiToken.objects.filter(user_id=user.pk).order_by("-created_at", "-pk")
                 .values_list("pk", flat=True)[settings.API_TOKENS_PER_USER:])
    if older:
        ApiToken.objects.filter(pk__in=older).delete()
    return token, key


@transaction.atomic
def api_token_revoke(*, actor: AbstractBaseUser, prefix: str) -> None:
    """Revoke (delete) one of the actor's own tokens, named by its prefix, as the tokens page and
    `DELETE /api/v1/tokens/{prefix}/` do. Someone else's prefix is answered as unknown."""
    deleted, _by_model = ApiToken.objects.filter(user_id=actor.pk, prefix=prefix).delete()
    if not deleted:
        raise NotFound(_("You have no token %(prefix)s….") % {"prefix": prefix}, field="prefix", rule="not_found")


@transaction.atomic
def api_token_delete(*, actor: AbstractBaseUser, key: str) -> None:
    """Delete the token with this key, the actor's own (signing a script out)."""
    ApiToken.objects.filter(user_id=actor.pk, prefix=key_prefix(key), digest=key_digest(key)).delete()


# --- notification channels (teams/notify.py sends to them) -------------------------------------------

def _channel_fields(*, kind: str, email: str, url: str, events: list[str]) -> None:
    unknown = [event for event in events if event not in EVENTS]
    if unknown:
        raise ValidationFailed(_("Unknown events: %(unknown)s. Known: %(known)s.") % {
                                   "unknown": ", ".join(unknown), "known": ", ".join(EVENTS)},
                               field="events", rule="unknown_event")
    if kind == NotificationChannel.Kind.EMAIL:
        if not email:
            raise ValidationFailed(_("An e-mail channel needs an address."), field="email", rule="required")
        if url:
            raise ValidationFailed(_("An e-mail channel takes an address, not a URL."), field="url",
                                   rule="not_for_kind")
        return
    if not url:
        raise ValidationFailed(_("A %(kind)s channel needs its webhook URL.") % {"kind": kind}, field="url",
                               rule="required")
    if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
        raise ValidationFailed(_("The URL must be an http or https address."), field="url", rule="invalid_url")


def _may_manage_channel(actor: AbstractBaseUser, *, team: Team | None, user_id: int | None) -> None:
    if team is not None:
        _require_manager(actor, team)
    elif user_id != actor.pk:
        raise NotFound(_("There is no such channel."), field="id", rule="not_found")


@transaction.atomic
def channel_create(*, actor: AbstractBaseUser, name: str, kind: str, team: Team | None = None, email: str = "",
                   url: str = "", secret: str = "", events: list[str] = (), enabled: bool = True
                   ) -> NotificationChannel:
    """A channel of a team (its managers and staff make it) or of the actor."""
    events = list(dict.fromkeys(events))
    _may_manage_channel(actor, team=team, user_id=None if team else actor.pk)
    _channel_fields(kind=kind, email=email, url=url, events=events)
    channel = NotificationChannel(name=name, kind=kind, team=team, user=None if team else actor, email=email,
                                  url_encrypted=crypto.encrypt(url) if url else "",
                                  secret_encrypted=crypto.encrypt(secret) if secret else "",
                                  events=events, enabled=enabled)
    channel.full_clean()
    channel.save()
    return channel


@transaction.atomic
def channel_update(*, actor: AbstractBaseUser, channel: NotificationChannel, **fields) -> NotificationChannel:
    """Change a channel's name, events, address, URL, secret or whether it is on. A URL or secret given
    replaces the stored one; one not given keeps it (they are never shown back)."""
    channel = NotificationChannel.objects.select_for_update().get(pk=channel.pk)
    _may_manage_channel(actor, team=channel.team, user_id=channel.user_id)
    for name in ("name", "email", "enabled"):
        if name in fields:
            setattr(channel, name, fields[name])
    if "events" in fields:
        channel.events = list(dict.fromkeys(fields["events"]))
    if fields.get("url"):
        channel.url_encrypted = crypto.encrypt(fields["url"])
    if "secret" in fields:
        channel.secret_encrypted = crypto.encrypt(fields["secret"]) if fields["secret"] else ""
    url = fields.get("url") or (crypto.decrypt(channel.url_encrypted) if channel.url_encrypted else "")
    _channel_fields(kind=channel.kind, email=channel.email, url=url, events=channel.events)
    channel.full_clean()
    channel.save()
    return channel


@transaction.atomic
def channel_delete(*, actor: AbstractBaseUser, channel: NotificationChannel) -> None:
    _may_manage_channel(actor, team=channel.team, user_id=channel.user_id)
    channel.delete()


@transaction.atomic
def channel_test(*, actor: AbstractBaseUser, channel: NotificationChannel):
    """Send a test message to a channel (who may change it may test it); sent after the commit."""
    _may_manage_channel(actor, team=channel.team, user_id=channel.user_id)
    return send_test(channel)
