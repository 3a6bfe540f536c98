"""Memberships that follow the company's identity provider.

At each single sign-on (OIDC in teams/oidc.py, LDAP in teams/ldap.py) the provider says which groups the
user is in; staff map groups to teams and roles (GroupMapping). A team that any mapping names is kept
by the provider: the user's membership and role there are set from their groups, and a user in none of
its groups leaves it. Teams no mapping names keep what their managers set by hand. Staff powers follow
the groups too once any mapping grants staff, except for superusers (the break-glass accounts).

A membership removed here stops the user's live sockets within their recheck period, as a removal by a
manager does (monitoring/consumers.py).
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from teams.models import GroupMapping, Membership, Team

log = logging.getLogger(__name__)

_RANK = {Membership.Role.MEMBER: 0, Membership.Role.MANAGER: 1}


@dataclass
class GroupSync:
    """What one sign-in changed: (team slug, role) joined or re-roled, team slugs left, staff flag set."""

    joined: list[tuple[str, str]] = field(default_factory=list)
    changed: list[tuple[str, str]] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    staff: bool | None = None  # None: unchanged

    def __bool__(self) -> bool:
        return bool(self.joined or self.changed or self.left or self.staff is not None)


@transaction.atomic
def memberships_follow_groups(*, user: AbstractBaseUser, groups: Iterable[str], source: str) -> GroupSync:
    """Set the user's memberships of provider-kept teams, and their staff flag, from their groups."""
    groups = {str(group) for group in groups}
    # Case matters for OIDC claims; LDAP DNs are compared as the directory spelled them (teams/ldap.py
    # lower-cases both sides).
    mappings = list(GroupMapping.objects.filter(group__in=groups).select_related("team"))
    wanted: dict[int, str] = {}
    for mapping in mappings:
        if mapping.team_id and _RANK[mapping.role] >= _RANK.get(wanted.get(mapping.team_id), -1):
            wanted[mapping.team_id] = mapping.role
    kept = set(GroupMapping.objects.exclude(team=None).values_list("team_id", flat=True))
    slugs = dict(Team.objects.filter(pk__in=kept | set(wanted)).values_list("pk", "slug"))
    current = {m.team_id: m for m in Membership.objects.select_for_update().filter(user=user)}
    sync = GroupSync()
    for team_id, role in sorted(wanted.items()):
        membership = current.get(team_id)
        if membership is None:
            # get_or_create: two sign-ins of one user at once must not trip the one-membership constraint.
            _, made = Membership.objects.get_or_create(user=user, team_id=team_id, defaults={"role": role})
            if made:
                sync.joined.append((slugs[team_id], role))
        elif membership.role != role:
            membership.role = role
            membership.save(update_fields=["role"])
            sync.changed.append((slugs[team_id], role))
    for team_id in sorted(kept - set(wanted)):
        if team_id in current:
            current[team_id].delete()
            sync.left.append(slugs[team_id])
    if not getattr(user, "is_superuser", False) and GroupMapping.objects.filter(staff=True).exists():
        staff = any(mapping.staff for mapping in mappings)
        if user.is_staff != staff:
            user.is_staff = staff
            user.save(update_fields=["is_staff"])
            sync.staff = staff
    if sync:
        log.info("%s sign-in of %s: joined %s, role changed %s, left %s, staff %s", source, user.get_username(),
                 sync.joined, sync.changed, sync.left, "unchanged" if sync.staff is None else sync.staff)
    return sync
