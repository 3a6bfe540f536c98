"""Inventory API for staff: clusters, nodes and GPUs (pools are served by allocations' API with occupancy)."""
from rest_framework import permissions, viewsets

from inventory.api.serializers import ClusterSerializer, GpuSerializer, NodeSerializer
from inventory.filters import ClusterFilterSet, GpuFilterSet, NodeFilterSet
from inventory.models import Cluster, Gpu, Node


class StaffOnly(permissions.IsAdminUser):
    pass


class ClusterViewSet(viewsets.ModelViewSet):
    queryset = Cluster.objects.all()
    serializer_class = ClusterSerializer
    filterset_class = ClusterFilterSet
    permission_classes = [StaffOnly]


class NodeViewSet(viewsets.ModelViewSet):
    queryset = Node.objects.select_related("cluster")
    serializer_class = NodeSerializer
    filterset_class = NodeFilterSet
    permission_classes = [StaffOnly]


class GpuViewSet(viewsets.ModelViewSet):
    queryset = Gpu.objects.select_related("node", "pool")
    serializer_class = GpuSerializer
    filterset_class = GpuFilterSet
    permission_classes = [StaffOnly]
