"""Reads for applying: what should exist on a cluster right now, from the database."""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Collection, Iterable
from datetime import datetime
from typing import Any

from django.utils import timezone

from allocations import units
from allocations.apply.desired import ClusterDesired, Grant, PoolDesired, TeamDesired
from allocations.models import Allocation, Quota, Reservation
from inventory.models import Cluster, Gpu, GpuPool
from inventory.sharing import REPLICA_MODES, mig_dynamic, replicas_of

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
        .order_by("reservation_id", "gpu__node__name", "gpu__index", "share_from")
    )
    if teams is not None:
        allocations = allocations.filter(reservation__team__slug__in=list(teams))
    grants: dict[str, list[Grant]] = defaultdict(list)
    # Plain rows, not model instances: a reconcile reads every grant of the cluster.
    rows = allocations.values_list("reservation__team__slug", *GRANT_COLUMNS)
    for team_slug, grant in _grants_from_rows(rows):
        grants[team_slug].append(grant)
    if not with_pools:
        return ClusterDesired(cluster_id=cluster.pk, cluster_slug=cluster.slug, kind=cluster.kind,
                              teams=_teams_desired(set(grants) | set(teams or ()), grants))
    nodes_of_pool: dict[int, set[str]] = defaultdict(set)
    models_of_pool: dict[int, set[str]] = defaultdict(set)
    pool_nodes = (Gpu.objects.filter(node__cluster=cluster, pool__isnull=False)
                  .order_by().values_list("pool_id", "node__name", "model_name").distinct())
    for pool_id, node_name, model_name in pool_nodes:  # one row per (pool, node, model), not per GPU
        nodes_of_pool[pool_id].add(node_name)
        models_of_pool[pool_id].add(model_name)
    # Each pool's settings once, not once per node (decoding its JSON config was most of the cost).
    pools = {slug: PoolDesired(pool_slug=slug, sharing_mode=mode, sharing_config=dict(config),
                               node_names=tuple(sorted(nodes_of_pool[pool_id])),
                               gpu_models=tuple(sorted(models_of_pool[pool_id])))
             for pool_id, slug, mode, config in GpuPool.objects.filter(pk__in=list(nodes_of_pool))
             .values_list("pk", "slug", "sharing_mode", "sharing_config")}
    _add_dynamic_layouts(cluster, pools, now)
    quotas = Quota.objects.filter(pool_id__in=list(nodes_of_pool))
    if teams is not None:
        quotas = quotas.filter(team__slug__in=list(teams))
    team_slugs = set(grants) | set(quotas.values_list("team__slug", flat=True))
    return ClusterDesired(
        cluster_id=cluster.pk, cluster_slug=cluster.slug, kind=cluster.kind,
        teams=_teams_desired(team_slugs, grants), pools=tuple(pools[slug] for slug in sorted(pools)),
    )


def _add_dynamic_layouts(cluster: Cluster, pools: dict[str, PoolDesired], now: datetime) -> None:
    """Fill each dynamic MIG pool's `mig_gpus`: every GPU of it on `cluster` with the profiles its grants
    hold at `now`, every team's (an apply for one team still writes the whole node's layout). Two queries,
    only when such a pool exists."""
    dynamic = [slug for slug, pool in pools.items() if pool.sharing_mode == "mig" and mig_dynamic(pool.sharing_config)]
    if not dynamic:
        return
    held: dict[tuple[str, str, int], list[str]] = defaultdict(list)
    for slug, node, index, profile in (
            Allocation.objects.filter(gpu__node__cluster=cluster, gpu__pool__slug__in=dynamic, mode="mig",
                                      reservation__state__in=ENFORCED_STATES, starts_at__lte=now, ends_at__gt=now)
            .order_by("gpu__node__name", "gpu__index", "mig_start")
            .values_list("gpu__pool__slug", "gpu__node__name", "gpu__index", "mig_profile")):
        held[(slug, node, index)].append(profile)
    gpus: dict[str, list] = defaultdict(list)
    for slug, node, index, model in (Gpu.objects.filter(node__cluster=cluster, pool__slug__in=dynamic)
                                     .order_by("node__name", "index")
                                     .values_list("pool__slug", "node__name", "index", "model_name")):
        gpus[slug].append((node, index, model, tuple(held[(slug, node, index)])))
    for slug in dynamic:
        pools[slug] = dataclasses.replace(pools[slug], mig_gpus=tuple(gpus[slug]))


# The grant row's columns a Grant is made of, in the order _grants_from_rows reads them.
GRANT_COLUMNS = ("reservation_id", "gpu__uuid", "gpu__node__name", "reservation__pool__slug", "mode", "ends_at",
                 "mig_profile", "memory_mib", "cores_pct", "milli", "reservation__pool__sharing_config")


def _grants_from_rows(rows: Iterable[tuple]) -> list[tuple[Any, Grant]]:
    """(key, Grant) per reservation, GPU, mode and MIG profile, from (key, *GRANT_COLUMNS) rows.

    The grant rows' contract (allocations.models.Allocation): the time-slicing or MPS rows of one
    reservation on one GPU hold runs of share slots, k in all, so they make one Grant of k units
    (MPS memory and cores summed); MIG has a row per instance, so n instances of one profile are n units; an
    exclusive or vgpu row is one GPU (vgpu with its memory and cores). The mode is the row's
    (its pool's mode when it was booked), not the pool's now. `key` (the team, or anything the
    caller needs) is passed through from the first row of each Grant.
    """
    merged: dict[tuple, list] = {}
    for key, reservation_id, gpu_uuid, node_name, pool_slug, mode, ends_at, profile, memory, cores, milli, config in rows:
        # A time-slicing or MPS row holds a run of share slots (units.share_slots); any other row is one unit.
        count = (units.share_slots(milli, replicas_of(config) or 1) if mode in REPLICA_MODES
                 else 1)
        ident = (reservation_id, gpu_uuid, mode, profile or "")
        entry = merged.get(ident)
        if entry is None:
            merged[ident] = [key, dict(reservation_id=reservation_id, gpu_uuid=gpu_uuid, node_name=node_name,
                                       pool_slug=pool_slug, sharing_mode=mode, ends_at=ends_at, units=count,
                                       mig_profile=profile or "", memory_mib=memory or 0, cores_pct=cores or 0)]
            continue
        fields = entry[1]
        fields["units"] += count
        fields["memory_mib"] += memory or 0
        fields["cores_pct"] += cores or 0
        fields["ends_at"] = min(fields["ends_at"], ends_at)
    return [(key, Grant(**fields)) for key, fields in merged.values()]


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
        .order_by("reservation_id", "gpu__node__name", "gpu__index", "share_from")
    )
    if cluster is not None:
        allocations = allocations.filter(gpu__node__cluster=cluster)
    grants, hostnames = [], {}
    for node_labels, grant in _grants_from_rows(allocations.values_list("gpu__node__labels", *GRANT_COLUMNS)):
        grants.append(grant)
        hostnames[grant.node_name] = (node_labels or {}).get("kubernetes.io/hostname") or grant.node_name
    return tuple(grants), hostnames
