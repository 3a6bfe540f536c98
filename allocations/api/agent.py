"""The lease exchange with host agents: `POST /api/v1/agent/leases/` (`Authorization: Host <key>`)."""
from __future__ import annotations

import re

from django.conf import settings
from django.utils.translation import gettext_lazy as _
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from allocations.apply.backends.agent import host_lease_report, host_leases
from inventory.api.agent import AgentView


# "<reservation id>:<GPU UUID>", "<reservation id>:<MIG device UUID>", or for a MIG instance the GPU did not
# report a device for, "<reservation id>:<GPU UUID>/<start slice>" (allocations.booking.mig_instance_id).
LEASE_KEY = r"^[0-9]{1,12}:((GPU|MIG)-[0-9A-Za-z-]{8,60}|GPU-[0-9A-Za-z-]{8,60}/[0-7])$"
MAX_LEASES = 1024  # per report: far above the GPUs (and MIG slices) one host has


class LeasesInput(serializers.Serializer):
    held = serializers.ListField(
        child=serializers.RegexField(LEASE_KEY, max_length=80),
        max_length=MAX_LEASES,
        help_text=_("Lease keys the agent enforces now: '<reservation id>:<GPU UUID>', or for a MIG instance "
                  "'<reservation id>:<MIG device UUID>' ('<reservation id>:<GPU UUID>/<start slice>' where the "
                  "GPU reported no device for it)"),
    )
    failed = serializers.DictField(child=serializers.CharField(max_length=500), default=dict,
                                   help_text=_("Leases the agent could not apply: {key: why}"))
    unleased_in_use = serializers.ListField(child=serializers.RegexField(r"^(GPU|MIG)-[0-9A-Za-z-]{8,60}$"),
                                            max_length=MAX_LEASES, default=list,
                                            help_text=_("GPUs running processes that no lease covers"))

    def validate_failed(self, value: dict) -> dict:
        # Bounded like `held`: unbounded, one report of 5,000 keys x 500 characters was stored whole.
        if len(value) > MAX_LEASES:
            raise serializers.ValidationError(_("Ensure this field has no more than %(max)d elements.")
                                              % {"max": MAX_LEASES}, code="max_length")
        bad = [key for key in value if not re.match(LEASE_KEY, key)]
        if bad:
            raise serializers.ValidationError(_("not lease keys: %(keys)s") % {"keys": ", ".join(bad[:5])})
        return value


class LeasesView(AgentView):
    """The agent says which leases it holds; the portal answers with the ones it should hold."""

    @extend_schema(request=LeasesInput, responses={200: dict})
    def post(self, request: Request) -> Response:
        data = LeasesInput(data=request.data)
        data.is_valid(raise_exception=True)
        node = request.auth.registered_node()
        if node is None:
            raise exceptions.NotFound(_("This host has not registered yet: call /api/v1/agent/register/ first."))
        host_lease_report(node=node, **data.validated_data)
        return Response({"leases": host_leases(node), "poll_seconds": settings.AGENT_HEARTBEAT_SECONDS})
