"""Reads for applying: what should exist on a cluster right now, from the database."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from datetime import datetime

from django.utils import timezone

from allocations.apply.desired import ClusterDesired, Grant, PoolDesired, TeamDesired
from allocations.models import Allocation, Quota, Reservation
from inventory.models import Cluster, Gpu

# Reservations a cluster should enforce: being applied or applied. Releasing ones are being
# undone, so they are already absent from what should exist.
ENFORCED_STATES = (Reservation.State.APPLYING, Reservation.State.ACTIVE)


def cluster_desired(cluster: Cluster, *, now: datetime | None = None,
                    teams: Collection[str] | None = None) -> ClusterDesired:
    """The teams' grants on `cluster` at `now` (every team's when `teams` is None) and every pool's
    sharing setup there, in three queries. An apply or undo names its team, so its cost does not
    grow with the rest of the cluster; only the reconcile reads everything."""
    now = now or timezone.now()
    allocations = (
        Allocation.objects.filter(gpu__node__cluster=cluster, reservation__state__in=ENFORCED_STATES,
                                  starts_at__lte=now, ends_at__gt=now)
        .select_related("gpu__node", "reservation__team", "reservation__pool")
        .order_by("reservation_id", "gpu__node__name", "gpu__index")
    )
    if teams is not None:
        allocations = allocations.filter(reservation__team__slug__in=list(teams))
    grants: dict[str, list[Grant]] = defaultdict(list)
    for allocation in allocations:
        reservation = allocation.reservation
        grants[reservation.team.slug].append(Grant(
            reservation_id=reservation.pk, gpu_uuid=allocation.gpu.uuid, node_name=allocation.gpu.node.name,
            pool_slug=reservation.pool.slug, sharing_mode=reservation.pool.sharing_mode,
            ends_at=allocation.ends_at,
        ))
    pools: dict[str, PoolDesired] = {}
    nodes_of_pool: dict[str, set[str]] = defaultdict(set)
    pool_nodes = (Gpu.objects.filter(node__cluster=cluster, pool__isnull=False)
                  .values_list("pool__slug", "pool__sharing_mode", "pool__sharing_config", "node__name").distinct())
    for slug, mode, config, node_name in pool_nodes:  # one row per (pool, node), not per GPU
        nodes_of_pool[slug].add(node_name)
        pools.setdefault(slug, PoolDesired(pool_slug=slug, sharing_mode=mode, sharing_config=dict(config)))
    quotas = Quota.objects.filter(pool__slug__in=list(pools))
    if teams is not None:
        quotas = quotas.filter(team__slug__in=list(teams))
    team_slugs = set(grants) | set(quotas.values_list("team__slug", flat=True))
    return ClusterDesired(
        cluster_id=cluster.pk, cluster_slug=cluster.slug, kind=cluster.kind,
        teams=tuple(TeamDesired(team_slug=slug, grants=tuple(grants.get(slug, ()))) for slug in sorted(team_slugs)),
        pools=tuple(
            PoolDesired(pool_slug=p.pool_slug, sharing_mode=p.sharing_mode, sharing_config=p.sharing_config,
                        node_names=tuple(sorted(nodes_of_pool[p.pool_slug])))
            for p in sorted(pools.values(), key=lambda p: p.pool_slug)
        ),
    )


# --- for the Kubernetes admission webhooks -------------------------------------------------------

def team_slug_for_namespace(namespace: str) -> str | None:
    """The team whose namespace (``team_namespace(slug)``) this is, or None for any other namespace."""
    from allocations.apply.desired import team_namespace
    from portal.models import Team

    if not namespace.startswith("gpupool-"):
        return None
    guess = namespace[len("gpupool-"):]
    if Team.objects.filter(slug=guess).exists():
        return guess
    # Slugs with characters a namespace cannot carry map lossily: compare the other way round.
    for slug in Team.objects.filter(slug__iexact=guess).values_list("slug", flat=True):
        if team_namespace(slug) == namespace:
            return slug
    for slug in Team.objects.values_list("slug", flat=True):
        if team_namespace(slug) == namespace:
            return slug
    return None


def team_grants(team_slug: str, *, cluster: Cluster | None = None,
                now: datetime | None = None) -> tuple[tuple[Grant, ...], dict[str, str]]:
    """What a team holds now (on `cluster`, or on every Kubernetes cluster), and each node's hostname label.

    The same grants :func:`cluster_desired` gives the backends, so the webhook pins to
    exactly what the ResourceQuota allows.
    """
    now = now or timezone.now()
    allocations = (
        Allocation.objects.filter(reservation__team__slug=team_slug, reservation__state__in=ENFORCED_STATES,
                                  starts_at__lte=now, ends_at__gt=now,
                                  gpu__node__cluster__kind=Cluster.Kind.KUBERNETES)
        .select_related("gpu__node", "reservation__pool")
        .order_by("reservation_id", "gpu__node__name", "gpu__index")
    )
    if cluster is not None:
        allocations = allocations.filter(gpu__node__cluster=cluster)
    grants, hostnames = [], {}
    for allocation in allocations:
        reservation, node = allocation.reservation, allocation.gpu.node
        grants.append(Grant(
            reservation_id=reservation.pk, gpu_uuid=allocation.gpu.uuid, node_name=node.name,
            pool_slug=reservation.pool.slug, sharing_mode=reservation.pool.sharing_mode, ends_at=allocation.ends_at,
        ))
        hostnames[node.name] = (node.labels or {}).get("kubernetes.io/hostname") or node.name
    return tuple(grants), hostnames
