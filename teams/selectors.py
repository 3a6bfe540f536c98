"""Reads about teams and who may do what in them."""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from teams.models import Membership, NotificationChannel, Preference, Team

User = AbstractBaseUser | AnonymousUser


def _token_team_ids(user: User) -> frozenset[int] | None:
    """The teams a team-limited API token lets this request's user see (teams/tokens.py), else None."""
    return getattr(user, "token_team_ids", None)


def teams_of(user: User) -> QuerySet[Team]:
    """Teams the user belongs to (staff: every team), narrowed to a team-limited token's teams."""
    if not user.is_authenticated:
        return Team.objects.none()
    if user.is_staff:
        return Team.objects.all()
    teams = Team.objects.filter(memberships__user=user)
    limit = _token_team_ids(user)
    return teams if limit is None else teams.filter(pk__in=limit)


def token_allows_team(user: User, team_id: int) -> bool:
    """False when the request's API token is limited to other teams (for reads of a role done in SQL)."""
    limit = _token_team_ids(user)
    return limit is None or team_id in limit


def team_ids_of(user: User) -> list[int]:
    """The ids of the teams the user belongs to, narrowed to a team-limited token's teams (one
    query on memberships; staff get theirs too: callers decide what staff see)."""
    if not user.is_authenticated:
        return []
    ids = Membership.objects.filter(user_id=user.pk).order_by().values_list("team_id", flat=True)
    limit = _token_team_ids(user)
    return [i for i in ids if limit is None or i in limit]


def role_in(user: User, team: Team) -> str | None:
    """The user's role in the team, or None when they are not in it (or their token is limited to
    other teams)."""
    if not user.is_authenticated:
        return None
    limit = _token_team_ids(user)
    if limit is not None and team.pk not in limit:
        return None
    # order_by(): Membership's default ordering would join teams and users for first().
    return Membership.objects.filter(user=user, team=team).order_by().values_list("role", flat=True).first()


def can_act_for_team(user: User, team: Team) -> bool:
    """Members reserve and manage the team's reservations; staff may act for any team."""
    return user.is_authenticated and (user.is_staff or role_in(user, team) is not None)


def can_manage_team(user: User, team: Team) -> bool:
    """Managers (and staff) add and remove the team's members."""
    return user.is_authenticated and (user.is_staff or role_in(user, team) == Membership.Role.MANAGER)


def channels_visible_to(user: User):
    """Notification channels a user sees: their own, and those of the teams they may see."""
    if not user.is_authenticated:
        return NotificationChannel.objects.none()
    own = NotificationChannel.objects.filter(user_id=user.pk)
    teams = NotificationChannel.objects.filter(team__in=teams_of(user))
    return (own | teams).select_related("team", "user").order_by("team__slug", "name", "pk")


def preference_of(user) -> Preference | None:
    """The language and zone `user` saved, or None (anonymous, or nothing saved: follow the browser)."""
    if user is None or not user.is_authenticated:
        return None
    return Preference.objects.filter(user=user).first()
