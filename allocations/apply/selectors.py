"""Reads for applying: what should exist on a cluster right now, from the database."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from datetime import datetime

from django.utils import timezone

from allocations.apply.desired import ClusterDesired, Grant, PoolDesired, TeamDesired
from allocations.models import Allocation, Quota, Reservation
from inventory.models import Cluster, Gpu, GpuPool

# Reservations a cluster should enforce: being applied or applied. Releasing ones are being
# undone, so they are already absent from what should exist.
ENFORCED_STATES = (Reservation.State.APPLYING, Reservation.State.ACTIVE)


def cluster_desired(cluster: Cluster, *, now: datetime | None = None,
                    teams: Collection[str] | None = None, with_pools: bool = True) -> ClusterDesired:
    """The teams' grants on `cluster` at `now` (every team's when `teams` is None) and every pool's
    sharing setup there, in four queries. An apply or undo names its team, so its cost does not
    grow with the rest of the cluster; only the reconcile reads everything.

    Without `with_pools` (for a backend that does not read them) it is one query: the grants,
    no pools, and only the teams that hold something or are named."""
    now = now or timezone.now()
    allocations = (
        Allocation.objects.filter(gpu__node__cluster=cluster, reservation__state__in=ENFORCED_STATES,
                                  starts_at__lte=now, ends_at__gt=now)
        .order_by("reservation_id", "gpu__node__name", "gpu__index")
    )
    if teams is not None:
        allocations = allocations.filter(reservation__team__slug__in=list(teams))
    grants: dict[str, list[Grant]] = defaultdict(list)
    # Plain rows, not model instances: a reconcile reads every grant of the cluster.
    for reservation_id, team_slug, gpu_uuid, node_name, pool_slug, sharing_mode, ends_at in allocations.values_list(
            "reservation_id", "reservation__team__slug", "gpu__uuid", "gpu__node__name", "reservation__pool__slug",
            "reservation__pool__sharing_mode", "ends_at"):
        grants[team_slug].append(Grant(reservation_id=reservation_id, gpu_uuid=gpu_uuid, node_name=node_name,
                                       pool_slug=pool_slug, sharing_mode=sharing_mode, ends_at=ends_at))
    if not with_pools:
        return ClusterDesired(cluster_id=cluster.pk, cluster_slug=cluster.slug, kind=cluster.kind,
                              teams=_teams_desired(set(grants) | set(teams or ()), grants))
    nodes_of_pool: dict[int, set[str]] = defaultdict(set)
    pool_nodes = (Gpu.objects.filter(node__cluster=cluster, pool__isnull=False)
                  .order_by().values_list("pool_id", "node__name").distinct())
    for pool_id, node_name in pool_nodes:  # one row per (pool, node), not per GPU
        nodes_of_pool[pool_id].add(node_name)
    # Each pool's settings once, not once per node (decoding its JSON config was most of the cost).
    pools = {slug: PoolDesired(pool_slug=slug, sharing_mode=mode, sharing_config=dict(config),
                               node_names=tuple(sorted(nodes_of_pool[pool_id])))
             for pool_id, slug, mode, config in GpuPool.objects.filter(pk__in=list(nodes_of_pool))
             .values_list("pk", "slug", "sharing_mode", "sharing_config")}
    quotas = Quota.objects.filter(pool_id__in=list(nodes_of_pool))
    if teams is not None:
        quotas = quotas.filter(team__slug__in=list(teams))
    team_slugs = set(grants) | set(quotas.values_list("team__slug", flat=True))
    return ClusterDesired(
        cluster_id=cluster.pk, cluster_slug=cluster.slug, kind=cluster.kind,
        teams=_teams_desired(team_slugs, grants), pools=tuple(pools[slug] for slug in sorted(pools)),
    )


def _teams_desired(slugs: Collection[str], grants: dict[str, list[Grant]]) -> tuple[TeamDesired, ...]:
    return tuple(TeamDesired(team_slug=slug, grants=tuple(grants.get(slug, ()))) for slug in sorted(slugs))


# --- for the Kubernetes admission webhooks -------------------------------------------------------

def team_slug_for_namespace(namespace: str) -> str | None:
    """The team whose namespace (``team_namespace(slug)``) this is, or None for any other namespace."""
    from allocations.apply.desired import team_namespace
    from teams.models import Team

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
