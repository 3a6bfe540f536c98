"""Monitoring API: the agents' telemetry ingest, alert rules (staff), alerts (each sees theirs), pool history."""
from __future__ import annotations

import logging

import django_filters
from django.conf import settings
from django.db import OperationalError
from django.utils.translation import gettext as _
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, permissions, viewsets
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.errors import NotFound, PayloadTooLarge, ValidationFailed
from common.outages import as_service_unavailable
from inventory.api.agent import AgentView
from monitoring import ingest, selectors
from monitoring.api.serializers import AlertRuleSerializer, AlertSerializer, SilenceSerializer
from monitoring.models import Alert, AlertRule, Silence


log = logging.getLogger(__name__)


class TelemetryParser(BaseParser):
    """An agent's JSON body, decoded by ingest.decode_body (typed structs when every value is the type
    agents send). Strict like DRF's parser: NaN and Infinity are refused. Not DRF's JSONParser, which
    reads the body through Django's DATA_UPLOAD_MAX_MEMORY_SIZE: the ingest has its own limit,
    TELEMETRY_MAX_BODY_BYTES, sized for TELEMETRY_MAX_SAMPLES_PER_REQUEST samples."""

    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None):
        limit = settings.TELEMETRY_MAX_BODY_BYTES
        too_large = PayloadTooLarge(_("The request body is larger than %(limit)d bytes; send fewer batches at once.")
                                    % {"limit": limit}, field="body", rule="too_large")
        declared = parser_context["request"].META.get("CONTENT_LENGTH") or ""
        if declared.isdigit() and int(declared) > limit:
            raise too_large  # without reading it (config.request_body then closes the connection)
        body = stream.read(limit + 1)
        if len(body) > limit:
            raise too_large
        try:
            return ingest.decode_body(body)
        except ValueError as error:
            raise ParseError(_("JSON parse error - %(error)s") % {"error": error}) from None


class TelemetryView(AgentView):
    """An agent's batch of samples: {"stream", "batches": [{"seq", "t", "gpus": [...]}]}; answers the ack."""

    # JSON only, both ways: no browsable-API negotiation on a path that only agents call.
    parser_classes = [TelemetryParser]
    renderer_classes = [JSONRenderer]

    @extend_schema(request=dict, responses={200: dict})
    def post(self, request: Request) -> Response:
        try:
            result = ingest.telemetry_ingest(token=request.auth, payload=request.data)
        except OperationalError as error:
            if as_service_unavailable(error) is not None:
                raise  # the database is gone, not busy: 503 database_unavailable
            # Overload (SQLite's write lock held past its timeout, PostgreSQL out of connections):
            # nothing was stored, and the agent keeps the batch and sends it again.
            log.warning("telemetry from %s refused, storage busy: %s", request.auth, error)
            raise ingest.StorageBusy(_("Telemetry storage is busy; send this batch again shortly."),
                                     field="batches", rule="busy") from error
        return Response(result.as_dict())


class StaffOnly(permissions.IsAdminUser):
    pass


class AlertRuleViewSet(viewsets.ModelViewSet):
    queryset = AlertRule.objects.select_related("pool")
    serializer_class = AlertRuleSerializer
    permission_classes = [StaffOnly]


class SilenceViewSet(viewsets.ModelViewSet):
    """Staff: silences with an end time (expired ones stay listed as history; delete lifts one early)."""

    queryset = Silence.objects.select_related("rule", "pool", "created_by")
    serializer_class = SilenceSerializer
    permission_classes = [StaffOnly]

    def perform_create(self, serializer) -> None:
        serializer.save(created_by=self.request.user)


class AlertFilterSet(django_filters.FilterSet):
    state = django_filters.ChoiceFilter(choices=Alert.State.choices)
    pool = django_filters.CharFilter(field_name="pool__slug")
    team = django_filters.CharFilter(field_name="team__slug")

    class Meta:
        model = Alert
        fields = ["state", "pool", "team"]


class AlertViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Alerts, newest first: staff see all, members those of their teams and the pools their teams use."""

    serializer_class = AlertSerializer
    filterset_class = AlertFilterSet

    def get_queryset(self):
        return selectors.alerts_visible_to(self.request.user)


def _history_response(request: Request, scope: dict, gpus: dict[int, str]) -> Response:
    """Per-GPU history of `gpus` (id → uuid) for the ?range= asked (default 15m)."""
    range_key = request.query_params.get("range", "15m")
    if range_key not in selectors.RANGES:
        raise ValidationFailed(_("range must be one of %(ranges)s.") % {"ranges": ", ".join(selectors.RANGES)},
                               field="range", rule="invalid_choice")
    history = selectors.pool_history(list(gpus), range_key)
    return Response({**scope, "range": range_key, "resolution": history.resolution,
                     "step": history.step, "start": history.start, "end": history.end,
                     "gpus": [{"gpu": gpu_id, "uuid": gpus.get(gpu_id), **series}
                              for gpu_id, series in history.series.items()]})


class PoolHistoryView(APIView):
    """GET /api/v1/pools/<slug>/telemetry/?range=5m|15m|1h|24h|7d|30d: per-GPU history (avg and max per point)."""

    @extend_schema(parameters=[OpenApiParameter("range", str, enum=list(selectors.RANGES))], responses={200: dict})
    def get(self, request: Request, slug: str) -> Response:
        pool = selectors.pool_for_viewer(request.user, slug)
        if pool is None:
            raise NotFound(_("No such pool, or not one your teams use."), field="pool", rule="not_found")
        return _history_response(request, {"pool": pool.slug}, dict(pool.gpus.values_list("id", "uuid")))


class NodeHistoryView(APIView):
    """GET /api/v1/nodes/<id>/telemetry/?range=5m|15m|1h|24h|7d|30d: per-GPU history of one node's GPUs."""

    @extend_schema(parameters=[OpenApiParameter("range", str, enum=list(selectors.RANGES))], responses={200: dict})
    def get(self, request: Request, node_id: int) -> Response:
        node = selectors.node_for_viewer(request.user, node_id)
        if node is None:
            raise NotFound(_("No such node, or not one you may watch."), field="node", rule="not_found")
        return _history_response(request, {"node": node.pk}, dict(node.gpus.values_list("id", "uuid")))
