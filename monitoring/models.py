"""Telemetry history (raw → 1 min → 1 h) and alerting (rules, alerts, silences).

Times in the history tables are integer epoch seconds (UTC): bucketing is integer
arithmetic that PostgreSQL and SQLite do the same way, rows stay narrow, and Plotly
takes them as milliseconds with one multiplication. The GPU and pool columns are plain
ids without foreign-key constraints on purpose: 10,000 inserts a second must not pay a
constraint check each, and history outlives a GPU that is deleted from the inventory.
"""
from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import models
from django.utils.translation import gettext, gettext_noop
from django.utils.translation import gettext_lazy as _

from inventory.models import Cluster, GpuPool, Node
from teams.models import Team


class Sample(models.Model):
    """One GPU at one second, as its agent reported it (kept TELEMETRY_RAW_RETENTION).

    UNLOGGED on PostgreSQL (migration 0003): emptied by a database crash, never by a restart."""

    # (gpu, ts) is the key: the dedup rule (a resent batch inserts nothing twice) and the read
    # path (a pool's history is an index range scan per GPU). No id column: at 10,000 rows a
    # second its sequence and index were a third of PostgreSQL's CPU per insert (migration 0004).
    # Pruning by ts uses a BRIN index on PostgreSQL (migration 0002): tiny, and raw rows arrive
    # in ts order.
    pk = models.CompositePrimaryKey("gpu_id", "ts")
    gpu_id = models.BigIntegerField()
    pool_id = models.BigIntegerField(null=True)
    ts = models.BigIntegerField(help_text=_("epoch seconds (UTC)"))
    util = models.SmallIntegerField()
    mem_util = models.SmallIntegerField()
    mem_used = models.IntegerField(help_text=_("MiB"))
    mem_total = models.IntegerField(help_text=_("MiB"))
    temp = models.SmallIntegerField(help_text=_("°C"))
    power = models.FloatField(help_text=_("W"))
    # Health figures, null where the source does not report them (monitoring.ingest.HEALTH_FIELDS).
    sm_clock = models.SmallIntegerField(null=True, help_text=_("SM clock, MHz"))
    ecc_corrected = models.IntegerField(null=True, help_text=_("volatile corrected ECC errors since the driver loaded"))
    ecc_uncorrected = models.IntegerField(null=True, help_text=_("volatile uncorrected ECC errors since the driver loaded"))
    xid = models.SmallIntegerField(null=True, help_text=_("the last XID error's code"))

    class Meta:
        verbose_name = _("telemetry sample")


class Rollup(models.Model):
    """Aggregates of one GPU over one bucket: n samples, avg and max of each metric."""

    gpu_id = models.BigIntegerField()
    pool_id = models.BigIntegerField(null=True)
    bucket = models.BigIntegerField(help_text=_("start of the bucket, epoch seconds (UTC)"))
    n = models.IntegerField()
    util_avg = models.FloatField()
    util_max = models.SmallIntegerField()
    mem_util_avg = models.FloatField()
    mem_util_max = models.SmallIntegerField()
    mem_used_avg = models.FloatField()
    mem_used_max = models.IntegerField()
    mem_total = models.IntegerField()
    temp_avg = models.FloatField()
    temp_max = models.SmallIntegerField()
    power_avg = models.FloatField()
    power_max = models.FloatField()
    # Over the samples that had them (null: none did). ECC counts only grow while the driver stays loaded,
    # so the bucket's max is its last count; an XID code is not a quantity, and stays in raw history only.
    sm_clock_avg = models.FloatField(null=True)
    sm_clock_max = models.SmallIntegerField(null=True)
    ecc_corrected_max = models.IntegerField(null=True)
    ecc_uncorrected_max = models.IntegerField(null=True)

    class Meta:
        abstract = True


class MinuteRollup(Rollup):
    class Meta:
        verbose_name = _("minute rollup")
        constraints = [models.UniqueConstraint(fields=["gpu_id", "bucket"], name="minute_rollup_one_per_gpu")]
        indexes = [models.Index(fields=["bucket"], name="minute_rollup_bucket")]


class HourRollup(Rollup):
    class Meta:
        verbose_name = _("hour rollup")
        constraints = [models.UniqueConstraint(fields=["gpu_id", "bucket"], name="hour_rollup_one_per_gpu")]
        indexes = [models.Index(fields=["bucket"], name="hour_rollup_bucket")]


class RollupMark(models.Model):
    """How far a rollup level is done: buckets before `done_until` are rolled up (late samples mark theirs dirty)."""

    level = models.CharField(max_length=16, unique=True)
    done_until = models.BigIntegerField()

    class Meta:
        verbose_name = _("rollup mark")


# --- alerts -----------------------------------------------------------------------------

class Metric(models.TextChoices):
    GPU_UTIL = "gpu_util", _("GPU utilization (%)")
    GPU_MEMORY = "gpu_memory", _("GPU memory used (%)")
    GPU_TEMPERATURE = "gpu_temperature", _("GPU temperature (°C)")
    GPU_POWER = "gpu_power", _("GPU power (W)")
    GPU_IDLE_ALLOCATED = "gpu_idle_allocated", _("Utilization of an allocated GPU (%)")
    HOST_SILENT = "host_silent", _("Seconds since the host last reported")
    POOL_ALLOCATION = "pool_allocation", _("Pool GPUs allocated (%)")
    # xgettext:no-python-format
    SHARE_MEMORY = "share_memory", _("GPU memory a holder uses, % of its share")
    TELEMETRY_SILENT = "telemetry_silent", _("Seconds since a Kubernetes cluster's telemetry was last read")
    GPU_UNLEASED = "gpu_unleased", _("Pods on a Kubernetes GPU without their team's reservation on it")


class Scope(models.TextChoices):
    GPU = "gpu", _("GPU")
    NODE = "node", _("Node")
    POOL = "pool", _("Pool")
    TEAM = "team", _("Team")
    CLUSTER = "cluster", _("Cluster")


# Which scopes each metric can be evaluated at. GPU metrics at node, pool or team scope
# are the average over the GPUs of that node / pool / team (a team's = those it holds now).
METRIC_SCOPES = {
    Metric.GPU_UTIL: {Scope.GPU, Scope.NODE, Scope.POOL, Scope.TEAM},
    Metric.GPU_MEMORY: {Scope.GPU, Scope.NODE, Scope.POOL, Scope.TEAM},
    Metric.GPU_TEMPERATURE: {Scope.GPU, Scope.NODE, Scope.POOL},
    Metric.GPU_POWER: {Scope.GPU, Scope.NODE, Scope.POOL},
    Metric.GPU_IDLE_ALLOCATED: {Scope.GPU},
    Metric.HOST_SILENT: {Scope.NODE},
    Metric.POOL_ALLOCATION: {Scope.POOL},
    # Per share: one reservation's part of one GPU or MIG instance (its subject names both).
    Metric.SHARE_MEMORY: {Scope.GPU},
    Metric.TELEMETRY_SILENT: {Scope.CLUSTER},
    # Per GPU and namespace: a workload of that namespace on a GPU its team holds no share of.
    Metric.GPU_UNLEASED: {Scope.GPU},
}


class Comparison(models.TextChoices):
    GE = ">=", "≥"
    GT = ">", ">"
    LE = "<=", "≤"
    LT = "<", "<"


class Severity(models.TextChoices):
    INFO = "info", _("Info")
    WARNING = "warning", _("Warning")
    CRITICAL = "critical", _("Critical")


# The names of the rules the portal ships (migrations 0002, 0006, 0007): stored in English, the rows'
# identity for the API and the admin, and shown to people translated (AlertRule.display_name).
DEFAULT_RULE_NAMES = {
    gettext_noop("GPU overloaded"), gettext_noop("GPU memory nearly full"), gettext_noop("GPU too hot"),
    gettext_noop("Host stopped reporting"), gettext_noop("Pool capacity pressure"),
    gettext_noop("GPU allocated but idle"), gettext_noop("GPU share memory exceeded"),
    gettext_noop("Kubernetes telemetry silent"), gettext_noop("Kubernetes GPU busy without a reservation"),
}


class AlertRule(models.Model):
    name = models.CharField(max_length=128, unique=True)
    metric = models.CharField(max_length=32, choices=Metric.choices)
    scope = models.CharField(max_length=8, choices=Scope.choices)
    pool = models.ForeignKey(GpuPool, on_delete=models.CASCADE, null=True, blank=True, related_name="alert_rules",
                             help_text=_("Only subjects in this pool (empty: every pool)"))
    comparison = models.CharField(max_length=2, choices=Comparison.choices, default=Comparison.GE)
    threshold = models.FloatField()
    for_seconds = models.PositiveIntegerField(verbose_name=_("for (seconds)"), default=300,
                                              help_text=_("How long the condition must hold before firing"))
    repeat_seconds = models.PositiveIntegerField(verbose_name=_("repeat after (seconds)"), default=4 * 3600,
                                                 help_text=_("Mail again while it keeps firing this long (0: never)"))
    severity = models.CharField(max_length=16, choices=Severity.choices, default=Severity.WARNING)
    notify_team_managers = models.BooleanField(default=True, help_text=_("Managers of the team concerned"))
    notify_team_members = models.BooleanField(default=False, help_text=_("Every member of the team concerned"))
    notify_staff = models.BooleanField(default=False)
    extra_emails = models.TextField(blank=True, help_text=_("More addresses, comma-separated"))
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = _("alert rule")
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def display_name(self) -> str:
        """The name as people read it: a rule the portal ships (DEFAULT_RULE_NAMES) in the reader's
        language, one staff named as they named it."""
        return gettext(self.name) if self.name in DEFAULT_RULE_NAMES else self.name

    def clean(self) -> None:
        if self.metric in METRIC_SCOPES and self.scope not in METRIC_SCOPES[self.metric]:
            allowed = ", ".join(sorted(METRIC_SCOPES[self.metric]))
            raise ValidationError({"scope": _("%(metric)s is measured at scope %(allowed)s.")
                                   % {"metric": self.metric, "allowed": allowed}})
        for address in self.extra_email_list():
            try:
                validate_email(address)
            except ValidationError:
                raise ValidationError({"extra_emails": _("%(address)r is not an email address.")
                                       % {"address": address}}) from None

    def extra_email_list(self) -> list[str]:
        return [a.strip() for a in self.extra_emails.split(",") if a.strip()]

    def holds(self, value: float) -> bool:
        return {">=": value >= self.threshold, ">": value > self.threshold,
                "<=": value <= self.threshold, "<": value < self.threshold}[self.comparison]


class Alert(models.Model):
    """One rule about one subject (a GPU, node, pool or team): pending → firing → resolved.

    At most one open (pending or firing) alert per rule and subject: the dedup rule, held
    by a partial unique constraint. Resolved ones stay as history.
    """

    class State(models.TextChoices):
        PENDING = "pending", _("Pending")
        FIRING = "firing", _("Firing")
        RESOLVED = "resolved", _("Resolved")

    OPEN_STATES = (State.PENDING, State.FIRING)

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="alerts")
    subject = models.CharField(max_length=64, help_text=_("gpu:<id>, node:<id>, pool:<id>, team:<id> or "
                                                          "share:<reservation id>:gpu:<id>[:mig:<start>]"))
    subject_label = models.CharField(max_length=255)
    pool = models.ForeignKey(GpuPool, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    node = models.ForeignKey(Node, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    team = models.ForeignKey(Team, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    value = models.FloatField()
    active_since = models.DateTimeField(help_text=_("When the condition started to hold"))
    fired_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    last_notified_at = models.DateTimeField(null=True, blank=True)
    notified_firing = models.BooleanField(default=False, help_text=_("A firing mail went out (so a resolved one will)"))
    notifications = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = _("alert")
        ordering = ["-active_since", "-id"]
        constraints = [models.UniqueConstraint(fields=["rule", "subject"], condition=models.Q(state__in=["pending", "firing"]),
                                               name="one_open_alert_per_rule_and_subject")]
        indexes = [models.Index(fields=["state", "rule"], name="alert_state_rule")]

    def __str__(self) -> str:
        return f"{self.rule.name} on {self.subject_label} ({self.state})"


class Silence(models.Model):
    """Mutes notifications of matching alerts until `ends_at` (state is still tracked)."""

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, null=True, blank=True, related_name="silences",
                             help_text=_("Empty: every rule"))
    subject = models.CharField(max_length=64, blank=True, help_text=_("e.g. gpu:42 or pool:3; empty: every subject"))
    pool = models.ForeignKey(GpuPool, on_delete=models.CASCADE, null=True, blank=True, related_name="+",
                             help_text=_("Only alerts in this pool"))
    comment = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()

    class Meta:
        verbose_name = _("silence")
        ordering = ["-ends_at"]

    def __str__(self) -> str:
        return gettext("silence %(rule)s %(subject)s until %(ends)s") % {
            "rule": self.rule or gettext("all rules"), "subject": self.subject or "",
            "ends": f"{self.ends_at:%Y-%m-%d %H:%M}"}

    def clean(self) -> None:
        if self.ends_at and self.starts_at and self.ends_at <= self.starts_at:
            raise ValidationError({"ends_at": _("A silence must end after it starts.")})

    def matches(self, alert: Alert) -> bool:
        return ((self.rule_id is None or self.rule_id == alert.rule_id)
                and (not self.subject or self.subject == alert.subject)
                and (self.pool_id is None or self.pool_id == alert.pool_id))


class ClusterTelemetry(models.Model):
    """How the portal's reads of one Kubernetes cluster's telemetry go (monitoring.kubernetes): one row per
    cluster with a telemetry source, written after every read. What staff see on the cluster's status."""

    cluster = models.OneToOneField(Cluster, on_delete=models.CASCADE, related_name="telemetry")
    source = models.CharField(max_length=16, help_text=_("The source of the last read"))
    since = models.DateTimeField(help_text=_("When the portal started reading this cluster (silence counts from here "
                                             "until a first read succeeds)"))
    next_read_at = models.DateTimeField(help_text=_("The next read is due then (claimed by a conditional update)"))
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    read_seconds = models.FloatField(verbose_name=_("read took (seconds)"), null=True, blank=True,
                                     help_text=_("How long the last successful read took"))
    lag_seconds = models.FloatField(verbose_name=_("lag (seconds)"), null=True, blank=True,
                                    help_text=_("Age of the newest samples at the last read (median over GPUs)"))
    sample_period_seconds = models.FloatField(verbose_name=_("sample period (seconds)"), null=True, blank=True,
                                              help_text=_("How far apart a GPU's samples really are (median)"))
    series_read = models.PositiveIntegerField(default=0)
    gpus_read = models.PositiveIntegerField(verbose_name=_("GPUs read"),
                                            default=0, help_text=_("GPUs with a sample in the last read"))
    samples_ingested = models.PositiveIntegerField(default=0, help_text=_("New samples the last read stored"))
    unknown_gpus = models.PositiveIntegerField(verbose_name=_("unknown GPUs"),
                                               default=0, help_text=_("GPUs the source reports that the inventory lacks"))
    unknown_examples = models.JSONField(default=list, blank=True, help_text=_("Some of them: [{uuid, hostname}]"))
    unleased = models.JSONField(default=list, blank=True,
                                help_text=_("Pods on GPUs their team holds no share of: [{gpu, uuid, node, namespace, "
                                            "pod, container, team}]"))
    error = models.TextField(blank=True, help_text=_("Why the last read failed (empty: it succeeded)"))
    errors_total = models.PositiveIntegerField(default=0)

    class Meta:
        verbose_name = _("cluster telemetry")
        verbose_name_plural = _("cluster telemetry")

    def __str__(self) -> str:
        return f"telemetry of {self.cluster}"
