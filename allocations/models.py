"""Quotas, reservations, the GPUs each reservation holds, and the history of every change.

Occupancy is read from Allocation windows alone: a GPU is busy at time t when one of
its allocations has starts_at <= t < ends_at. Releasing or failing a reservation cuts its
allocations' ends_at back, so the rows stay as history and never block anyone. On
PostgreSQL an exclusion constraint makes overlapping windows on one GPU impossible even
if the application had a bug (migration 0002).
"""
from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q
from django.utils.translation import gettext_lazy as _

from allocations import units
from allocations.messages import StoredTextField
from inventory.models import Gpu, GpuPool
from teams.models import Team


class PriorityClass(models.Model):
    """A named priority staff define (e.g. high 100, normal 50, low 10). A quota grants one; a request may
    ask for its quota's class or a lower one. The pool's queue (ordering `priority`) tries higher values first."""

    name = models.SlugField(max_length=32, unique=True)
    value = models.IntegerField(validators=[MinValueValidator(-1000), MaxValueValidator(1000)],
                                help_text=_("Higher goes first; -1000 to 1000"))
    description = models.CharField(max_length=200, blank=True)
    # Run:ai and KAI mark some priorities preemptible; here staff say it per class. A booking of such a class
    # is within its quota but not guaranteed: a request of a higher class, within its own team's quota, may
    # take it back after a notice (allocations/reclaim.py).
    preemptible = models.BooleanField(
        default=False, db_default=False,
        help_text=_("Its bookings may be taken back, after a notice, for a request of a higher class within its "
                    "team's quota"))

    class Meta:
        verbose_name = _("priority class")
        verbose_name_plural = _("priority classes")
        ordering = ["-value", "name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.value})"


class Quota(models.Model):
    """What a team may hold in a pool, in GPU-equivalents (GE, allocations.units): a whole GPU of a
    model of weight 1.0 is 1 GE, a 3g MIG slice 3/7 of its model's weight, k of N shares k/N."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="quotas")
    pool = models.ForeignKey(GpuPool, on_delete=models.CASCADE, related_name="quotas")
    max_ge = models.DecimalField(verbose_name=_("max GE"),
                                 max_digits=8, decimal_places=2, validators=[MinValueValidator(0)],
                                 help_text=_("Most GPU-equivalents the team may hold in this pool at any moment"))
    ge_hours_per_month = models.DecimalField(
        verbose_name=_("GE-hours per month"), max_digits=10, decimal_places=1, null=True, blank=True,
        validators=[MinValueValidator(0)],
        help_text=_("GE-hours the team may book per calendar month (UTC); empty = no limit"))
    max_borrow_ge = models.DecimalField(
        verbose_name=_("max borrowed GE"), max_digits=8, decimal_places=2, null=True, blank=True,
        validators=[MinValueValidator(0)],
        help_text=_("Most GE the team may borrow beyond max_ge in a pool that lends idle GPUs; empty: no cap"))
    priority_class = models.ForeignKey(PriorityClass, on_delete=models.PROTECT, null=True, blank=True,
                                       related_name="quotas",
                                       help_text=_("The highest priority its requests may ask; empty: priority 0"))
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = _("quota")
        ordering = ["team__slug", "pool__slug"]
        constraints = [models.UniqueConstraint(fields=["team", "pool"], name="one_quota_per_team_and_pool")]

    def __str__(self) -> str:
        return f"{self.team.slug} in {self.pool.slug}: {self.max_ge} GE"


class Reservation(models.Model):
    class State(models.TextChoices):
        PENDING = "pending", _("Pending")
        SCHEDULED = "scheduled", _("Scheduled")
        APPLYING = "applying", _("Applying")
        ACTIVE = "active", _("Active")
        RELEASING = "releasing", _("Releasing")
        RELEASED = "released", _("Released")
        EXPIRED = "expired", _("Expired")
        FAILED = "failed", _("Failed")

    # States in which the reservation still holds (or will hold) its GPUs.
    LIVE_STATES = (State.SCHEDULED, State.APPLYING, State.ACTIVE)
    FINAL_STATES = (State.RELEASED, State.EXPIRED, State.FAILED)

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="reservations")
    pool = models.ForeignKey(GpuPool, on_delete=models.PROTECT, related_name="reservations")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, verbose_name=_("requester"), on_delete=models.SET_NULL, null=True,
        related_name="reservations"
    )
    # What was asked, in the pool's unit (the sharing mode at booking time): `gpus` is the number of
    # GPUs the reservation spans (whole GPUs for exclusive, `gpus: n` for vgpu, 1 for shares);
    # `shares` k of the pool's replicas (time_slicing, mps); `mig_profile` x `mig_count` instances;
    # `gpu_memory_mib` and `gpu_cores_pct` on each GPU (vgpu). `ge` is what its grants were charged.
    mode = models.CharField(max_length=16, default="exclusive", db_default="exclusive")
    gpus = models.PositiveSmallIntegerField(verbose_name=_("GPUs"))
    shares = models.PositiveSmallIntegerField(null=True, blank=True)
    mig_profile = models.CharField(verbose_name=_("MIG profile"), max_length=32, blank=True, default="", db_default="")
    mig_count = models.PositiveSmallIntegerField(verbose_name=_("MIG instances"), null=True, blank=True)
    gpu_memory_mib = models.PositiveIntegerField(verbose_name=_("GPU memory (MiB)"), null=True, blank=True)
    gpu_cores_pct = models.PositiveSmallIntegerField(verbose_name=_("GPU cores (%)"), null=True, blank=True)
    # The GPU models it accepts (Gpu.model_name values, sorted); empty: any model of the pool. A list in JSON:
    # the same column on SQLite and PostgreSQL, and a request names only a few (shapes.MAX_GPU_MODELS).
    gpu_models = models.JSONField(verbose_name=_("GPU models"), default=list, db_default=[], blank=True,
                                  help_text=_("The GPU models it accepts; empty: any model of the pool"))
    ge = models.FloatField(verbose_name=_("GE"),
                           default=0, db_default=0,
                           help_text=_("GPU-equivalents its grants were charged (weights applied)"))
    priority = models.IntegerField(default=0, db_default=0, help_text=_("Its priority class's value when it was asked"))
    borrowed_ge = models.FloatField(verbose_name=_("borrowed GE"), default=0, db_default=0,
                                    help_text=_("GE it holds beyond its team's quota (borrowed: may be reclaimed)"))
    requeue = models.BooleanField(default=False, db_default=False,
                                  help_text=_("If reclaimed, wait in the queue again for the rest of its time"))
    preempt_at = models.DateTimeField(null=True, blank=True, help_text=_("Reclaimed: its GPUs are taken back then"))
    preempt_reason = StoredTextField(verbose_name=_("reclaim reason"), blank=True, default="", db_default="",
                                     message_field="preempt_message")
    preempt_message = models.JSONField(null=True, blank=True, editable=False,
                                       help_text=_("preempt_reason's message and arguments (allocations.messages)"))
    # The request its notice was given for (a waiting one, or a fixed window ahead): while that one still needs
    # the GPUs the notice stands; when it has ended without them or was placed elsewhere, the notice is withdrawn
    # (allocations/reclaim.py, call_off_needless). Empty with preempt_at set: not known (given before 0019, or
    # that request was deleted), and the notice stands.
    preempted_for = models.ForeignKey("self", verbose_name=_("reclaimed for"), on_delete=models.SET_NULL,
                                      null=True, blank=True, related_name="reclaim_notices",
                                      help_text=_("The request its reclaim notice was given for"))
    priority_class = models.CharField(max_length=32, blank=True, default="", db_default="")
    # After priority_class: selectors.reservation_from_row gives Reservation.from_db its values in this order.
    preemptible = models.BooleanField(default=False, db_default=False,
                                      help_text=_("Its priority class was preemptible when it was asked: a request of "
                                                  "a higher class within its team's quota may take it back after a "
                                                  "notice"))
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.SCHEDULED)
    reason = StoredTextField(verbose_name=_("reason"), blank=True, message_field="reason_message",
                             help_text=_("Why it is in its state (shown to the user)"))
    reason_message = models.JSONField(null=True, blank=True, editable=False,
                                      help_text=_("reason's message and arguments (allocations.messages)"))
    ended_at = models.DateTimeField(null=True, blank=True, help_text=_("When it was released, expired or failed"))
    expiry_warned_at = models.DateTimeField(null=True, blank=True,
                                            help_text=_("When its holders were mailed that its window ends soon"))
    # Idle reclaim (monitoring.idle, a pool's opt-in policy): when its holders were warned that it sits idle
    # (cleared when activity comes back), and a "keep" its team set with a reason, which the sweep respects.
    idle_warned_at = models.DateTimeField(null=True, blank=True,
                                          help_text=_("When its holders were warned that its GPUs sit idle"))
    idle_since = models.DateTimeField(null=True, blank=True,
                                      help_text=_("Idle since, as the warning's evidence said"))
    keep_reason = models.CharField(_("keep reason"), max_length=200, blank=True, default="", db_default="",
                                   help_text=_("Why its team keeps it although it may sit idle"))
    keep_by = models.ForeignKey(settings.AUTH_USER_MODEL, verbose_name=_("kept by"), on_delete=models.SET_NULL,
                                null=True, blank=True, related_name="+")
    keep_at = models.DateTimeField(_("kept since"), null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = _("reservation")
        ordering = ["-starts_at", "-id"]
        indexes = [
            models.Index(fields=["state", "starts_at"], name="reservation_state_start"),
            models.Index(fields=["state", "ends_at"], name="reservation_state_end"),
            models.Index(fields=["team", "state"], name="reservation_team_state"),
            # Quota checks read a team's reservations in a pool that end after some moment: with this
            # they skip the team's history (an allocation never ends after its reservation).
            models.Index(fields=["team", "pool", "ends_at"], name="reservation_team_pool_end"),
            # A team's newest first (the default ordering): its list pages without sorting its history.
            models.Index(fields=["team", "-starts_at", "-id"], name="reservation_team_newest"),
            # A team's last ended ones (the reservations page), set once when a reservation ends.
            models.Index(fields=["team", "-ended_at", "-id"], name="reservation_team_ended"),
            # A pool's newest (allocations.profiles: the mix of its last few hundred), without sorting its history.
            models.Index(fields=["pool", "-id"], name="reservation_pool_newest"),
            # A pool's reservations under a reclaim notice (few, often none), which every queue pass reads twice
            # (queue._cut_at_notice, reclaim.has_notices): without it each read scanned the pool's reservations.
            models.Index(fields=["pool"], condition=Q(preempt_at__isnull=False), name="reservation_pool_notice"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(ends_at__gt=F("starts_at")), name="reservation_ends_after_start"),
            models.CheckConstraint(condition=Q(gpus__gte=1), name="reservation_at_least_one_gpu"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.team.slug} {self.gpus}x {self.pool.slug} ({self.state})"

    @property
    def is_live(self) -> bool:
        return self.state in self.LIVE_STATES

    @property
    def ended_early(self) -> bool:
        """Whether it ended (released, cancelled, failed) before its booked end: `ends_at` keeps the booked
        end, so the pages must show `ended_at` beside it or an early release reads as a full window. One
        that expired ends a little after its booked end (the sweep's delay), which is not worth showing."""
        return self.ended_at is not None and self.ended_at < self.ends_at


class AllocationQuerySet(models.QuerySet):
    # booked_during in SQL, over an allocation aliased `a`, with the window's end and then its start as
    # parameters: the hand-written reads on the hot path (booking.pool_snapshot, selectors.team_windows)
    # use it; tests/allocations/test_booked_during.py keeps the two equal.
    BOOKED_DURING_SQL = "a.starts_at < %s AND a.ends_at > %s AND a.ends_at > a.starts_at"

    def booked_during(self, start, end) -> "AllocationQuerySet":
        """Allocations holding their GPU at some instant of [start, end). A cancelled booking's empty
        window [s, s) holds nothing, even where s falls inside."""
        return self.filter(starts_at__lt=end, ends_at__gt=start).filter(ends_at__gt=F("starts_at"))


class Allocation(models.Model):
    """A grant: what one reservation holds of one GPU over [starts_at, ends_at).

    What it holds is the part [share_from, share_to) of the card's share space, in milli-GPU
    (0-1000; allocations.units): the whole card is [0, 1000), k adjacent share slots of N
    time-slicing or MPS replicas k slots of 1000 // N each (units.share_slots), a MIG instance the memory slices it occupies (125 each). Two grants on one
    GPU whose windows overlap must hold disjoint parts: on PostgreSQL an exclusion constraint
    says so (migration 0007), whatever the code does. `milli` is what the grant is worth in
    milli-GPU (a MIG instance counts its compute slices out of 7, not its memory slices);
    `mig_profile`/`mig_start`, `memory_mib` and `cores_pct` carry the rest of a share's shape;
    `ge` is what the grant was charged in GPU-equivalents (milli x the model's weight when it was
    made). A row written by hand SQL without these columns is a whole GPU (the database defaults).

    A vgpu grant holds memory and cores of its GPU, not a part of the share space: its share
    columns span the whole card and the share exclusion constraint leaves it out; a second one
    keeps vgpu grants and other grants of one GPU from overlapping in time, and a trigger on vgpu
    rows keeps the memory and cores of a GPU's overlapping vgpu grants within the card
    (migration 0009).
    """

    objects = AllocationQuerySet.as_manager()

    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="allocations")
    gpu = models.ForeignKey(Gpu, verbose_name=_("GPU"), on_delete=models.PROTECT, related_name="allocations")
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    mode = models.CharField(max_length=16, default="exclusive", db_default="exclusive",
                            help_text=_("The pool's sharing mode when the grant was made"))
    ge = models.FloatField(verbose_name=_("GE"), default=1.0, db_default=1.0, help_text=_("GPU-equivalents charged for it"))
    share_from = models.PositiveSmallIntegerField(default=0, db_default=0)
    share_to = models.PositiveSmallIntegerField(default=units.MILLI_PER_GPU, db_default=units.MILLI_PER_GPU)
    milli = models.PositiveSmallIntegerField(verbose_name=_("worth (thousandths of a GPU)"),
                                             default=units.MILLI_PER_GPU, db_default=units.MILLI_PER_GPU,
                                             help_text=_("What the grant is worth, in thousandths of a GPU"))
    mig_profile = models.CharField(verbose_name=_("MIG profile"), max_length=32, blank=True, default="", db_default="")
    mig_start = models.PositiveSmallIntegerField(verbose_name=_("MIG start slice"), null=True, blank=True)
    memory_mib = models.PositiveIntegerField(verbose_name=_("memory cap (MiB)"),
                                             null=True, blank=True, help_text=_("GPU memory cap of a share"))
    cores_pct = models.PositiveSmallIntegerField(verbose_name=_("cores cap (%)"),
                                                 null=True, blank=True, help_text=_("Compute cap of a share, %"))

    class Meta:
        verbose_name = _("GPU grant")
        ordering = ["reservation_id", "gpu__node_id", "gpu__index"]
        indexes = [
            models.Index(fields=["gpu", "ends_at", "starts_at"], name="allocation_gpu_window"),
            # "Held now" across the fleet (metrics, alerts, dashboards, failover) reads only the
            # allocations that have not ended, however long the history grows.
            models.Index(fields=["ends_at", "starts_at"], name="allocation_window"),
        ]
        constraints = [
            # Equal bounds (an empty window) mark a booking cancelled before it began.
            models.CheckConstraint(condition=Q(ends_at__gte=F("starts_at")), name="allocation_window_ordered"),
            models.CheckConstraint(
                condition=Q(share_from__lt=F("share_to"), share_to__lte=units.MILLI_PER_GPU,
                            milli__gte=1, milli__lte=units.MILLI_PER_GPU),
                name="allocation_share_in_gpu"),
        ]

    def __str__(self) -> str:
        return f"{self.gpu.uuid} for reservation #{self.reservation_id}"


class ReservationEvent(models.Model):
    """One change of a reservation: state transitions, plus extensions (same state on both sides)."""

    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="events")
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    at = models.DateTimeField(auto_now_add=True)
    reason = StoredTextField(verbose_name=_("reason"), blank=True, message_field="reason_message")
    reason_message = models.JSONField(null=True, blank=True, editable=False,
                                      help_text=_("reason's message and arguments (allocations.messages)"))

    class Meta:
        verbose_name = _("reservation event")
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"#{self.reservation_id}: {self.from_state or '∅'} → {self.to_state}"


class QueueEntry(models.Model):
    """What a reservation asked of the queue, and where it stands there (allocations.queue).

    A request that may wait asks for a shape and a `duration`, to start as soon as it fits
    between `not_before` and `not_after`. While it waits (its reservation `pending`) each
    scheduling pass writes its `position`, the `reason` it waits, `start_by` (the promise: the
    start the plan gives if every booking runs to its booked end) and `likely_start` (the
    estimate, from how early the pool's bookings really end), with the values of the pass
    before. The row stays once the request started: `first_start_by` and `first_likely_start`
    against the reservation's real start say how good the promise and the estimate were.
    """

    reservation = models.OneToOneField(Reservation, on_delete=models.CASCADE, primary_key=True,
                                       related_name="queue_entry")
    shape = models.JSONField(help_text=_("What it asks for, as allocations.booking.Shape's fields"))
    duration = models.DurationField()
    not_before = models.DateTimeField(null=True, blank=True)
    not_after = models.DateTimeField(null=True, blank=True, help_text=_("Start no later than this, else fail"))
    queued_at = models.DateTimeField()
    priority = models.SmallIntegerField(default=0)
    position = models.PositiveIntegerField(null=True, blank=True)
    reason = models.CharField(max_length=32, blank=True, help_text=_("Why it waits, as a code"))
    reason_text = StoredTextField(blank=True, message_field="reason_text_message",
                                  help_text=_("Why it waits, in words"))
    reason_text_message = models.JSONField(null=True, blank=True, editable=False,
                                           help_text=_("reason_text's message and arguments (allocations.messages)"))
    start_by = models.DateTimeField(null=True, blank=True)
    likely_start = models.DateTimeField(null=True, blank=True)
    previous_start_by = models.DateTimeField(null=True, blank=True)
    previous_likely_start = models.DateTimeField(null=True, blank=True)
    first_start_by = models.DateTimeField(null=True, blank=True)
    first_likely_start = models.DateTimeField(null=True, blank=True)
    moved_why = StoredTextField(blank=True, message_field="moved_why_message",
                                help_text=_("Why start_by last moved later"))
    moved_why_message = models.JSONField(null=True, blank=True, editable=False,
                                         help_text=_("moved_why's message and arguments (allocations.messages)"))
    planned_at = models.DateTimeField(null=True, blank=True, help_text=_("The last scheduling pass that planned it"))
    planned_gpus = models.JSONField(null=True, blank=True, editable=False,
                                    help_text=_("The GPUs the promise (start_by) holds for it, kept by the next pass"))

    class Meta:
        verbose_name = _("queue entry")
        verbose_name_plural = _("queue entries")

    def __str__(self) -> str:
        return f"queue entry of reservation #{self.reservation_id}"

    @property
    def duration_seconds(self) -> float:
        return self.duration.total_seconds()


class ApplyJob(models.Model):
    """One attempt-tracked piece of work against a cluster: apply or undo a reservation, or a reconcile.

    The row is the truth about the work; Celery messages only nudge it. A worker claims a
    job with a conditional update (queued/retrying and due → running), so two workers never
    run the same attempt, and the sweep re-queues jobs whose message was lost or whose
    claim's lease lapsed (allocations/apply/jobs.py).
    """

    class Action(models.TextChoices):
        APPLY = "apply", _("Apply")
        UNDO = "undo", _("Undo")
        RECONCILE = "reconcile", _("Reconcile")

    class Status(models.TextChoices):
        QUEUED = "queued", _("Queued")
        RUNNING = "running", _("Running")
        RETRYING = "retrying", _("Waiting to retry")
        SUCCEEDED = "succeeded", _("Succeeded")
        FAILED = "failed", _("Failed")

    OPEN_STATUSES = (Status.QUEUED, Status.RUNNING, Status.RETRYING)

    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, null=True, blank=True,
                                    related_name="apply_jobs")
    cluster = models.ForeignKey("inventory.Cluster", on_delete=models.CASCADE, related_name="apply_jobs")
    action = models.CharField(max_length=16, choices=Action.choices)
    backend = models.CharField(max_length=16, help_text=_("kubernetes or agent"))
    target = models.CharField(max_length=255, blank=True, help_text=_("What it acts on, in words"))
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    attempts = models.PositiveIntegerField(default=0)
    final_state = models.CharField(max_length=16, blank=True,
                                   help_text=_("undo: the state the reservation ends in (released or expired)"))
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    lease_until = models.DateTimeField(
        null=True, blank=True,
        help_text=_("running: the claim's lease, renewed while the attempt runs; lapsed, the sweep takes the job back"))
    deadline = models.DateTimeField()
    error = models.TextField(blank=True)
    changes = models.JSONField(default=list, blank=True, help_text=_("What the backend changed (or repaired)"))

    class Meta:
        verbose_name = _("apply job")
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="applyjob_status_due")]

    def __str__(self) -> str:
        subject = f"reservation #{self.reservation_id}" if self.reservation_id else self.cluster.slug
        return f"{self.action} {subject} ({self.status})"


class HostLeaseReport(models.Model):
    """What a bare-metal host's agent last said it enforces: the lease keys it holds."""

    node = models.OneToOneField("inventory.Node", on_delete=models.CASCADE, related_name="lease_report")
    held = models.JSONField(default=list, help_text=_("Lease keys '<reservation id>:<GPU UUID>' the agent holds"))
    failed = models.JSONField(default=dict, blank=True, help_text=_("Leases the agent could not apply: {key: why}"))
    unleased_in_use = models.JSONField(default=list, blank=True,
                                       help_text=_("UUIDs of GPUs running processes that no lease covers"))
    reported_at = models.DateTimeField()

    class Meta:
        verbose_name = _("host lease report")

    def __str__(self) -> str:
        return f"{self.node}: {len(self.held)} leases"
