"""Grant rows of shared reservations, written directly as the grant-row contract describes them
(allocations.models.Allocation), for the Kubernetes tests of time-slicing, MPS, MIG and vGPU."""
from __future__ import annotations

import math
from datetime import timedelta

from django.utils import timezone

from allocations import units
from allocations.models import Allocation, Reservation
from allocations.placement.mig import layout_instances, named_layout, profile_for
from tests.factories import PoolFactory, QuotaFactory, TeamFactory, add_node
from tests.kubernetes.conftest import unique

H100 = "NVIDIA H100 80GB HBM3"  # GpuFactory's model


def shared_pool(cluster, prefix: str, mode: str, config: dict, *, gpus: int = 2):
    """A pool of `mode` with one node of `gpus` H100s on `cluster` (database rows only)."""
    pool = PoolFactory(slug=unique(f"{prefix}-pool"), sharing_mode=mode, sharing_config=config)
    node = add_node(pool, unique(f"node-{prefix}"), gpus, cluster=cluster)
    return pool, node


def active(team, pool, **shape) -> Reservation:
    now = timezone.now()
    return Reservation.objects.create(team=team, pool=pool, starts_at=now - timedelta(minutes=1),
                                      ends_at=now + timedelta(hours=1), state=Reservation.State.ACTIVE, **shape)


def _row(reservation, gpu, **columns) -> Allocation:
    return Allocation.objects.create(reservation=reservation, gpu=gpu, starts_at=reservation.starts_at,
                                     ends_at=reservation.ends_at, **columns)


def share_rows(reservation, gpu, *, replicas: int, slots: list[int], mode: str = "time_slicing") -> None:
    """Share slots of a time_slicing or mps GPU: one row per slot (mps with its memory and cores)."""
    size = units.MILLI_PER_GPU // replicas
    for i in slots:
        extra = {}
        if mode == "mps":
            extra = {"memory_mib": gpu.memory_mib // replicas, "cores_pct": max(100 // replicas, 1)}
        _row(reservation, gpu, mode=mode, share_from=i * size, share_to=(i + 1) * size, milli=size,
             ge=1 / replicas, **extra)


def mig_rows(reservation, gpu, profile_name: str, layout: list[str], count: int) -> list[int]:
    """`count` instances of `profile_name` on `gpu`, at the starts its pool's `layout` gives them."""
    starts = [start for profile, start in layout_instances(gpu.model_name, layout) if profile.name == profile_name]
    profile = profile_for(gpu.model_name, profile_name)
    for start in starts[:count]:
        _row(reservation, gpu, mode="mig", mig_profile=profile_name, mig_start=start,
             share_from=start * 125, share_to=(start + profile.size) * 125, milli=profile.milli,
             memory_mib=profile.memory_mib, ge=profile.compute_slices / 7)
    return starts[:count]


def vgpu_row(reservation, gpu, *, memory_mib: int, cores_pct: int) -> None:
    share = max(memory_mib / gpu.memory_mib, cores_pct / 100)
    _row(reservation, gpu, mode="vgpu", memory_mib=memory_mib, cores_pct=cores_pct,
         milli=math.ceil(share * units.MILLI_PER_GPU), ge=share)


def mig_team(cluster, prefix: str = "mig", *, instances: int = 2):
    """A team holding `instances` 3g.40gb instances (one per GPU) of an all-balanced MIG pool on `cluster`."""
    team = TeamFactory(slug=unique(prefix))
    pool, node = shared_pool(cluster, prefix, "mig", {"mig_layout": "all-balanced"}, gpus=max(instances, 1))
    QuotaFactory(team=team, pool=pool, max_ge=4)
    reservation = active(team, pool, mode="mig", gpus=instances, mig_profile="3g.40gb", mig_count=instances,
                         ge=instances * 3 / 7)
    layout = named_layout(H100, "all-balanced")
    for gpu in node.gpus.order_by("index")[:instances]:
        mig_rows(reservation, gpu, "3g.40gb", layout, 1)
    return team, pool, node, reservation
