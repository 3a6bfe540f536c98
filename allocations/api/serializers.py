"""Input and output serializers of the reservations, pools and quotas API."""
from __future__ import annotations

import math
from datetime import timedelta
from zoneinfo import ZoneInfo

from django.conf import settings
from django.utils.text import format_lazy
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from allocations.models import ApplyJob, PriorityClass, Quota, Reservation, ReservationEvent
from allocations.booking import mig_layout_problem
from allocations.queue import parse_duration
from allocations.placement import DEFAULT_POLICY, POLICY_NAMES
from allocations.placement.mig import profiles_for
from allocations import selectors
from allocations.selectors import LATEST_INSTANT
from allocations.shapes import AMOUNT_LIMITS, GPU_MODEL_NAME_MAX, MAX_GPU_MODELS, gpu_models_problem
from common.api import CleanModelSerializer, RefusesUnknownFields, SlugLookupField
from inventory.models import GpuPool
from inventory.sharing import SharingMode, mig_dynamic, mig_layout_names
from teams.models import Team



class PoolSerializer(RefusesUnknownFields, CleanModelSerializer):
    placement_policy = serializers.ChoiceField(
        choices=sorted(POLICY_NAMES), default=DEFAULT_POLICY,
        help_text=format_lazy(gettext_lazy("How reservations are placed; {policy} (the default) packs to keep large "
                                           "requests placeable"), policy=DEFAULT_POLICY),
    )
    gpus_total = serializers.IntegerField(read_only=True, default=0)
    gpus_healthy = serializers.IntegerField(read_only=True, default=0)
    gpus_allocated = serializers.IntegerField(read_only=True, default=0)
    gpus_free = serializers.IntegerField(read_only=True, default=0)

    class Meta:
        model = GpuPool
        fields = ["id", "slug", "name", "description", "sharing_mode", "sharing_config", "placement_policy",
                  "queueing", "queue_ordering", "backfill", "borrowing", "idle_reclaim",
                  "idle_warn_minutes", "idle_release_minutes", "idle_keep_allowance", "gpus_total", "gpus_healthy", "gpus_allocated", "gpus_free", "created_at"]

    def validate(self, attrs: dict) -> dict:
        attrs = super().validate(attrs)  # the config's shape (GpuPool.clean)
        mode = attrs.get("sharing_mode", getattr(self.instance, "sharing_mode", None))
        config = attrs.get("sharing_config", getattr(self.instance, "sharing_config", None))
        if mode == SharingMode.MIG and isinstance(config, dict):
            models = (sorted(set(self.instance.gpus.values_list("model_name", flat=True)))
                      if self.instance is not None else [])
            problem = mig_layout_problem(mig_layout_names(config), models)
            if not problem and mig_dynamic(config):
                problem = next((_("a dynamic MIG layout needs MIG-capable GPUs; %(model)s has no MIG profiles")
                                % {"model": model} for model in models if not profiles_for(model)), None)
            if problem:
                raise serializers.ValidationError(
                    {"sharing_config": serializers.ErrorDetail(problem, code="layout_does_not_fit")})
        return attrs


def amount_field(name: str, help_text: str) -> serializers.Field:
    """An optional amount field of a request (allocations.shapes.Amounts), with its limits (AMOUNT_LIMITS)."""
    if name == "mig_profile":
        return serializers.CharField(max_length=32, required=False, help_text=help_text)
    return serializers.IntegerField(required=False, help_text=help_text, **AMOUNT_LIMITS[name])


def _before_latest(value):
    if value >= LATEST_INSTANT:
        raise serializers.ValidationError(_("Must be before %(latest)s.") % {"latest": LATEST_INSTANT.date().isoformat()},
                                          code="max_value")
    return value


@extend_schema_field({"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": GPU_MODEL_NAME_MAX},
                     "maxItems": MAX_GPU_MODELS, "uniqueItems": True})
class GpuModelsField(serializers.Field):
    """A list of distinct GPU model names, checked by the rule the service keeps (shapes.gpu_models_problem):
    a string or a number where a name belongs is refused, not turned into one."""

    def to_internal_value(self, data):
        problem = gpu_models_problem(data)
        if problem is not None:
            raise serializers.ValidationError(problem.message, code=problem.rule)
        return list(data)

    def to_representation(self, value):
        return list(value or ())


class GpuModelsQueryField(GpuModelsField):
    """`gpu_models` in a query string: the parameter repeated, one model name each
    (`?gpu_models=A&gpu_models=B`), each value taken whole. A comma is not a separator: model names are what
    the GPUs report, and nothing keeps a comma out of them."""

    def get_value(self, dictionary):
        if hasattr(dictionary, "getlist"):
            return dictionary.getlist(self.field_name) or serializers.empty
        return super().get_value(dictionary)


class AvailabilityQuery(serializers.Serializer):
    """The window, the slot length and the shape to count, in the pool's unit, on the GPUs of `gpu_models`
    (a reservation's field: the same rules and codes). Only the fields of the pool's mode apply (another
    mode's field is a 400 `not_for_mode`); without them the timeline counts one of the pool's unit. Other
    query parameters are ignored (query strings often carry extras)."""

    start = serializers.DateTimeField(required=False, validators=[_before_latest])
    end = serializers.DateTimeField(required=False, validators=[_before_latest])
    slot = serializers.IntegerField(required=False, min_value=60, max_value=7 * 86400, default=3600,
                                    help_text=gettext_lazy("Slot length in seconds"))
    gpus = amount_field("gpus", gettext_lazy("exclusive: whole GPUs wanted together (default 1); vgpu: GPUs of one node that must "
                                "each have the memory and cores free (default 1)"))
    shares = amount_field("shares", gettext_lazy("time_slicing, mps: shares wanted on one GPU (default 1)"))
    mig_profile = amount_field("mig_profile", gettext_lazy("mig: the profile to count (default: the layout's smallest)"))
    count = amount_field("count", gettext_lazy("mig: instances wanted (default 1)"))
    gpu_memory_mib = amount_field("gpu_memory_mib", gettext_lazy("vgpu: memory free on each GPU, MiB (default: the pool's)"))
    gpu_memory_pct = amount_field("gpu_memory_pct", gettext_lazy("vgpu: memory free on each GPU, percent of the card"))
    gpu_cores_pct = amount_field("gpu_cores_pct", gettext_lazy("vgpu: cores free on each GPU, % (default: the pool's, else the "
                                                  "memory's share)"))
    gpu_models = GpuModelsQueryField(
        required=False, help_text=gettext_lazy("Count only GPUs of these models, as a reservation with this gpu_models "
                                               "would be placed (default: any model). Repeat the parameter for each "
                                               "model (gpu_models=A&gpu_models=B); each value is one whole model "
                                               "name, a comma included"))

class SlotSerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    free = serializers.IntegerField(help_text=gettext_lazy("How much of the pool's unit is free for the whole slot: whole GPUs "
                                              "(exclusive), shares (time_slicing, mps), instances of the profile "
                                              "(mig), GPUs with the memory and cores free (vgpu)"))
    free_on_one_node = serializers.IntegerField(help_text=gettext_lazy("The same as most_together (kept for compatibility)"))
    unit = serializers.CharField(help_text=gettext_lazy("What free counts: GPUs, shares or instances"))
    most_together = serializers.IntegerField(help_text=gettext_lazy("The most one request could get: on one GPU (shares), on "
                                                       "one node (GPUs, instances)"))
    fits = serializers.BooleanField(help_text=gettext_lazy("Whether the shape asked could be booked for the slot"))


@extend_schema_field({"oneOf": [{"type": "string", "format": "date-time"}, {"type": "string", "enum": ["earliest"]}]})
class StartField(serializers.DateTimeField):
    """A date-time, or the word "earliest"."""

    def to_internal_value(self, value):
        if value == "earliest":
            return value
        return super().to_internal_value(value)


@extend_schema_field({"oneOf": [{"type": "string", "example": "4h"}, {"type": "number", "description": "seconds"}]})
class DurationField(serializers.Field):
    """A duration as "4h", "30m", "1d12h", "90s" or ISO 8601 ("PT4H"), or a number of seconds."""

    default_error_messages = {"invalid": 'Not a duration: give e.g. "4h", "30m", "1d12h" or "PT4H".'}

    def to_internal_value(self, value):
        if isinstance(value, bool):
            self.fail("invalid")
        if isinstance(value, (int, float)):
            if not math.isfinite(value) or abs(value) > 10**9:
                self.fail("invalid")
            return timedelta(seconds=value)
        parsed = parse_duration(value) if isinstance(value, str) and len(value) <= 32 else None
        if parsed is None:
            self.fail("invalid")
        return parsed

    def to_representation(self, value):
        return value.total_seconds() if value is not None else None


class ReservationCreateInput(RefusesUnknownFields, serializers.Serializer):
    """What to book, in the pool's unit: which of the fields apply depends on the pool's sharing mode,
    and the service refuses (400 `not_for_mode`) a field that does not belong to it."""

    # Slugs, resolved by the service in the statement that locks the pool (not one query each here).
    pool = serializers.SlugField(max_length=64, help_text=gettext_lazy("The pool's slug"))
    team = serializers.SlugField(max_length=64, help_text=gettext_lazy("The team's slug"))
    gpus = amount_field("gpus", gettext_lazy("exclusive: whole GPUs (required); vgpu: GPUs of one node (default 1)"))
    shares = amount_field("shares", gettext_lazy("time_slicing, mps: shares of one GPU, at most the pool's replicas"))
    mig_profile = amount_field("mig_profile", gettext_lazy("mig: the instance profile, e.g. 1g.10gb or 3g.40gb"))
    count = amount_field("count", gettext_lazy("mig: how many instances of mig_profile (default 1)"))
    gpu_memory_mib = amount_field("gpu_memory_mib", gettext_lazy("vgpu: GPU memory on each GPU, MiB (default: the pool's)"))
    gpu_memory_pct = amount_field("gpu_memory_pct", gettext_lazy("vgpu: GPU memory on each GPU, percent of the card (instead of "
                                                    "gpu_memory_mib)"))
    gpu_cores_pct = amount_field("gpu_cores_pct", gettext_lazy("vgpu: compute on each GPU, percent of its cores (default: the pool's, "
                                                  "else the memory's share)"))
    starts_at = StartField(required=False, allow_null=True, help_text=(
        gettext_lazy('A fixed window\'s start (with ends_at; left out or null: now). With duration: left out to start as soon '
        'as it fits (waiting in the queue if need be), or "earliest" to book the earliest window that fits now.')))
    ends_at = serializers.DateTimeField(required=False, help_text=gettext_lazy("A fixed window's end (or give duration)"))
    duration = DurationField(required=False, help_text=(
        gettext_lazy('Instead of ends_at: how long, as "4h", "30m", "1d12h" or ISO 8601 ("PT4H"); the request starts as soon '
        'as it fits')))
    not_before = serializers.DateTimeField(required=False, allow_null=True,
                                           help_text=gettext_lazy("With duration: start no earlier than this"))
    not_after = serializers.DateTimeField(required=False, allow_null=True,
                                          help_text=gettext_lazy("With duration: start no later than this, else it fails"))
    priority_class = serializers.SlugField(max_length=32, required=False, help_text=(
        gettext_lazy("The priority to run at: the quota's class (the default) or a lower one (400 "
        "`above_quota_class`); a class marked preemptible may be taken back, after a notice, for a higher class")))
    requeue = serializers.BooleanField(required=False, default=False, help_text=(
        gettext_lazy("If it is taken back (GPUs borrowed beyond its quota reclaimed, or preempted for a higher "
        "priority), wait in the queue again for the rest of its time")))
    queue = serializers.BooleanField(required=False, allow_null=True, default=None, help_text=(
        gettext_lazy("With duration: false refuses at once (409) rather than wait; true insists on waiting (400 "
        "`queueing_off` where the pool does not queue); left out: wait where the pool queues")))
    gpu_models = GpuModelsField(required=False, help_text=gettext_lazy(
        'The GPU models it accepts, as the pool\'s GPUs name them (e.g. ["NVIDIA H100 80GB HBM3"]); left out or '
        'empty: any model of the pool. Placed, queued, extended and moved only onto GPUs of these models'))

    def to_internal_value(self, data):
        # ends_at is required unless duration is given: named with the other missing fields at once.
        missing = (isinstance(data, dict) and data.get("ends_at") is None and data.get("duration") is None)
        try:
            values = super().to_internal_value(data)
        except serializers.ValidationError as invalid:
            if missing and isinstance(invalid.detail, dict):
                invalid.detail["ends_at"] = [serializers.ErrorDetail(
                    _("Give ends_at (a fixed window) or duration (as soon as it fits)."), code="required")]
            raise
        if missing:
            raise serializers.ValidationError({"ends_at": [serializers.ErrorDetail(
                _("Give ends_at (a fixed window) or duration (as soon as it fits)."), code="required")]})
        return values


class ReservationExtendInput(RefusesUnknownFields, serializers.Serializer):
    ends_at = serializers.DateTimeField()


def _time(**kwargs) -> serializers.DateTimeField:
    """A read-only time, shown in the portal's zone (TIME_ZONE). Named here once: without it DRF asks
    Django for the current zone for every value (~20 µs each here), and a page of 20 reservations
    shows ~200 of them. The API never switches zones per request, so the output is the same."""
    return serializers.DateTimeField(read_only=True, default_timezone=ZoneInfo(settings.TIME_ZONE), **kwargs)


class AllocatedGpuSerializer(serializers.Serializer):
    """One GPU allocated to a reservation, with the window it holds it for."""

    uuid = serializers.CharField(read_only=True)
    node = serializers.CharField(read_only=True)
    index = serializers.IntegerField(read_only=True)
    model_name = serializers.CharField(read_only=True)
    starts_at = _time()
    ends_at = _time()


class GrantSerializer(serializers.Serializer):
    """What a reservation holds of one GPU: the GPU, and the mode's share of it."""

    uuid = serializers.CharField(read_only=True, help_text=gettext_lazy("The GPU's UUID"))
    node = serializers.CharField(read_only=True)
    index = serializers.IntegerField(read_only=True)
    model_name = serializers.CharField(read_only=True)
    mode = serializers.CharField(read_only=True)
    shares = serializers.IntegerField(read_only=True, allow_null=True, help_text=gettext_lazy("time_slicing, mps: shares held"))
    replicas = serializers.IntegerField(read_only=True, allow_null=True, help_text=gettext_lazy("time_slicing, mps: of how many"))
    mig_profile = serializers.CharField(read_only=True, allow_null=True)
    mig_instance = serializers.CharField(read_only=True, allow_null=True,
                                         help_text=gettext_lazy("mig: the MIG device UUID, or '<GPU UUID>/<start slice>'"))
    gpu_memory_mib = serializers.IntegerField(read_only=True, allow_null=True,
                                              help_text=gettext_lazy("mig, mps, vgpu: the memory it may use"))
    gpu_cores_pct = serializers.IntegerField(read_only=True, allow_null=True, help_text=gettext_lazy("mps, vgpu: compute cap"))
    ge = serializers.FloatField(read_only=True, help_text=gettext_lazy("GPU-equivalents charged (the model's weight applied)"))
    starts_at = _time()
    ends_at = _time()


class ReservationEventSerializer(serializers.ModelSerializer):
    # None: a transition made by the portal itself (the sweep, failover) or by an account since deleted.
    actor = serializers.CharField(source="actor.username", default=None, allow_null=True)

    class Meta:
        model = ReservationEvent
        fields = ["from_state", "to_state", "actor", "at", "reason"]


class QueueSerializer(serializers.Serializer):
    """Where a request that asked to start as soon as it fits stands in its pool's queue."""

    position = serializers.IntegerField(read_only=True, allow_null=True,
                                        help_text=gettext_lazy("1 = next; null once it started or ended"))
    reason = serializers.CharField(read_only=True, help_text=gettext_lazy("Why it waits: not_enough, fragmented, over_quota, "
                                                             "held_for_queue, behind, not_before, no_model, no_start"))
    reason_text = serializers.CharField(read_only=True, help_text=gettext_lazy("The same in words"))
    duration = serializers.FloatField(source="duration_seconds", read_only=True, help_text=gettext_lazy("Seconds asked"))
    not_before = _time(allow_null=True)
    not_after = _time(allow_null=True)
    queued_at = _time()
    start_by = _time(allow_null=True, help_text=(
        gettext_lazy("The promise: the start the plan gives if every booking runs to its booked end. Only a request ordered "
        "ahead later (a higher priority) or lost capacity moves it later; moved_why says why")))
    likely_start = _time(allow_null=True, help_text=(
        gettext_lazy("The estimate, from how early this pool's bookings really end; usually before start_by")))
    previous_start_by = _time(allow_null=True, help_text=gettext_lazy("start_by at the pass before"))
    previous_likely_start = _time(allow_null=True, help_text=gettext_lazy("likely_start at the pass before"))
    first_start_by = _time(allow_null=True)
    first_likely_start = _time(allow_null=True)
    moved_why = serializers.CharField(read_only=True, help_text=gettext_lazy("Why start_by last moved later, if it did"))
    planned_at = _time(allow_null=True, help_text=gettext_lazy("When the last scheduling pass planned it"))


# Declared field by field rather than as a ModelSerializer: this answers every create, release and
# list call, and a ModelSerializer reads the model's fields again for every instance it serializes.
class ReservationSerializer(serializers.Serializer):
    """A reservation: its window, its state and the GPUs allocated to it."""

    id = serializers.IntegerField(read_only=True)
    team = serializers.CharField(source="team.slug", read_only=True)
    pool = serializers.CharField(source="pool.slug", read_only=True)
    mode = serializers.CharField(read_only=True, help_text=gettext_lazy("The pool's sharing mode when it was booked"))
    gpus = serializers.IntegerField(read_only=True, help_text=gettext_lazy("How many GPUs it spans"))
    shares = serializers.IntegerField(read_only=True, allow_null=True)
    mig_profile = serializers.CharField(read_only=True, allow_blank=True)
    count = serializers.IntegerField(source="mig_count", read_only=True, allow_null=True)
    gpu_memory_mib = serializers.IntegerField(read_only=True, allow_null=True)
    gpu_cores_pct = serializers.IntegerField(read_only=True, allow_null=True)
    gpu_models = serializers.ListField(child=serializers.CharField(), read_only=True, help_text=gettext_lazy(
        "The GPU models it accepts; empty: any model of the pool"))
    ge = serializers.FloatField(read_only=True, help_text=gettext_lazy("GPU-equivalents its grants were charged"))
    priority_class = serializers.CharField(read_only=True, help_text=gettext_lazy("The priority class it runs at ('' : none)"))
    borrowed_ge = serializers.FloatField(read_only=True, help_text=(
        gettext_lazy("GE of it beyond its team's quota, borrowed on idle GPUs: those may be taken back after a notice")))
    preemptible = serializers.BooleanField(read_only=True, help_text=gettext_lazy(
        "It runs at a preemptible priority class: a request of a higher class within its team's quota may take it "
        "back after a notice"))
    preempt_at = _time(allow_null=True, help_text=gettext_lazy(
        "Set when it is being taken back (borrowed GE reclaimed, or preempted for a higher priority): when"))
    starts_at = _time()
    ends_at = _time()
    state = serializers.ChoiceField(choices=Reservation.State.choices, read_only=True)
    reason = serializers.CharField(read_only=True, help_text=Reservation._meta.get_field("reason").help_text)
    requested_by = serializers.CharField(source="requested_by.username", default=None, read_only=True,
                                         allow_null=True)  # None once the account is deleted
    allocated_gpus = AllocatedGpuSerializer(many=True, read_only=True)
    grants = GrantSerializer(many=True, read_only=True)
    queue = QueueSerializer(source="queue_info", read_only=True, allow_null=True, default=None, help_text=(
        gettext_lazy("Its place in the pool's queue while it waits (state pending), and how the promise and the estimate "
        "turned out once it started; null for a fixed window")))
    created_at = _time()
    updated_at = _time()
    ended_at = _time(allow_null=True, help_text=(
        gettext_lazy("When it really ended: released, cancelled, expired or failed; null while it is live. `ends_at` keeps "
        "the booked end, so a reservation released or cancelled early has an `ended_at` before its `ends_at`; "
        "one that expired has an `ended_at` at or a little after it (when the sweep got to it).")))


# DRF deep-copies a serializer's declared fields into every instance it makes: ~1 ms of CPU for this
# one and its nested GPUs, on every create, release and list. The fields keep no state between
# calls, so the API answers reservations through this one instance, made once.
_RESERVATION_OUTPUT = ReservationSerializer()


def reservation_data(reservation: Reservation) -> dict:
    """A reservation as ReservationSerializer shows it (its `allocated_gpus` must be set)."""
    return _RESERVATION_OUTPUT.to_representation(reservation)


class ApplyJobSerializer(serializers.ModelSerializer):
    cluster = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = ApplyJob
        fields = ["id", "action", "backend", "cluster", "target", "status", "attempts", "created_at", "started_at",
                  "finished_at", "next_attempt_at", "deadline", "error", "changes"]
        read_only_fields = fields


class JobEnvironmentSerializer(serializers.Serializer):
    where = serializers.ChoiceField(choices=["host", "kubernetes"], read_only=True)
    nodes = serializers.ListField(child=serializers.CharField(), read_only=True)
    namespace = serializers.CharField(read_only=True, allow_null=True,
                                      help_text=gettext_lazy("kubernetes: the team's namespace, where its pods run"))
    variables = serializers.DictField(child=serializers.CharField(), read_only=True, help_text=(
        gettext_lazy("What a job starts with: CUDA_VISIBLE_DEVICES (on hosts) and GPUPOOL_*. The mode's host-local limits "
        "(MPS pipes, HAMi limits) are in the agent's reservation-<id>.env on the host")))


class ReservationKeepInput(RefusesUnknownFields, serializers.Serializer):
    reason = serializers.CharField(max_length=200, help_text=gettext_lazy(
        "Why it is kept although it may sit idle (staff see it)"))


class ReservationDetailSerializer(ReservationSerializer):
    events = ReservationEventSerializer(many=True, read_only=True)
    idle_warned_at = _time(allow_null=True, help_text=gettext_lazy(
        "Set while it sits idle in a pool with idle reclaim: when its holders were warned"))
    keep_reason = serializers.CharField(read_only=True, help_text=gettext_lazy(
        "Why its team keeps it (the pool's idle reclaim leaves it alone); '' when not kept"))
    keep_by = serializers.CharField(source="keep_by.username", default=None, read_only=True, allow_null=True)
    keep_at = _time(allow_null=True)
    environment = serializers.SerializerMethodField(help_text=gettext_lazy("How a job uses it, once it is active; else null"))
    apply_jobs = ApplyJobSerializer(many=True, read_only=True,
                                    help_text=gettext_lazy("Work done on the cluster or host to apply and undo it"))

    @extend_schema_field(JobEnvironmentSerializer(allow_null=True))
    def get_environment(self, reservation: Reservation) -> dict | None:
        return selectors.job_environment(reservation)


class QuotaSerializer(RefusesUnknownFields, serializers.ModelSerializer):
    """What a team may hold in a pool, in GPU-equivalents. Unknown fields are refused (`unknown_field`)."""

    team = SlugLookupField(slug_field="slug", queryset=Team.objects.all())
    pool = SlugLookupField(slug_field="slug", queryset=GpuPool.objects.all())
    # GPU-equivalents, as the columns hold them (DECIMAL(8, 2) and DECIMAL(10, 1)): more digits than
    # that are a 400 naming the field (max_digits, max_decimal_places, max_whole_digits), never a
    # database error. JSON numbers both ways, not DRF's default strings.
    max_ge = serializers.DecimalField(max_digits=8, decimal_places=2, min_value=0, coerce_to_string=False,
                                      help_text=gettext_lazy("Most GE the team may hold in the pool at any moment"))
    ge_hours_per_month = serializers.DecimalField(
        max_digits=10, decimal_places=1, min_value=0, allow_null=True, required=False, coerce_to_string=False,
        help_text=gettext_lazy("GE-hours the team may book per calendar month (UTC); null = no limit"))

    priority_class = SlugLookupField(slug_field="name", queryset=PriorityClass.objects.all(), required=False,
                                     allow_null=True, help_text=gettext_lazy("The highest priority class its requests may ask"))
    max_borrow_ge = serializers.DecimalField(
        max_digits=8, decimal_places=2, min_value=0, allow_null=True, required=False, coerce_to_string=False,
        help_text=gettext_lazy("Most GE it may borrow beyond max_ge where the pool lends idle GPUs; null: no cap"))

    class Meta:
        model = Quota
        fields = ["id", "team", "pool", "max_ge", "ge_hours_per_month", "max_borrow_ge", "priority_class",
                  "updated_at"]
        read_only_fields = ["updated_at"]
        # Uniqueness of (team, pool) is the service's get-or-create, not a 400 here.
        validators: list = []

    def validate(self, attrs: dict) -> dict:
        for name in ("team", "pool"):
            if self.instance is not None and name in attrs and attrs[name] != getattr(self.instance, name):
                raise serializers.ValidationError(
                    {name: serializers.ErrorDetail(
                        (_("A quota's team cannot change; create another quota.") if name == "team"
                         else _("A quota's pool cannot change; create another quota.")), code="immutable")}
                )
        return attrs


def _ge(**kwargs) -> serializers.FloatField:
    return serializers.FloatField(read_only=True, **kwargs)


class GeShareSerializer(serializers.Serializer):
    mode = serializers.CharField(read_only=True, help_text=gettext_lazy("The sharing mode the grants were made in"))
    model = serializers.CharField(read_only=True, help_text=gettext_lazy("The GPU model (Gpu.model_name)"))
    held_now = _ge(help_text=gettext_lazy("GE held now"))
    ge_hours_this_month = _ge(help_text=gettext_lazy("GE-hours booked this calendar month (UTC)"))


class PoolUseSerializer(serializers.Serializer):
    pool = serializers.CharField(source="pool.slug", read_only=True)
    max_ge = serializers.DecimalField(source="quota.max_ge", max_digits=8, decimal_places=2, coerce_to_string=False,
                                      read_only=True, default=None, allow_null=True,
                                      help_text=gettext_lazy("The quota's GE at once; null: no quota in the pool"))
    ge_hours_per_month = serializers.DecimalField(
        source="quota.ge_hours_per_month", max_digits=10, decimal_places=1, coerce_to_string=False, read_only=True,
        default=None, allow_null=True, help_text=gettext_lazy("The quota's monthly GE-hours; null: no limit (or no quota)"))
    held_now = _ge(help_text=gettext_lazy("GE held now: the sum of the charged GE of the grants holding now"))
    ge_hours_this_month = _ge(help_text=gettext_lazy("Each grant's GE x its hours within this month, summed"))
    breakdown = GeShareSerializer(many=True, read_only=True, help_text=gettext_lazy("By sharing mode and GPU model"))


class TeamUseSerializer(serializers.Serializer):
    team = serializers.CharField(source="team.slug", read_only=True)
    max_ge = serializers.DecimalField(source="team.max_ge", max_digits=8, decimal_places=2, coerce_to_string=False,
                                      read_only=True, allow_null=True,
                                      help_text=gettext_lazy("The team-wide cap in GE across pools; null: no cap"))
    month_start = serializers.DateTimeField(read_only=True)
    month_end = serializers.DateTimeField(read_only=True)
    held_now = _ge(help_text=gettext_lazy("GE held now across all pools"))
    ge_hours_this_month = _ge(help_text=gettext_lazy("GE-hours booked this month across all pools"))
    breakdown = GeShareSerializer(many=True, read_only=True, help_text=gettext_lazy("By sharing mode and GPU model, all pools"))
    pools = PoolUseSerializer(many=True, read_only=True)


class PriorityClassSerializer(RefusesUnknownFields, CleanModelSerializer):
    """A named priority: higher `value` goes first in pools ordered by priority; bookings of a `preemptible`
    class may be taken back, after a notice, for a request of a higher class within its team's quota."""

    class Meta:
        model = PriorityClass
        fields = ["id", "name", "value", "description", "preemptible"]
