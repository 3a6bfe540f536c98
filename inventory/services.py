"""Writes about the fleet: host tokens, what host agents report, and hosts that fell silent."""
from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from common.errors import Conflict, PermissionDenied, ValidationFailed
from inventory.models import Cluster, Gpu, GpuPool, HostToken, Node
from inventory.signals import node_health_changed


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@transaction.atomic
def host_token_create(*, actor: AbstractBaseUser, cluster: Cluster, host_name: str) -> tuple[HostToken, str]:
    """A new token for one host; returns it with the key, which is never stored or shown again."""
    if not actor.is_staff:
        raise PermissionDenied("Only staff can create host tokens.", field="cluster", rule="staff_required")
    if cluster.kind != Cluster.Kind.BAREMETAL:
        raise ValidationFailed("Host agents belong to bare-metal clusters.", field="cluster", rule="not_baremetal")
    if not host_name or len(host_name) > 253:
        raise ValidationFailed("host_name must be 1 to 253 characters.", field="host_name", rule="invalid")
    key = secrets.token_urlsafe(32)
    token = HostToken.objects.create(cluster=cluster, host_name=host_name, key_hash=hash_key(key), prefix=key[:8],
                                     created_by=actor if actor.is_authenticated else None)
    return token, key


@transaction.atomic
def host_token_revoke(*, actor: AbstractBaseUser, token: HostToken) -> HostToken:
    if not actor.is_staff:
        raise PermissionDenied("Only staff can revoke host tokens.", field="token", rule="staff_required")
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token


def host_token_for_key(key: str) -> HostToken | None:
    """The active token with this key, or None."""
    return (HostToken.objects.select_related("cluster")
            .filter(key_hash=hash_key(key), revoked_at__isnull=True).first())


@dataclass(frozen=True)
class ReportedGpu:
    uuid: str
    index: int
    name: str
    memory_mib: int
    mig_capable: bool
    driver_version: str
    cuda_version: str


def _pool_for_model(cluster: Cluster, model_name: str) -> GpuPool:
    """Unpooled GPUs join a pool per cluster and model, made on first sight; staff can move them later."""
    slug = slugify(f"{cluster.slug}-{model_name}")[:64]
    pool, _ = GpuPool.objects.get_or_create(slug=slug, defaults={"name": f"{cluster.name}: {model_name}"[:128],
                                                                  "sharing_mode": "exclusive"})
    return pool


@transaction.atomic
def host_register(*, token: HostToken, gpus: list[ReportedGpu], backend: str, now: datetime | None = None) -> Node:
    """Create or refresh the token's host and its GPUs from what its agent reports.

    GPUs the agent no longer reports are kept (reservations point at them) but marked
    unhealthy, so nothing new lands on them. A GPU UUID that already belongs to another
    host is refused: two agents must not claim one card.
    """
    now = now or timezone.now()
    uuids = [gpu.uuid for gpu in gpus]
    if len(set(uuids)) != len(uuids):
        raise ValidationFailed("The report lists a GPU UUID twice.", field="gpus", rule="duplicate_uuid")
    if len({gpu.index for gpu in gpus}) != len(gpus):
        raise ValidationFailed("The report lists a GPU index twice.", field="gpus", rule="duplicate_index")
    node, _ = Node.objects.select_for_update().get_or_create(cluster=token.cluster, name=token.host_name)
    elsewhere = Gpu.objects.filter(uuid__in=uuids).exclude(node=node).values_list("uuid", flat=True).first()
    if elsewhere:
        raise Conflict(f"GPU {elsewhere} is already registered on another host.", field="gpus", rule="uuid_taken")
    node.healthy = True
    node.last_seen_at = now
    node.labels = {**node.labels, "gpupool.io/agent-backend": backend}
    node.save()
    known = {gpu.uuid: gpu for gpu in node.gpus.all()}
    node.gpus.exclude(uuid__in=uuids).update(healthy=False)
    for reported in gpus:
        gpu = known.get(reported.uuid) or Gpu(node=node, uuid=reported.uuid,
                                              pool=_pool_for_model(token.cluster, reported.name))
        gpu.index = reported.index
        gpu.model_name = reported.name
        gpu.memory_mib = reported.memory_mib
        gpu.mig_capable = reported.mig_capable
        gpu.driver_version = reported.driver_version[:32]
        gpu.cuda_version = reported.cuda_version[:16]
        gpu.healthy = True
        gpu.save()
    HostToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return node


def host_heartbeat(*, token: HostToken, now: datetime | None = None) -> Node | None:
    """Note that the host is alive; a host that was marked silent rejoins. None if it never registered."""
    now = now or timezone.now()
    node = Node.objects.filter(cluster=token.cluster, name=token.host_name).first()
    if node is None:
        return None
    Node.objects.filter(pk=node.pk).update(last_seen_at=now, healthy=True)
    HostToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return node


def nodes_mark_silent(*, timeout: timedelta, now: datetime | None = None) -> list[int]:
    """Bare-metal hosts whose agent has not reported within `timeout` become unhealthy. Returns their ids.

    A conditional update per host, so two beat runs at once mark (and announce) each host once.
    """
    now = now or timezone.now()
    silent = Node.objects.filter(cluster__kind=Cluster.Kind.BAREMETAL, healthy=True, last_seen_at__isnull=False,
                                 last_seen_at__lt=now - timeout)
    marked = []
    for node_id in silent.values_list("id", flat=True):
        if Node.objects.filter(id=node_id, healthy=True).update(healthy=False):
            marked.append(node_id)
            reason = f"host stopped reporting for {timeout.total_seconds():g} s"
            transaction.on_commit(lambda node_id=node_id, reason=reason: node_health_changed.send(
                sender=Node, node_id=node_id, healthy=False, reason=reason))
    return marked
