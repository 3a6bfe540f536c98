"""Reads about teams and who may do what in them."""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from teams.models import Membership, Team

User = AbstractBaseUser | AnonymousUser


def teams_of(user: User) -> QuerySet[Team]:
    """Teams the user belongs to (staff: every team)."""
    if not user.is_authenticated:
        return Team.objects.none()
    if user.is_staff:
        return Team.objects.all()
    return Team.objects.filter(memberships__user=user)


def role_in(user: User, team: Team) -> str | None:
    """The user's role in the team, or None when they are not in it."""
    if not user.is_authenticated:
        return None
    # order_by(): Membership's default ordering would join teams and users for first().
    return Membership.objects.filter(user=user, team=team).order_by().values_list("role", flat=True).first()


def can_act_for_team(user: User, team: Team) -> bool:
    """Members reserve and manage the team's reservations; staff may act for any team."""
    return user.is_authenticated and (user.is_staff or role_in(user, team) is not None)


def can_manage_team(user: User, team: Team) -> bool:
    """Managers (and staff) add and remove the team's members."""
    return user.is_authenticated and (user.is_staff or role_in(user, team) == Membership.Role.MANAGER)
