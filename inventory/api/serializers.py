from django.utils.translation import gettext_lazy as _
from rest_framework import serializers
from rest_framework.validators import UniqueValidator

from common.api import CleanModelSerializer, RefusesUnknownFields, SlugLookupField
from inventory import services
from inventory.models import Cluster, Gpu, GpuPool, HostToken, Node


class PrometheusAuthSerializer(RefusesUnknownFields, serializers.Serializer):
    bearer_token = serializers.CharField(required=False, allow_blank=True, max_length=4096, trim_whitespace=False)
    username = serializers.CharField(required=False, allow_blank=True, max_length=256)
    password = serializers.CharField(required=False, allow_blank=True, max_length=1024, trim_whitespace=False)


class ClusterSerializer(RefusesUnknownFields, CleanModelSerializer):
    """Kubernetes credentials are write-only: `kubeconfig` is stored encrypted and never shown back;
    `has_credentials` says whether one (or in_cluster) is set."""

    slug = serializers.SlugField(max_length=64, required=False, help_text=_("Default: made from the name"),
                                 validators=[UniqueValidator(queryset=Cluster.objects.all())])
    kubeconfig = serializers.CharField(write_only=True, required=False, allow_blank=True, trim_whitespace=False,
                                       style={"base_template": "textarea.html"},
                                       help_text=_("kubeconfig YAML (credentials inline); stored encrypted, never "
                                                 "shown back. \"\" removes it."))
    has_credentials = serializers.BooleanField(read_only=True)
    prometheus_auth = PrometheusAuthSerializer(write_only=True, required=False,
                                               help_text=_("Bearer token, or username and password, for "
                                                         "prometheus_url; stored encrypted, never shown back. {} "
                                                         "removes it."))
    has_prometheus_auth = serializers.BooleanField(read_only=True)
    telemetry_period_seconds = serializers.FloatField(required=False, min_value=services.MIN_TELEMETRY_PERIOD,
                                                      max_value=services.MAX_TELEMETRY_PERIOD)

    class Meta:
        model = Cluster
        fields = ["id", "name", "slug", "kind", "description", "in_cluster", "kubeconfig", "has_credentials",
                  "telemetry_source", "prometheus_url", "prometheus_auth", "has_prometheus_auth", "exporter_selector",
                  "exporter_namespace", "exporter_port", "exporter_via_proxy", "telemetry_period_seconds",
                  "last_discovered_at", "discovery_error", "created_at"]
        read_only_fields = ["last_discovered_at", "discovery_error"]

    def validate(self, attrs):
        kubeconfig = attrs.pop("kubeconfig", None)
        prometheus_auth = attrs.pop("prometheus_auth", None)
        attrs = super().validate(attrs)
        if kubeconfig is not None:
            attrs["kubeconfig"] = kubeconfig
        if prometheus_auth is not None:
            attrs["prometheus_auth"] = prometheus_auth
        return attrs

    def create(self, validated_data):
        return services.cluster_create(actor=self.context["request"].user, **validated_data)

    def update(self, instance, validated_data):
        return services.cluster_update(actor=self.context["request"].user, cluster=instance, **validated_data)


class DiscoveryReportSerializer(serializers.Serializer):
    cluster = serializers.CharField()
    nodes = serializers.IntegerField(help_text=_("Nodes listed by the API server"))
    gpus = serializers.IntegerField(help_text=_("GPUs found on them"))
    changes = serializers.ListField(child=serializers.CharField(), help_text=_("What changed in the inventory"))


class NodeSerializer(RefusesUnknownFields, CleanModelSerializer):
    cluster = SlugLookupField(slug_field="slug", queryset=Cluster.objects.all())

    class Meta:
        model = Node
        fields = ["id", "cluster", "name", "healthy", "schedulable", "labels", "cpu_milli", "memory_mib",
                  "last_seen_at", "created_at"]
        read_only_fields = ["last_seen_at"]


class GpuSerializer(RefusesUnknownFields, CleanModelSerializer):
    pool = SlugLookupField(slug_field="slug", queryset=GpuPool.objects.all(), allow_null=True,
                                        required=False)

    class Meta:
        model = Gpu
        fields = ["id", "node", "pool", "index", "uuid", "model_name", "memory_mib", "mig_capable",
                  "driver_version", "cuda_version", "healthy", "created_at"]

    def update(self, instance, validated_data):
        # Through the service: a GPU that is booked must not change pool or node under its reservation.
        return services.gpu_update(actor=self.context["request"].user, gpu=instance, **validated_data)


class HostTokenSerializer(RefusesUnknownFields, serializers.ModelSerializer):
    cluster = SlugLookupField(slug_field="slug", queryset=Cluster.objects.all())
    created_by = serializers.CharField(source="created_by.username", default=None, read_only=True,
                                       allow_null=True)  # None once the account is deleted

    class Meta:
        model = HostToken
        fields = ["id", "cluster", "host_name", "prefix", "created_by", "created_at", "last_used_at", "revoked_at"]
        read_only_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]


class HostTokenCreatedSerializer(HostTokenSerializer):
    key = serializers.CharField(read_only=True, help_text=_("Shown once; store it on the host"))

    class Meta(HostTokenSerializer.Meta):
        fields = HostTokenSerializer.Meta.fields + ["key"]


def _weight(**kwargs) -> serializers.DecimalField:
    # A JSON number both ways (coerce_to_string=False): weights are small numbers people read and type.
    return serializers.DecimalField(max_digits=6, decimal_places=3, coerce_to_string=False, **kwargs)


def _positive(value):
    if value <= 0:
        raise serializers.ValidationError(_("weight must be greater than 0."), code="positive")
    return value


class GpuModelWeightChangeSerializer(serializers.Serializer):
    actor = serializers.CharField(source="actor.username", default=None, allow_null=True, read_only=True,
                                  help_text=_("Who changed it (null once the account is deleted)"))
    at = serializers.DateTimeField(read_only=True)
    old_weight = _weight(read_only=True)
    new_weight = _weight(read_only=True)


class GpuModelSerializer(serializers.Serializer):
    """A GPU model (Gpu.model_name) with what one whole card of it counts in GPU-equivalents."""

    name = serializers.CharField(read_only=True, help_text=_("The model name as the inventory reports it"))
    weight = _weight(read_only=True, help_text=_("GE one whole GPU of this model counts as; 1.0 unless staff set it"))
    weighted = serializers.BooleanField(read_only=True, help_text=_("Whether staff set the weight (else 1.0)"))
    gpus = serializers.IntegerField(read_only=True, help_text=_("GPUs of this model in the inventory"))
    updated_at = serializers.DateTimeField(read_only=True, allow_null=True)


class GpuModelDetailSerializer(GpuModelSerializer):
    history = GpuModelWeightChangeSerializer(many=True, read_only=True, help_text=_("Weight changes, newest first"))


class GpuModelWeightInput(RefusesUnknownFields, serializers.Serializer):
    """A new weight for a GPU model; any other field is refused (`unknown_field`)."""

    weight = _weight(validators=[_positive], help_text=_("Greater than 0, at most 999.999, three decimal places"))
