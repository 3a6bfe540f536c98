"""Writes about the fleet: clusters and their credentials, host tokens, what host agents and
Kubernetes discovery report, and hosts that fell silent."""
from __future__ import annotations

import json
from urllib.parse import urlsplit

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation

from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone
from django.utils.text import slugify
from django.utils.translation import gettext as _

from audit.services import audit_record
from common.errors import Conflict, NotFound, PermissionDenied, ValidationFailed
from common.secrets import key_digest, new_key
from common import crypto
from inventory.kubernetes.client import parse_kubeconfig
from inventory.kubernetes.nodes import DiscoveredNode
from inventory.models import (
    DEFAULT_GPU_MODEL_WEIGHT,
    Cluster,
    Gpu,
    GpuModel,
    GpuModelWeightChange,
    GpuPool,
    HostToken,
    Node,
    TelemetrySource,
)
from inventory.signals import gpu_moving, node_health_changed


@transaction.atomic
def host_token_create(*, actor: AbstractBaseUser, cluster: Cluster, host_name: str) -> tuple[HostToken, str]:
    """A new token for one host; returns it with the key, which is never stored or shown again."""
    if not actor.is_staff:
        raise PermissionDenied(_("Only staff can create host tokens."), field="cluster", rule="staff_required")
    if cluster.kind != Cluster.Kind.BAREMETAL:
        raise ValidationFailed(_("Host agents belong to bare-metal clusters."), field="cluster", rule="not_baremetal")
    if not host_name or len(host_name) > 253:
        raise ValidationFailed(_("host_name must be 1 to 253 characters."), field="host_name", rule="invalid")
    key = new_key()
    token = HostToken.objects.create(cluster=cluster, host_name=host_name, key_hash=key_digest(key), prefix=key[:8],
                                     created_by=actor if actor.is_authenticated else None)
    return token, key


@transaction.atomic
def host_token_revoke(*, actor: AbstractBaseUser, token: HostToken) -> HostToken:
    if not actor.is_staff:
        raise PermissionDenied(_("Only staff can revoke host tokens."), field="token", rule="staff_required")
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token


# Agents authenticate every request (telemetry: once a second per host), so the active
# token of a key is kept in the cache. Any save or delete of a token drops its entry
# (receivers wired in inventory/apps.py), so a revocation takes effect at once in every process.
HOST_TOKEN_CACHE_SECONDS = 300
_NO_TOKEN = "none"


def host_token_cache_key(key_hash: str) -> str:
    return f"inv:hosttoken:{key_hash}"


def host_token_for_key(key: str) -> HostToken | None:
    """The active token with this key, or None."""
    key_hash = key_digest(key)
    cache_key = host_token_cache_key(key_hash)
    token = cache.get(cache_key)
    if token is None:
        token = (HostToken.objects.select_related("cluster")
                 .filter(key_hash=key_hash, revoked_at__isnull=True).first()) or _NO_TOKEN
        # Unknown keys are remembered briefly too, so a stream of wrong keys costs no queries.
        cache.set(cache_key, token, HOST_TOKEN_CACHE_SECONDS if token != _NO_TOKEN else 10)
    return None if token == _NO_TOKEN else token


def host_token_forget(sender=None, instance: HostToken | None = None, **kwargs) -> None:
    """Drop the cached lookup of a token's key (a post_save/post_delete receiver)."""
    if instance is None:
        return
    key = host_token_cache_key(instance.key_hash)
    cache.delete(key)
    # Again after commit: another process may have cached the old row in between.
    transaction.on_commit(lambda: cache.delete(key))


@dataclass(frozen=True)
class ReportedGpu:
    uuid: str
    index: int
    name: str
    memory_mib: int
    mig_capable: bool
    driver_version: str
    cuda_version: str
    # [{"uuid": "MIG-…", "profile": "1g.10gb", "start": 0, "memory_mib": 9984}], by start; None: not
    # reported (an agent that does not read MIG), so the GPU keeps what it had.
    mig_devices: list[dict] | None = None


def pool_for_model(cluster: Cluster, model_name: str) -> GpuPool:
    """Unpooled GPUs join a pool per cluster and model, made on first sight; staff can move them later."""
    slug = slugify(f"{cluster.slug}-{model_name}")[:64]
    pool, _made = GpuPool.objects.get_or_create(slug=slug, defaults={"name": f"{cluster.name}: {model_name}"[:128],
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
        raise ValidationFailed(_("The report lists a GPU UUID twice."), field="gpus", rule="duplicate_uuid")
    if len({gpu.index for gpu in gpus}) != len(gpus):
        raise ValidationFailed(_("The report lists a GPU index twice."), field="gpus", rule="duplicate_index")
    mig_uuids = [device["uuid"] for gpu in gpus for device in gpu.mig_devices or ()]
    if len(set(mig_uuids)) != len(mig_uuids):
        raise ValidationFailed(_("The report lists a MIG device UUID twice."), field="gpus",
                               rule="duplicate_mig_uuid")
    node, _made = Node.objects.select_for_update().get_or_create(cluster=token.cluster, name=token.host_name)
    elsewhere = Gpu.objects.filter(uuid__in=uuids).exclude(node=node).values_list("uuid", flat=True).first()
    if elsewhere:
        raise Conflict(_("GPU %(uuid)s is already registered on another host.") % {"uuid": elsewhere}, field="gpus",
                       rule="uuid_taken")
    node.healthy = True
    node.last_seen_at = now
    node.labels = {**node.labels, "gpupool.io/agent-backend": backend}
    node.save()
    known = {gpu.uuid: gpu for gpu in node.gpus.all()}
    _gpus_mark_gone(node.gpus.exclude(uuid__in=uuids))
    for reported in gpus:
        gpu = known.get(reported.uuid) or Gpu(node=node, uuid=reported.uuid,
                                              pool=pool_for_model(token.cluster, reported.name))
        gpu.index = reported.index
        gpu.model_name = reported.name
        gpu.memory_mib = reported.memory_mib
        gpu.mig_capable = reported.mig_capable
        gpu.driver_version = reported.driver_version[:32]
        gpu.cuda_version = reported.cuda_version[:16]
        if reported.mig_devices is not None:
            gpu.mig_devices = reported.mig_devices
        gpu.healthy = True
        gpu.save()
    HostToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return node


def _gpus_mark_gone(gpus: QuerySet[Gpu]) -> None:
    """GPUs their host no longer reports: unhealthy (kept, as reservations point at them), each recorded."""
    for gpu_id, uuid in gpus.filter(healthy=True).values_list("id", "uuid"):
        if Gpu.objects.filter(pk=gpu_id, healthy=True).update(healthy=False):
            audit_record(model=Gpu, object_id=gpu_id, object_repr=uuid, changes={"healthy": [True, False]},
                         additional_data={"reason": "no longer reported by its host"})


def host_heartbeat(*, token: HostToken, now: datetime | None = None) -> Node | None:
    """Note that the host is alive; a host that was marked silent rejoins. None if it never registered."""
    now = now or timezone.now()
    node = token.registered_node()
    if node is None:
        return None
    # Two updates, not one: the audit log records the host coming back, not every heartbeat.
    if Node.objects.filter(pk=node.pk, healthy=False).update(last_seen_at=now, healthy=True):
        audit_record(model=Node, object_id=node.pk, object_repr=str(node), changes={"healthy": [False, True]})
    else:
        Node.objects.filter(pk=node.pk).update(last_seen_at=now)
    HostToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return node


# How stale a live host's last_seen_at may get before its telemetry writes it again: each host sends a batch a
# second, and rewriting 1,250 rows a second would buy nothing against a silence timeout of a minute.
SEEN_RESOLUTION = timedelta(seconds=5)


def hosts_seen(*, node_ids: list[int], now: datetime | None = None) -> None:
    """These hosts' telemetry arrived (on their agents' telemetry socket): they are alive, as a heartbeat says,
    so an agent whose socket is open sends no HTTP heartbeats. A host marked silent rejoins, recorded as a
    heartbeat records it."""
    if not node_ids:
        return
    now = now or timezone.now()
    Node.objects.filter(pk__in=node_ids, healthy=True, last_seen_at__lt=now - SEEN_RESOLUTION).update(last_seen_at=now)
    for node_id, name in Node.objects.filter(pk__in=node_ids, healthy=False).values_list("pk", "name"):
        if Node.objects.filter(pk=node_id, healthy=False).update(last_seen_at=now, healthy=True):
            audit_record(model=Node, object_id=node_id, object_repr=name, changes={"healthy": [False, True]})


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
            audit_record(model=Node, object_id=node_id, object_repr=f"node {node_id}",
                         changes={"healthy": [True, False]}, additional_data={"reason": reason})
            transaction.on_commit(lambda node_id=node_id, reason=reason: node_health_changed.send(
                sender=Node, node_id=node_id, healthy=False, reason=reason))
    return marked


# --- clusters and their credentials ----------------------------------------------------------

def _cluster_credentials(cluster: Cluster, *, kubeconfig: str | None, in_cluster: bool | None) -> None:
    """Check and set the credentials; the kubeconfig is stored encrypted and never read back out here."""
    if in_cluster is not None:
        cluster.in_cluster = in_cluster
    if kubeconfig is not None:
        if kubeconfig == "":
            cluster.kubeconfig_encrypted = ""
        else:
            parse_kubeconfig(kubeconfig)
            cluster.kubeconfig_encrypted = crypto.encrypt(kubeconfig)
    if cluster.kind != Cluster.Kind.KUBERNETES and (cluster.kubeconfig_encrypted or cluster.in_cluster):
        field = "kubeconfig" if cluster.kubeconfig_encrypted else "in_cluster"
        raise ValidationFailed(_("Only Kubernetes clusters take a kubeconfig or in-cluster credentials."),
                               field=field, rule="not_kubernetes")
    if cluster.kubeconfig_encrypted and cluster.in_cluster:
        raise ValidationFailed(_("Give either a kubeconfig or in_cluster: true, not both."), field="kubeconfig",
                               rule="exclusive_with_in_cluster")


def _cluster_save(cluster: Cluster) -> None:
    """Save in a savepoint: two requests for one new name or slug both pass the checks before the
    write, and the second meets the unique index (an IntegrityError, a 500, before this). It gets
    the answer a request after the first would get."""
    try:
        with transaction.atomic():
            cluster.save()
    except IntegrityError:
        taken = Cluster.objects.exclude(pk=cluster.pk)
        field = "slug" if taken.filter(slug=cluster.slug).exists() else "name"
        value = cluster.slug if field == "slug" else cluster.name
        message = (_("A cluster with slug %(value)r already exists.") if field == "slug"
                   else _("A cluster with name %(value)r already exists."))
        raise ValidationFailed(message % {"value": value}, field=field, rule="unique") from None


@transaction.atomic
def cluster_create(*, actor: AbstractBaseUser, name: str, kind: str, slug: str = "", description: str = "",
                   kubeconfig: str | None = None, in_cluster: bool = False, prometheus_auth: dict | None = None,
                   **telemetry: object) -> Cluster:
    if not actor.is_staff:
        raise PermissionDenied(_("Only staff can register clusters."), field="cluster", rule="staff_required")
    slug = slug or slugify(name)[:64]
    if not slug:
        raise ValidationFailed(_("name must contain letters or digits (it makes the slug)."), field="name",
                               rule="invalid")
    if Cluster.objects.filter(slug=slug).exists():
        raise ValidationFailed(_("A cluster with slug %(value)r already exists.") % {"value": slug}, field="slug",
                               rule="unique")
    unknown = sorted(set(telemetry) - set(TELEMETRY_FIELDS))
    if unknown:
        raise ValidationFailed(_("%(field)s is not a cluster field.") % {"field": unknown[0]}, field=unknown[0],
                               rule="unknown_field")
    cluster = Cluster(name=name, slug=slug, kind=kind, description=description, **telemetry)
    _cluster_credentials(cluster, kubeconfig=kubeconfig, in_cluster=in_cluster)
    cluster_telemetry_check(cluster=cluster, prometheus_auth=prometheus_auth)
    _cluster_save(cluster)
    return cluster


@transaction.atomic
def cluster_update(*, actor: AbstractBaseUser, cluster: Cluster, kubeconfig: str | None = None,
                   in_cluster: bool | None = None, prometheus_auth: dict | None = None, **fields: object) -> Cluster:
    """Change a cluster's fields; a kubeconfig given replaces the stored one ("" removes it), and so does
    a Prometheus credential ({} removes it)."""
    if not actor.is_staff:
        raise PermissionDenied(_("Only staff can change clusters."), field="cluster", rule="staff_required")
    for name, value in fields.items():
        if name not in {"name", "slug", "kind", "description", *TELEMETRY_FIELDS}:
            raise ValidationFailed(_("%(field)s cannot be changed.") % {"field": name}, field=name, rule="read_only")
        setattr(cluster, name, value)
    _cluster_credentials(cluster, kubeconfig=kubeconfig, in_cluster=in_cluster)
    cluster_telemetry_check(cluster=cluster, prometheus_auth=prometheus_auth)
    _cluster_save(cluster)
    return cluster


# Where a Kubernetes cluster's live telemetry is read (monitoring.kubernetes reads it).
TELEMETRY_FIELDS = ("telemetry_source", "prometheus_url", "exporter_selector", "exporter_namespace", "exporter_port",
                    "exporter_via_proxy", "telemetry_period_seconds")
MIN_TELEMETRY_PERIOD, MAX_TELEMETRY_PERIOD = 1.0, 300.0


def cluster_telemetry_check(*, cluster: Cluster, prometheus_auth: dict | None = None) -> None:
    """Check the telemetry settings together; a Prometheus credential is stored encrypted, never read back here."""
    if prometheus_auth is not None:
        token, user, password = (prometheus_auth.get(k, "") for k in ("bearer_token", "username", "password"))
        if set(prometheus_auth) - {"bearer_token", "username", "password"}:
            raise ValidationFailed(_("prometheus_auth takes bearer_token, or username and password."),
                                   field="prometheus_auth", rule="unknown_field")
        if token and (user or password):
            raise ValidationFailed(_("Give a bearer token or a username and password, not both."),
                                   field="prometheus_auth", rule="exclusive")
        if bool(user) != bool(password) and not token:
            raise ValidationFailed(_("Basic auth needs both a username and a password."), field="prometheus_auth",
                                   rule="incomplete")
        secret = {"bearer_token": token} if token else {"username": user, "password": password} if user else {}
        cluster.prometheus_auth_encrypted = crypto.encrypt(json.dumps(secret)) if secret else ""
    source = cluster.telemetry_source
    if source not in TelemetrySource.values:
        raise ValidationFailed(_("telemetry_source must be one of %(sources)s.") % {
                                   "sources": ", ".join(TelemetrySource.values)},
                               field="telemetry_source", rule="invalid_choice")
    if source != TelemetrySource.NONE and cluster.kind != Cluster.Kind.KUBERNETES:
        raise ValidationFailed(_("Only Kubernetes clusters take a telemetry source (hosts run the agent)."),
                               field="telemetry_source", rule="not_kubernetes")
    if source == TelemetrySource.PROMETHEUS and not cluster.prometheus_url:
        raise ValidationFailed(_("The prometheus source needs prometheus_url."), field="prometheus_url",
                               rule="required")
    if source == TelemetrySource.EXPORTER and not cluster.has_credentials:
        raise ValidationFailed(_("The exporter source finds the exporter pods through the API server: give a "
                                 "kubeconfig or in_cluster first."), field="telemetry_source", rule="no_credentials")
    if cluster.prometheus_url:
        parts = urlsplit(cluster.prometheus_url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ValidationFailed(_("prometheus_url must be an http:// or https:// URL of the Prometheus server "
                                     "(no query)."), field="prometheus_url", rule="invalid")
    period = cluster.telemetry_period_seconds
    if not isinstance(period, (int, float)) or not MIN_TELEMETRY_PERIOD <= period <= MAX_TELEMETRY_PERIOD:
        raise ValidationFailed(_("telemetry_period_seconds must be from %(low)g to %(high)g.") % {
                                   "low": MIN_TELEMETRY_PERIOD, "high": MAX_TELEMETRY_PERIOD},
                               field="telemetry_period_seconds", rule="range")
    if not 1 <= int(cluster.exporter_port) <= 65535:
        raise ValidationFailed(_("exporter_port must be from 1 to 65535."), field="exporter_port", rule="range")


# --- GPUs --------------------------------------------------------------------------------------

def gpu_move_check(*, gpu: Gpu, fields: dict[str, object]) -> None:
    """Offer a change of the GPU's pool or node (in `fields`) to gpu_moving's receivers, which refuse
    it by raising (allocations: the GPU is booked). Call it in the transaction that saves the change."""
    # The stored row, locked against another move (NO KEY UPDATE: bookings' foreign-key checks on
    # the GPU still pass, so placement, which holds its pool's lock, never waits on this one).
    pool_id, node_id = (Gpu.objects.select_for_update(no_key=True).filter(pk=gpu.pk)
                        .values_list("pool_id", "node_id").get())
    moving = [name for name, stored in (("pool", pool_id), ("node", node_id))
              if name in fields and getattr(fields[name], "pk", None) != stored]
    if moving:
        gpu_moving.send(sender=Gpu, gpu_id=gpu.pk, pool_id=pool_id, fields=moving)


@transaction.atomic
def gpu_update(*, actor: AbstractBaseUser, gpu: Gpu, **fields: object) -> Gpu:
    """Change a GPU's fields (staff). A move to another pool or node is offered to gpu_moving's
    receivers first, which may refuse it (allocations: the GPU is booked)."""
    if not actor.is_staff:
        raise PermissionDenied(_("Only staff can change GPUs."), field="gpu", rule="staff_required")
    gpu_move_check(gpu=gpu, fields=fields)
    for name, value in fields.items():
        setattr(gpu, name, value)
    gpu.save()
    return gpu


# --- Kubernetes discovery -----------------------------------------------------------------------

@dataclass
class DiscoveryReport:
    cluster: str
    nodes: int = 0
    gpus: int = 0
    changes: list[str] | None = None

    def __post_init__(self) -> None:
        self.changes = self.changes or []

    @property
    def changed(self) -> bool:
        return bool(self.changes)


def _send_health_changed(node_id: int, healthy: bool, reason: str) -> None:
    transaction.on_commit(lambda: node_health_changed.send(sender=Node, node_id=node_id, healthy=healthy,
                                                           reason=reason))


@transaction.atomic
def cluster_apply_discovery(*, cluster: Cluster, nodes: list[DiscoveredNode],
                            now: datetime | None = None) -> DiscoveryReport:
    """Make the cluster's Node/Gpu rows match what its API server listed.

    New nodes and GPUs are created (a GPU joins the pool of its cluster and model, made on
    first sight; staff may move it later). Nodes that are no longer listed are kept
    (reservations point at them) but marked unhealthy; GPUs a node no longer reports are
    marked unhealthy. A node whose health changes sends ``node_health_changed`` after commit.
    One transaction, with the cluster row locked, so two discoveries never interleave.
    """
    now = now or timezone.now()
    Cluster.objects.select_for_update().filter(pk=cluster.pk).first()
    report = DiscoveryReport(cluster=cluster.slug)
    changes = report.changes
    existing = {node.name: node for node in Node.objects.select_for_update().filter(cluster=cluster)}
    seen: set[str] = set()
    for found in nodes:
        seen.add(found.name)
        node = existing.get(found.name)
        created = node is None
        if created:
            node = Node(cluster=cluster, name=found.name)
        was_healthy = node.healthy
        node.healthy = found.ready
        node.health_reason = found.health_reason
        node.schedulable = found.schedulable
        node.labels = found.labels
        node.cpu_milli = found.cpu_milli
        node.memory_mib = found.memory_mib
        node.gpu_resources = found.gpu_resources
        node.last_seen_at = now
        node.save()
        if created:
            changes.append(f"new node {found.name} with {len(found.gpus)} GPUs"
                           + ("" if found.ready else f" ({found.health_reason})"))
        elif was_healthy != found.ready:
            changes.append(f"node {found.name} is now {'healthy' if found.ready else 'unhealthy'}: "
                           f"{found.health_reason}")
            _send_health_changed(node.pk, found.ready, found.health_reason)
        report.nodes += 1
        report.gpus += _discovered_gpus(cluster, node, found, changes)
    for name, node in existing.items():
        if name in seen or not node.healthy:
            continue
        reason = "Kubernetes node is no longer listed by the API server"
        node.healthy, node.health_reason = False, reason
        node.save(update_fields=["healthy", "health_reason"])
        changes.append(f"node {name} is gone: marked unhealthy")
        _send_health_changed(node.pk, False, reason)
    Cluster.objects.filter(pk=cluster.pk).update(last_discovered_at=now, discovery_error="")
    return report


def _discovered_gpus(cluster: Cluster, node: Node, found: DiscoveredNode, changes: list[str]) -> int:
    uuids = [gpu.uuid for gpu in found.gpus]
    known = {gpu.uuid: gpu for gpu in node.gpus.all()}
    elsewhere = set(Gpu.objects.filter(uuid__in=uuids).exclude(node=node).values_list("uuid", flat=True))
    gone = node.gpus.exclude(uuid__in=uuids).filter(healthy=True)
    for uuid in gone.values_list("uuid", flat=True):
        changes.append(f"GPU {uuid} is no longer reported by node {node.name}: marked unhealthy")
    _gpus_mark_gone(gone)
    count = 0
    for reported in found.gpus:
        if reported.uuid in elsewhere:
            changes.append(f"GPU {reported.uuid} of node {node.name} is already registered on another node; skipped")
            continue
        gpu = known.get(reported.uuid)
        if gpu is None:
            gpu = Gpu(node=node, uuid=reported.uuid, pool=pool_for_model(cluster, reported.model_name))
            changes.append(f"new GPU {reported.uuid} ({reported.model_name}) on node {node.name} "
                           f"in pool {gpu.pool.slug}")
        elif not gpu.healthy:
            changes.append(f"GPU {reported.uuid} on node {node.name} is reported again")
        fields = {"index": reported.index, "model_name": reported.model_name, "memory_mib": reported.memory_mib,
                  "mig_capable": reported.mig_capable, "driver_version": reported.driver_version,
                  "cuda_version": reported.cuda_version, "healthy": True}
        if gpu.pk is None or any(getattr(gpu, k) != v for k, v in fields.items()):
            for key, value in fields.items():
                setattr(gpu, key, value)
            gpu.save()
        count += 1
    return count


def cluster_record_discovery_error(*, cluster: Cluster, error: str) -> None:
    Cluster.objects.filter(pk=cluster.pk).update(discovery_error=error[:2000])


# GpuModel.weight is DECIMAL(6, 3): up to 999.999, in thousandths.
WEIGHT_PLACES = 3
WEIGHT_MAX = Decimal("999.999")


def gpu_model_weight_check(weight: object) -> Decimal:
    """`weight` as the Decimal a GpuModel stores, or a ValidationFailed naming `weight` and the rule:
    a number (not a boolean, NaN or infinity), greater than 0, at most three decimal places (a finer
    one would be rounded, 0.0004 to 0) and at most WEIGHT_MAX."""
    try:
        if isinstance(weight, bool):
            raise InvalidOperation
        value = Decimal(str(weight).strip()) if isinstance(weight, (str, int, float, Decimal)) else None
        if value is None or not value.is_finite():
            raise InvalidOperation
    except InvalidOperation:
        raise ValidationFailed(_("weight must be a number."), field="weight", rule="invalid") from None
    if value <= 0:
        raise ValidationFailed(_("weight must be greater than 0."), field="weight", rule="positive")
    if value > WEIGHT_MAX:
        raise ValidationFailed(_("weight must be at most %(max)s.") % {"max": WEIGHT_MAX}, field="weight",
                               rule="max_value")
    step = Decimal(1).scaleb(-WEIGHT_PLACES)
    if value != value.quantize(step):
        raise ValidationFailed(_("weight takes at most %(places)d decimal places.") % {"places": WEIGHT_PLACES},
                               field="weight", rule="max_decimal_places")
    return value.quantize(step)


@transaction.atomic
def gpu_model_weight_set(*, actor: AbstractBaseUser, name: str, weight: object) -> GpuModel:
    """Set what one whole GPU of the model `name` counts in GPU-equivalents, creating its GpuModel
    row on first use, and record the change (who, when, old, new). Only new bookings and checks see
    it: a grant keeps the GE it was charged. The model must be one the inventory holds (or one that
    already has a row), so a mistyped name is refused rather than weighed."""
    if not actor.is_staff:
        raise PermissionDenied(_("Only staff can set GPU model weights."), field="weight", rule="staff_required")
    if not name or len(name) > 128 or "\x00" in name:
        raise ValidationFailed(_("name must be 1 to 128 characters, without NUL."), field="name", rule="invalid")
    value = gpu_model_weight_check(weight)
    row = GpuModel.objects.select_for_update().filter(name=name).first()
    if row is None:
        if not Gpu.objects.filter(model_name=name).exists():
            raise NotFound(_("No GPU of model %(name)r is in the inventory.") % {"name": name}, field="name",
                           rule="does_not_exist")
        try:
            # A savepoint: two first weighings of one model at once both find no row; the second
            # INSERT meets the unique index and then reads (and locks) the row the first one made.
            with transaction.atomic():
                row = GpuModel.objects.create(name=name, weight=value)
            old = DEFAULT_GPU_MODEL_WEIGHT
        except IntegrityError:
            row = GpuModel.objects.select_for_update().get(name=name)
            old = row.weight
    else:
        old = row.weight
    if row.weight != value:
        row.weight = value
        row.save(update_fields=["weight", "updated_at"])
    if old != value:
        GpuModelWeightChange.objects.create(name=name, old_weight=old, new_weight=value,
                                            actor=actor if actor.is_authenticated else None)
    return row
