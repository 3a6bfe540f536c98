"""Inventory API for staff: clusters, nodes and GPUs (pools are served by allocations' API with occupancy)."""
from django.utils.translation import gettext as _
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, permissions, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from common.api import IsStaffOrReadOnly
from common.errors import NotFound, ValidationFailed
from inventory import selectors, services

from inventory.api.serializers import (
    ClusterSerializer,
    DiscoveryReportSerializer,
    GpuModelDetailSerializer,
    GpuModelSerializer,
    GpuModelWeightInput,
    GpuSerializer,
    HostTokenCreatedSerializer,
    HostTokenSerializer,
    NodeSerializer,
)
from inventory.filters import ClusterFilterSet, GpuFilterSet, NodeFilterSet
from inventory.models import Cluster, Gpu, GpuModel, HostToken, Node


class StaffOnly(permissions.IsAdminUser):
    pass


class ClusterViewSet(viewsets.ModelViewSet):
    """Staff register clusters; a Kubernetes one with `kubeconfig` (write-only, stored encrypted) or
    `in_cluster: true`, and discover its nodes and GPUs now with `POST …/discover/`."""

    queryset = Cluster.objects.all()
    serializer_class = ClusterSerializer
    filterset_class = ClusterFilterSet
    permission_classes = [StaffOnly]

    @extend_schema(request=None, responses=DiscoveryReportSerializer)
    @action(detail=True, methods=["post"])
    def discover(self, request: Request, pk: str) -> Response:
        """List the cluster's nodes now and update the inventory; 502/503 naming the cluster's error."""
        from inventory.kubernetes.client import ClusterError, as_application_error
        from inventory.kubernetes.discovery import discover_cluster

        cluster = self.get_object()
        if cluster.kind != Cluster.Kind.KUBERNETES:
            raise ValidationFailed(_("Only Kubernetes clusters are discovered; hosts register through their agent."),
                                   field="cluster", rule="not_kubernetes")
        if not cluster.has_credentials:
            raise ValidationFailed(_("The cluster has no kubeconfig (or in_cluster) to connect with."),
                                   field="kubeconfig", rule="required")
        try:
            report = discover_cluster(cluster)
        except ClusterError as exc:
            raise as_application_error(cluster.name, exc) from exc
        return Response(DiscoveryReportSerializer(report).data)


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


class HostTokenViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                       viewsets.GenericViewSet):
    """Staff create a token per bare-metal host (the key is in the create answer only) and revoke it."""

    queryset = HostToken.objects.select_related("cluster", "created_by")
    serializer_class = HostTokenSerializer
    permission_classes = [StaffOnly]

    @extend_schema(responses={201: HostTokenCreatedSerializer})
    def create(self, request: Request) -> Response:
        data = HostTokenSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        token, key = services.host_token_create(actor=request.user, cluster=data.validated_data["cluster"],
                                                host_name=data.validated_data["host_name"])
        token.key = key
        return Response(HostTokenCreatedSerializer(token).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=HostTokenSerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str) -> Response:
        token = services.host_token_revoke(actor=request.user, token=self.get_object())
        return Response(HostTokenSerializer(token).data)


MODEL_NAME = OpenApiParameter(
    "name", OpenApiTypes.STR, OpenApiParameter.PATH,
    description="The model name exactly as the inventory reports it (Gpu.model_name), URL-encoded: "
                "`NVIDIA%20H100%2080GB%20HBM3`.")


@extend_schema(parameters=[MODEL_NAME])
class GpuModelViewSet(viewsets.GenericViewSet):
    """GPU models and their weights in GPU-equivalents (GE). Everyone signed in reads them (every
    model the inventory holds, 1.0 where staff set none, and how many GPUs of it there are); staff
    set a weight with `PATCH /api/v1/gpu-models/{name}/ {"weight": 0.6}`, `name` URL-encoded. A
    change binds new bookings and checks only, and is recorded (`history` of the model's detail)."""

    permission_classes = [IsStaffOrReadOnly]
    # Never read (the actions read through selectors): it tells the schema what `name` is a field of.
    queryset = GpuModel.objects.none()
    lookup_field = "name"
    # Any name without a slash (model names have spaces, dots, dashes); the path is percent-decoded
    # before it is matched, so `%20` arrives as a space.
    lookup_value_regex = r"[^/]+"
    pagination_class = None  # one row per GPU model: a handful, not a growing list
    serializer_class = GpuModelSerializer
    http_method_names = ["get", "patch", "head", "options"]

    @extend_schema(responses=GpuModelSerializer(many=True))
    def list(self, request: Request) -> Response:
        return Response(GpuModelSerializer(selectors.gpu_models(), many=True).data)

    @extend_schema(responses=GpuModelDetailSerializer)
    def retrieve(self, request: Request, name: str) -> Response:
        return Response(GpuModelDetailSerializer(self._model(name)).data)

    @extend_schema(request=GpuModelWeightInput, responses=GpuModelDetailSerializer)
    def partial_update(self, request: Request, name: str) -> Response:
        data = GpuModelWeightInput(data=request.data)
        data.is_valid(raise_exception=True)
        services.gpu_model_weight_set(actor=request.user, name=self._name(name), weight=data.validated_data["weight"])
        return Response(GpuModelDetailSerializer(self._model(name)).data)

    @staticmethod
    def _name(name: str) -> str:
        # A NUL byte must not reach PostgreSQL (it refuses NUL in text: a 500).
        if "\x00" in name or len(name) > 128:
            raise NotFound(_("No GPU model %(name)r.") % {"name": name[:128]}, field="name", rule="does_not_exist")
        return name

    def _model(self, name: str) -> selectors.GpuModelInfo:
        info = selectors.gpu_model(self._name(name))
        if info is None:
            raise NotFound(_("No GPU of model %(name)r is in the inventory.") % {"name": name[:128]}, field="name",
                           rule="does_not_exist")
        return info
