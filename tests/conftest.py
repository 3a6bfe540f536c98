"""Shared fixtures: a small fleet, the personas (owner, member, outsider, staff) and API clients."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from inventory.models import GpuPool
from portal.models import Membership, Team
from tests.factories import MembershipFactory, PoolFactory, QuotaFactory, TeamFactory, UserFactory, add_node


def pytest_configure(config):
    from django.conf import settings

    # The real hasher costs ~0.3 s per password on this machine; tests make many users.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Throttle counters live in the cache (Redis in the suite): start every test from zero."""
    cache.clear()
    yield


@dataclass
class World:
    pool: GpuPool
    other_pool: GpuPool
    team: Team
    other_team: Team
    owner: object  # the team's manager
    member: object
    outsider: object  # in another team, no rights on `team`
    staff: object


@pytest.fixture
def world(db) -> World:
    """Pool `a100` (2 nodes x 4 GPUs) and pool `l4` (1 node x 2 GPUs); team `ml` holds 6 GPUs of a100."""
    pool = PoolFactory(slug="a100", name="A100")
    other_pool = PoolFactory(slug="l4", name="L4")
    add_node(pool, "node-a", 4)
    add_node(pool, "node-b", 4)
    add_node(other_pool, "node-c", 2)
    team, other_team = TeamFactory(slug="ml", name="ML"), TeamFactory(slug="infra", name="Infra")
    QuotaFactory(team=team, pool=pool, max_gpus=6)
    QuotaFactory(team=other_team, pool=pool, max_gpus=8)
    QuotaFactory(team=other_team, pool=other_pool, max_gpus=2)
    owner = UserFactory(username="owner")
    member = UserFactory(username="member")
    outsider = UserFactory(username="outsider")
    staff = UserFactory(username="staff", is_staff=True, is_superuser=True)
    MembershipFactory(user=owner, team=team, role=Membership.Role.MANAGER)
    MembershipFactory(user=member, team=team)
    MembershipFactory(user=outsider, team=other_team, role=Membership.Role.MANAGER)
    return World(pool, other_pool, team, other_team, owner, member, outsider, staff)


@pytest.fixture
def api():
    """api(user) → an APIClient signed in as that user (None: anonymous)."""

    def make(user=None) -> APIClient:
        client = APIClient()
        if user is not None:
            client.force_authenticate(user)
        return client

    return make
