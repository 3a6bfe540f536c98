"""Input and output serializers of the reservations, pools and quotas API."""
from __future__ import annotations

from rest_framework import serializers

from allocations.models import Allocation, ApplyJob, Quota, Reservation, ReservationEvent
from allocations.placement import DEFAULT_POLICY, POLICY_NAMES
from common.api import CleanModelSerializer
from inventory.models import GpuPool
from portal.models import Team

MAX_GPUS_PER_REQUEST = 1024


class PoolSerializer(CleanModelSerializer):
    placement_policy = serializers.ChoiceField(
        choices=sorted(POLICY_NAMES), default=DEFAULT_POLICY,
        help_text=f"How reservations are placed; {DEFAULT_POLICY} (the default) packs to keep large requests placeable",
    )
    gpus_total = serializers.IntegerField(read_only=True, default=0)
    gpus_healthy = serializers.IntegerField(read_only=True, default=0)
    gpus_allocated = serializers.IntegerField(read_only=True, default=0)
    gpus_free = serializers.IntegerField(read_only=True, default=0)

    class Meta:
        model = GpuPool
        fields = ["id", "slug", "name", "description", "sharing_mode", "sharing_config", "placement_policy",
                  "gpus_total", "gpus_healthy", "gpus_allocated", "gpus_free", "created_at"]


class AvailabilityQuery(serializers.Serializer):
    start = serializers.DateTimeField(required=False)
    end = serializers.DateTimeField(required=False)
    slot = serializers.IntegerField(required=False, min_value=60, max_value=7 * 86400, default=3600,
                                    help_text="Slot length in seconds")


class SlotSerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    free = serializers.IntegerField()
    free_on_one_node = serializers.IntegerField()


class ReservationCreateInput(serializers.Serializer):
    pool = serializers.SlugRelatedField(slug_field="slug", queryset=GpuPool.objects.all())
    team = serializers.SlugRelatedField(slug_field="slug", queryset=Team.objects.all())
    gpus = serializers.IntegerField(min_value=1, max_value=MAX_GPUS_PER_REQUEST)
    starts_at = serializers.DateTimeField(required=False, allow_null=True)
    ends_at = serializers.DateTimeField()


class ReservationExtendInput(serializers.Serializer):
    ends_at = serializers.DateTimeField()


class AllocatedGpuSerializer(serializers.ModelSerializer):
    uuid = serializers.CharField(source="gpu.uuid")
    node = serializers.CharField(source="gpu.node.name")
    index = serializers.IntegerField(source="gpu.index")
    model_name = serializers.CharField(source="gpu.model_name")

    class Meta:
        model = Allocation
        fields = ["uuid", "node", "index", "model_name", "starts_at", "ends_at"]


class ReservationEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor.username", default=None)

    class Meta:
        model = ReservationEvent
        fields = ["from_state", "to_state", "actor", "at", "reason"]


class ReservationSerializer(serializers.ModelSerializer):
    team = serializers.CharField(source="team.slug")
    pool = serializers.CharField(source="pool.slug")
    requested_by = serializers.CharField(source="requested_by.username", default=None)
    allocated_gpus = AllocatedGpuSerializer(source="allocations", many=True)

    class Meta:
        model = Reservation
        fields = ["id", "team", "pool", "gpus", "starts_at", "ends_at", "state", "reason", "requested_by",
                  "allocated_gpus", "created_at", "updated_at", "ended_at"]
        read_only_fields = fields


class ApplyJobSerializer(serializers.ModelSerializer):
    cluster = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = ApplyJob
        fields = ["id", "action", "backend", "cluster", "target", "status", "attempts", "created_at", "started_at",
                  "finished_at", "next_attempt_at", "deadline", "error", "changes"]
        read_only_fields = fields


class ReservationDetailSerializer(ReservationSerializer):
    events = ReservationEventSerializer(many=True)
    apply_jobs = ApplyJobSerializer(many=True, help_text="Work done on the cluster or host to apply and undo it")

    class Meta(ReservationSerializer.Meta):
        fields = ReservationSerializer.Meta.fields + ["events", "apply_jobs"]
        read_only_fields = fields


class QuotaSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", queryset=Team.objects.all())
    pool = serializers.SlugRelatedField(slug_field="slug", queryset=GpuPool.objects.all())
    max_gpus = serializers.IntegerField(min_value=0, max_value=100000)
    gpu_hours_per_month = serializers.IntegerField(min_value=0, allow_null=True, required=False)

    class Meta:
        model = Quota
        fields = ["id", "team", "pool", "max_gpus", "gpu_hours_per_month", "updated_at"]
        read_only_fields = ["updated_at"]
        # Uniqueness of (team, pool) is the service's get-or-create, not a 400 here.
        validators: list = []

    def validate(self, attrs: dict) -> dict:
        for name in ("team", "pool"):
            if self.instance is not None and name in attrs and attrs[name] != getattr(self.instance, name):
                raise serializers.ValidationError(
                    {name: serializers.ErrorDetail(f"A quota's {name} cannot change; create another quota.",
                                                   code="immutable")}
                )
        return attrs
