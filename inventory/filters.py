"""One FilterSet per inventory model, shared by the API and the pages."""
import django_filters

from inventory.models import Cluster, Gpu, GpuPool, Node


class ClusterFilterSet(django_filters.FilterSet):
    class Meta:
        model = Cluster
        fields = ["kind", "slug"]


class NodeFilterSet(django_filters.FilterSet):
    cluster = django_filters.CharFilter(field_name="cluster__slug")

    class Meta:
        model = Node
        fields = ["cluster", "healthy", "schedulable", "name"]


class GpuFilterSet(django_filters.FilterSet):
    pool = django_filters.CharFilter(field_name="pool__slug")
    node = django_filters.NumberFilter(field_name="node_id")
    model_name = django_filters.CharFilter(lookup_expr="icontains")
    unpooled = django_filters.BooleanFilter(field_name="pool", lookup_expr="isnull")

    class Meta:
        model = Gpu
        fields = ["pool", "node", "healthy", "model_name", "mig_capable", "uuid"]


class GpuPoolFilterSet(django_filters.FilterSet):
    class Meta:
        model = GpuPool
        fields = ["sharing_mode", "slug"]
