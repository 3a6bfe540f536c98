"""The API host agents call: `Authorization: Host <key>`; an agent reads and reports its own host only."""
from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.utils.translation import gettext_lazy as _
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import extend_schema
from rest_framework import authentication, exceptions, permissions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from inventory import services
from inventory.models import HostToken


class HostTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Host"

    def authenticate(self, request: Request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].decode(errors="replace") != self.keyword:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed(_("Give the host token as 'Authorization: Host <key>'."))
        token = services.host_token_for_key(header[1].decode(errors="replace"))
        if token is None:
            raise exceptions.AuthenticationFailed(_("Unknown or revoked host token."))
        return AnonymousUser(), token

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class HostTokenScheme(OpenApiAuthenticationExtension):
    target_class = HostTokenAuthentication
    name = "hostToken"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "Authorization",
                "description": "Host agents: `Host <key>` (a per-host token created by staff)"}


class IsHostAgent(permissions.BasePermission):
    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, HostToken)


class MigDeviceInput(serializers.Serializer):
    """One MIG instance a GPU is carved into, as the host's agent read it from NVML."""

    uuid = serializers.RegexField(r"^MIG-[0-9A-Za-z-]{8,60}$", max_length=64,
                                  help_text=_("The MIG device UUID (what CUDA_VISIBLE_DEVICES takes)"))
    profile = serializers.RegexField(r"^[1-8]g\.[0-9]{1,4}gb(\+me)?$", max_length=32,
                                     help_text=_("GPU instance profile, e.g. 1g.10gb or 1g.10gb+me"))
    start = serializers.IntegerField(min_value=0, max_value=7, help_text=_("First memory slice (0-7)"))
    memory_mib = serializers.IntegerField(min_value=1, max_value=10_000_000)

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:  # a typo would otherwise vanish silently
                raise serializers.ValidationError(
                    {name: serializers.ErrorDetail(_("Unknown field."), code="unknown") for name in unknown})
        return super().to_internal_value(data)


class ReportedGpuInput(serializers.Serializer):
    uuid = serializers.RegexField(r"^(GPU|MIG)-[0-9A-Za-z-]{8,60}$", max_length=64)
    index = serializers.IntegerField(min_value=0, max_value=255)
    name = serializers.CharField(max_length=128)
    memory_mib = serializers.IntegerField(min_value=1, max_value=10_000_000)
    mig_capable = serializers.BooleanField(default=False)
    mig_mode = serializers.BooleanField(default=False)
    driver_version = serializers.CharField(max_length=64, allow_blank=True, default="")
    cuda_version = serializers.CharField(max_length=16, allow_blank=True, default="")
    # Left out by an agent that does not read MIG: the GPU keeps what it had.
    # A ListField, not many=True: its own refusals (not a list, too long) then name `mig_devices` itself.
    mig_devices = serializers.ListField(child=MigDeviceInput(), required=False, max_length=8,
                                        help_text=_("The MIG instances the GPU is carved into now (MIG mode on)"))

    def validate_mig_devices(self, value: list[dict]) -> list[dict]:
        starts = [device["start"] for device in value]
        if len(set(starts)) != len(starts):
            raise serializers.ValidationError(_("Two MIG instances start at the same slice."), code="duplicate_start")
        return sorted(value, key=lambda device: device["start"])


class RegisterInput(serializers.Serializer):
    hostname = serializers.CharField(max_length=253)
    backend = serializers.ChoiceField(choices=["nvml", "simulated"])
    agent_version = serializers.CharField(max_length=32)
    gpus = ReportedGpuInput(many=True, max_length=64)


class AgentView(APIView):
    authentication_classes = [HostTokenAuthentication]
    permission_classes = [IsHostAgent]
    throttle_classes: list = []


class RegisterView(AgentView):
    """The agent says which host it is and which GPUs it has; the portal creates or refreshes them."""

    @extend_schema(request=RegisterInput, responses={200: dict})
    def post(self, request: Request) -> Response:
        data = RegisterInput(data=request.data)
        data.is_valid(raise_exception=True)
        gpus = [services.ReportedGpu(**{k: ([dict(d) for d in v] if k == "mig_devices" else v)
                                        for k, v in g.items() if k != "mig_mode"})
                for g in data.validated_data["gpus"]]
        node = services.host_register(token=request.auth, gpus=gpus, backend=data.validated_data["backend"])
        return Response({"node": node.pk, "name": node.name, "gpus": len(gpus),
                         "heartbeat_seconds": settings.AGENT_HEARTBEAT_SECONDS})


class HeartbeatView(AgentView):
    @extend_schema(request=None, responses={200: dict})
    def post(self, request: Request) -> Response:
        node = services.host_heartbeat(token=request.auth)
        if node is None:
            raise exceptions.NotFound(_("This host has not registered yet: call /api/v1/agent/register/ first."))
        return Response({"node": node.pk, "heartbeat_seconds": settings.AGENT_HEARTBEAT_SECONDS})
