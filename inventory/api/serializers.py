from rest_framework import serializers

from common.api import CleanModelSerializer
from inventory.models import Cluster, Gpu, GpuPool, HostToken, Node


class ClusterSerializer(CleanModelSerializer):
    class Meta:
        model = Cluster
        fields = ["id", "name", "slug", "kind", "description", "created_at"]


class NodeSerializer(CleanModelSerializer):
    cluster = serializers.SlugRelatedField(slug_field="slug", queryset=Cluster.objects.all())

    class Meta:
        model = Node
        fields = ["id", "cluster", "name", "healthy", "schedulable", "labels", "cpu_milli", "memory_mib",
                  "last_seen_at", "created_at"]
        read_only_fields = ["last_seen_at"]


class GpuSerializer(CleanModelSerializer):
    pool = serializers.SlugRelatedField(slug_field="slug", queryset=GpuPool.objects.all(), allow_null=True,
                                        required=False)

    class Meta:
        model = Gpu
        fields = ["id", "node", "pool", "index", "uuid", "model_name", "memory_mib", "mig_capable",
                  "driver_version", "cuda_version", "healthy", "created_at"]


class HostTokenSerializer(serializers.ModelSerializer):
    cluster = serializers.SlugRelatedField(slug_field="slug", queryset=Cluster.objects.all())
    created_by = serializers.CharField(source="created_by.username", default=None, read_only=True)

    class Meta:
        model = HostToken
        fields = ["id", "cluster", "host_name", "prefix", "created_by", "created_at", "last_used_at", "revoked_at"]
        read_only_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]


class HostTokenCreatedSerializer(HostTokenSerializer):
    key = serializers.CharField(read_only=True, help_text="Shown once; store it on the host")

    class Meta(HostTokenSerializer.Meta):
        fields = HostTokenSerializer.Meta.fields + ["key"]
