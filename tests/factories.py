"""factory_boy factories for every model the tests build."""
from __future__ import annotations

import uuid
from datetime import timedelta

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from allocations.models import Quota, Reservation
from inventory.models import Cluster, Gpu, GpuPool, Node
from monitoring.models import AlertRule
from teams.models import Membership, Team

PASSWORD = "correct horse battery staple"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.test")
    password = factory.PostGenerationMethodCall("set_password", PASSWORD)

    @factory.post_generation
    def _save(obj, create, extracted, **kwargs):
        if create:
            obj.save()


class TeamFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Team
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"team-{n}")
    name = factory.LazyAttribute(lambda t: t.slug.title())


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    team = factory.SubFactory(TeamFactory)
    role = Membership.Role.MEMBER


class ClusterFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Cluster
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"cluster-{n}")
    name = factory.LazyAttribute(lambda c: c.slug)
    kind = Cluster.Kind.BAREMETAL


class NodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Node

    cluster = factory.SubFactory(ClusterFactory)
    name = factory.Sequence(lambda n: f"node-{n:03d}")


class PoolFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = GpuPool
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"pool-{n}")
    name = factory.LazyAttribute(lambda p: p.slug.upper())
    sharing_mode = "exclusive"


class GpuFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Gpu

    node = factory.SubFactory(NodeFactory)
    pool = factory.SubFactory(PoolFactory)
    index = factory.Sequence(lambda n: n % 8)
    uuid = factory.LazyFunction(lambda: f"GPU-{uuid.uuid4()}")
    model_name = "NVIDIA H100 80GB HBM3"
    memory_mib = 81559


class QuotaFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Quota

    team = factory.SubFactory(TeamFactory)
    pool = factory.SubFactory(PoolFactory)
    max_ge = 8


class AlertRuleFactory(factory.django.DjangoModelFactory):
    """A rule of the test's own. The rules the portal ships come from a migration, and a transactional test's
    flush empties their table for the tests after it on the same process: a test must not count on them."""

    class Meta:
        model = AlertRule

    name = factory.Sequence(lambda n: f"Host silent {n}")
    metric = "host_silent"
    scope = "node"
    threshold = 60


def add_node(pool: GpuPool, name: str, gpus: int, cluster: Cluster | None = None) -> Node:
    node = NodeFactory(name=name, cluster=cluster or ClusterFactory(slug="lab"))
    for index in range(gpus):
        GpuFactory(node=node, pool=pool, index=index)
    return node


A100 = "NVIDIA A100-SXM4-80GB"


def add_shared_pool(slug: str, mode: str, config: dict, *, team: str = "vision", nodes: int = 1, gpus: int = 2,
                    model: str = A100, memory_mib: int = 81920, max_ge: float = 8) -> GpuPool:
    """A pool of `mode` (its `config`) with `nodes` x `gpus` cards of `model`, and `team`'s quota in it."""
    pool = PoolFactory(slug=slug, sharing_mode=mode, sharing_config=config)
    cluster = ClusterFactory(slug="lab")
    for n in range(nodes):
        node = NodeFactory(cluster=cluster, name=f"{slug}-node-{n}")
        for index in range(gpus):
            GpuFactory(node=node, pool=pool, index=index, model_name=model, memory_mib=memory_mib)
    QuotaFactory(team=TeamFactory(slug=team), pool=pool, max_ge=max_ge)
    return pool


def window(hours_from_now: float = 0, hours: float = 2):
    """(starts_at, ends_at) as aware datetimes, starting `hours_from_now` ahead."""
    start = timezone.now() + timedelta(hours=hours_from_now)
    return start, start + timedelta(hours=hours)


__all__ = [
    "PASSWORD", "UserFactory", "TeamFactory", "MembershipFactory", "ClusterFactory", "NodeFactory",
    "PoolFactory", "GpuFactory", "QuotaFactory", "Reservation", "add_node", "add_shared_pool", "window", "A100",
]
