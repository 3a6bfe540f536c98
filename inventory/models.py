"""What the fleet has: clusters, their nodes (Kubernetes nodes or bare-metal hosts), the
GPUs on each node, and the pools that group GPUs under one sharing mode."""
from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.utils.translation import gettext_lazy as _

from inventory.sharing import SharingMode, validate_sharing_config


class TelemetrySource(models.TextChoices):
    NONE = "none", _("None")
    PROMETHEUS = "prometheus", _("Prometheus")
    EXPORTER = "exporter", _("DCGM exporter")


class Cluster(models.Model):
    class Kind(models.TextChoices):
        KUBERNETES = "kubernetes", _("Kubernetes")
        BAREMETAL = "baremetal", _("Bare metal")

    name = models.CharField(_("name"), max_length=128, unique=True)
    slug = models.SlugField(_("slug"), max_length=64, unique=True)
    kind = models.CharField(_("kind"), max_length=16, choices=Kind.choices)
    description = models.TextField(_("description"), blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    # Kubernetes only: the kubeconfig, Fernet-encrypted (common.crypto); never
    # shown back. Or in_cluster: the portal's own service account (it runs in that cluster).
    kubeconfig_encrypted = models.TextField(_("kubeconfig (encrypted)"), blank=True, editable=False)
    in_cluster = models.BooleanField(_("in-cluster credentials"), default=False,
                                     help_text=_("Use the portal's in-cluster service account"))
    last_discovered_at = models.DateTimeField(_("last discovered at"), null=True, blank=True, editable=False)
    discovery_error = models.TextField(_("discovery error"), blank=True, editable=False,
                                       help_text=_("Why the last discovery failed"))
    # Kubernetes only: where the portal reads its GPUs' live telemetry (monitoring.kubernetes). Agents
    # report bare-metal hosts themselves; a Kubernetes node runs NVIDIA's DCGM exporter instead.
    telemetry_source = models.CharField(_("telemetry source"), max_length=16, choices=TelemetrySource.choices,
                                        default=TelemetrySource.NONE,
                                        help_text=_("none, prometheus (the cluster's Prometheus HTTP API) or "
                                                    "exporter (the portal scrapes the dcgm-exporter pods itself)"))
    # A CharField checked by inventory.services (http/https and a host): in-cluster service names such as
    # http://prometheus-server:9090 have no dot, which Django's URL validator refuses.
    prometheus_url = models.CharField(verbose_name=_("Prometheus URL"), max_length=500, blank=True,
                                      help_text=_("The cluster's Prometheus, e.g. http://prometheus.monitoring:9090"))
    # {"bearer_token": ...} or {"username": ..., "password": ...} as JSON, Fernet-encrypted like the
    # kubeconfig (common.crypto); never shown back.
    prometheus_auth_encrypted = models.TextField(_("Prometheus credentials (encrypted)"), blank=True, editable=False)
    exporter_selector = models.CharField(_("exporter selector"), max_length=253,
                                         default="app=nvidia-dcgm-exporter",
                                         help_text=_("Label selector of the dcgm-exporter pods (exporter source)"))
    exporter_namespace = models.CharField(_("exporter namespace"), max_length=63, blank=True,
                                          help_text=_("Namespace of the dcgm-exporter pods (empty: every namespace)"))
    exporter_port = models.PositiveIntegerField(_("exporter port"), default=9400,
                                                help_text=_("The exporter's metrics port"))
    exporter_via_proxy = models.BooleanField(
        _("exporter via proxy"), default=False,
        help_text=_("Read the exporter through the API server's pod proxy instead of the pods' addresses"))
    telemetry_period_seconds = models.FloatField(_("telemetry period (s)"), default=5.0,
                                                 help_text=_("How often the portal reads (1 to 300 s)"))

    class Meta:
        ordering = ["slug"]
        verbose_name = _("cluster")
        verbose_name_plural = _("clusters")

    def __str__(self) -> str:
        return self.name

    @property
    def has_credentials(self) -> bool:
        return bool(self.kubeconfig_encrypted) or self.in_cluster

    @property
    def has_prometheus_auth(self) -> bool:
        return bool(self.prometheus_auth_encrypted)


class Node(models.Model):
    """A Kubernetes node or a bare-metal host. Unhealthy or unschedulable nodes get no new placements."""

    cluster = models.ForeignKey(Cluster, verbose_name=_("cluster"), on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(_("name"), max_length=253)
    healthy = models.BooleanField(_("healthy"), default=True)
    health_reason = models.CharField(_("health reason"), max_length=255, blank=True,
                                     help_text=_("Why the node is (un)healthy"))
    schedulable = models.BooleanField(_("schedulable"), default=True)
    labels = models.JSONField(_("labels"), default=dict, blank=True)
    # Kubernetes nodes: {"capacity": {...}, "allocatable": {...}} of the GPU resources
    # (nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-*, HAMi's gpumem/gpucores).
    gpu_resources = models.JSONField(verbose_name=_("GPU resources"), default=dict, blank=True)
    cpu_milli = models.PositiveIntegerField(verbose_name=_("CPU (millicores)"),
                                            default=0, help_text=_("CPU capacity in millicores (0 = unknown)"))
    memory_mib = models.PositiveIntegerField(verbose_name=_("memory (MiB)"),
                                             default=0, help_text=_("Memory capacity in MiB (0 = unknown)"))
    last_seen_at = models.DateTimeField(_("last seen at"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    class Meta:
        ordering = ["cluster__slug", "name"]
        verbose_name = _("node")
        verbose_name_plural = _("nodes")
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="node_name_unique_in_cluster")]

    def __str__(self) -> str:
        return f"{self.cluster.slug}/{self.name}"

    def clean(self) -> None:
        if not isinstance(self.labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.labels.items()
        ):
            raise ValidationError({"labels": _("Labels must be an object of string keys to string values.")})


class GpuPool(models.Model):
    """A set of GPUs shared one way (exactly one sharing mode), with a placement policy."""

    name = models.CharField(_("name"), max_length=128, unique=True)
    slug = models.SlugField(_("slug"), max_length=64, unique=True)
    description = models.TextField(_("description"), blank=True)
    sharing_mode = models.CharField(_("sharing mode"), max_length=16, choices=SharingMode.choices,
                                    default=SharingMode.EXCLUSIVE)
    sharing_config = models.JSONField(
        _("sharing config"), default=dict, blank=True,
        help_text=_("The mode's parameters, e.g. {\"replicas\": 4} or {\"mig_layout\": ...}")
    )
    placement_policy = models.CharField(
        _("placement policy"), max_length=32, default="portal",
        help_text=_("Placement engine policy: portal (default), fgd, best_fit, first_fit, spread, packing, "
                    "dot_product, clustering or random"),
    )
    # The pool's queue (allocations.queue): whether a request that does not fit now may wait, in
    # which order waiting requests are tried, and whether a later one may start first when that
    # delays no request ahead of it (backfill).
    queueing = models.BooleanField(_("queueing"), default=True,
                                   help_text=_("Requests that do not fit now wait in the pool's queue"))
    queue_ordering = models.CharField(
        _("queue ordering"), max_length=16,
        choices=[("fcfs", _("First come, first served")), ("sjf", _("Shortest first")),
                 ("priority", _("Priority")), ("fairshare", _("Fair share"))], default="fcfs",
        help_text=_("In which order waiting requests are tried"))
    backfill = models.BooleanField(
        _("backfill"), default=True,
        help_text=_("A later request may start now if that delays no request ahead of it"))
    borrowing = models.BooleanField(
        _("borrowing"), default=False,
        help_text=_("A team may start a booking beyond its quota on idle GPUs; what is beyond its quota is borrowed "
                    "and may be reclaimed, after a notice, for a request within quota"))
    # Idle reclaim (monitoring.idle): opt-in per pool. A running reservation whose GPUs all sat idle for
    # idle_warn_minutes is warned; still idle idle_release_minutes after the warning, it is released.
    idle_reclaim = models.BooleanField(
        _("idle reclaim"), default=False,
        help_text=_("Warn, then release, running reservations whose GPUs all sit idle"))
    idle_warn_minutes = models.PositiveIntegerField(
        _("idle minutes before the warning"), default=60, validators=[MinValueValidator(1)],
        help_text=_("How long all of a reservation's GPUs must be idle before its holders are warned"))
    idle_release_minutes = models.PositiveIntegerField(
        _("minutes from the warning to the release"), default=60, validators=[MinValueValidator(1)],
        help_text=_("How long after the warning a reservation still idle is released"))
    idle_keep_allowance = models.PositiveSmallIntegerField(
        _("keep allowance"), default=1,
        help_text=_("How many running reservations of one team may be marked keep at once in this pool"))
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    class Meta:
        verbose_name = _("GPU pool")
        verbose_name_plural = _("GPU pools")
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        errors = validate_sharing_config(self.sharing_mode, self.sharing_config)
        if errors:
            raise ValidationError({"sharing_config": errors})


class GpuQuerySet(models.QuerySet):
    # What a new booking may use: a healthy GPU on a healthy, schedulable node (placement's
    # SQL in allocations.booking.pool_snapshot spells the same test).
    USABLE = models.Q(healthy=True, node__healthy=True, node__schedulable=True)

    def usable(self) -> GpuQuerySet:
        return self.filter(self.USABLE)

    def unusable(self) -> GpuQuerySet:
        return self.exclude(self.USABLE)


class Gpu(models.Model):
    node = models.ForeignKey(Node, verbose_name=_("node"), on_delete=models.CASCADE, related_name="gpus")
    pool = models.ForeignKey(GpuPool, verbose_name=_("pool"), on_delete=models.SET_NULL, null=True, blank=True,
                             related_name="gpus")
    index = models.PositiveSmallIntegerField(_("index"))
    uuid = models.CharField(verbose_name=_("UUID"), max_length=64, unique=True)
    model_name = models.CharField(_("model name"), max_length=128)
    memory_mib = models.PositiveIntegerField(verbose_name=_("memory (MiB)"))
    mig_capable = models.BooleanField(verbose_name=_("MIG capable"), default=False)
    driver_version = models.CharField(_("driver version"), max_length=32, blank=True)
    cuda_version = models.CharField(_("CUDA version"), max_length=16, blank=True)
    healthy = models.BooleanField(_("healthy"), default=True)
    # What NVML (a host's agent) or the GPU feature discovery labels (Kubernetes) say the card is
    # carved into now: [{"uuid": "MIG-…", "profile": "1g.10gb", "start": 0}, ...]. A MIG grant is
    # named by the device UUID found here for its profile and start slice.
    mig_devices = models.JSONField(verbose_name=_("MIG instances"), default=list, blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    objects = GpuQuerySet.as_manager()

    class Meta:
        ordering = ["node_id", "index"]
        verbose_name = _("GPU")
        verbose_name_plural = _("GPUs")
        # No uniqueness on (node, index): NVML may renumber cards across reboots; the UUID is the identity.

    def __str__(self) -> str:
        return f"{self.node} GPU {self.index} ({self.model_name})"


#: What a GPU model without a GpuModel row weighs.
DEFAULT_GPU_MODEL_WEIGHT = Decimal("1.000")


class GpuModel(models.Model):
    """A GPU model's weight in GPU-equivalents (GE): what one whole card of it counts against quotas.

    `name` is the model name as inventory reports it (Gpu.model_name). A model without a row
    weighs 1.0. A change applies to new bookings and checks only: a grant keeps the GE it was
    charged when it was made."""

    name = models.CharField(_("name"), max_length=128, unique=True)
    weight = models.DecimalField(_("weight"), max_digits=6, decimal_places=3, default=1,
                                 help_text=_("GPU-equivalents one whole GPU of this model counts as (> 0)"))
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = _("GPU model")
        verbose_name_plural = _("GPU models")
        constraints = [models.CheckConstraint(condition=models.Q(weight__gt=0), name="gpu_model_weight_positive")]

    def __str__(self) -> str:
        return _("%(name)s (weight %(weight)s)") % {"name": self.name, "weight": self.weight}


class GpuModelWeightChange(models.Model):
    """One change of a GPU model's weight: who set it, when, from what to what. Kept by model name, not
    a key to the GpuModel row, so the record outlives the row (a model without a row weighs 1.0, and
    `old_weight` of a model's first change is that 1.0)."""

    name = models.CharField(_("name"), max_length=128, db_index=True,
                            help_text=_("The GPU model (Gpu.model_name)"))
    old_weight = models.DecimalField(_("old weight"), max_digits=6, decimal_places=3)
    new_weight = models.DecimalField(_("new weight"), max_digits=6, decimal_places=3)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, verbose_name=_("actor"), on_delete=models.SET_NULL,
                              null=True, blank=True, related_name="+",
                              help_text=_("Who changed it (empty once the account is deleted)"))
    at = models.DateTimeField(_("at"), auto_now_add=True)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name = _("GPU model weight change")
        verbose_name_plural = _("GPU model weight changes")

    def __str__(self) -> str:
        return f"{self.name}: {self.old_weight} → {self.new_weight}"


class HostToken(models.Model):
    """The credential of one bare-metal host's agent. Only a hash is stored; the key is shown once.

    The token names the host (cluster + host name): an agent holding it can register and
    report that host and nothing else.
    """

    cluster = models.ForeignKey(Cluster, verbose_name=_("cluster"), on_delete=models.CASCADE,
                                related_name="host_tokens")
    host_name = models.CharField(_("host name"), max_length=253)
    key_hash = models.CharField(_("key hash"), max_length=64, unique=True, editable=False)
    prefix = models.CharField(_("prefix"), max_length=8, editable=False,
                              help_text=_("First characters of the key, to tell keys apart"))
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, verbose_name=_("created by"), on_delete=models.SET_NULL,
                                   null=True, blank=True, editable=False)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    last_used_at = models.DateTimeField(_("last used at"), null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(_("revoked at"), null=True, blank=True)

    class Meta:
        ordering = ["cluster__slug", "host_name", "-created_at"]
        verbose_name = _("host token")
        verbose_name_plural = _("host tokens")

    def __str__(self) -> str:
        return f"{self.cluster.slug}/{self.host_name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    def registered_node(self) -> Node | None:
        """The node this token's host registered as; None until its agent has registered."""
        return Node.objects.filter(cluster_id=self.cluster_id, name=self.host_name).first()
