"""Simulated host agents for the embedded demo, so its pool pages have live charts.

Each demo host gets a fresh host token and a real agent (the `agent` package, the same
code as `python -m agent --simulate`) on a thread, talking to the demo server:
registration, heartbeats, 1 Hz telemetry, and GPU leases over its WebSocket lease channel
(kept under var/demo-agents/<host>/, so reservations in the demo really wait for the
host to take them). The simulation reports the demo's own GPU
UUIDs, so the agents feed the GPUs the demo data created (and say "simulated" in the
node's agent-backend label).
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from inventory import services
from inventory.models import HostToken, Node
from inventory.sharing import mig_dynamic, mig_layout_names

log = logging.getLogger(__name__)

# Tokens made for demo agents are named by this prefix in the cluster's token list.
SPEC_BY_MODEL = {"NVIDIA H100 80GB HBM3": "H100", "NVIDIA L40S": "L40S", "NVIDIA H200": "H200", "NVIDIA L4": "L4",
                 "NVIDIA A100-SXM4-80GB": "A100-80GB"}


@transaction.atomic
def _tokens() -> list[tuple[Node, str, str, list[str], bool]]:
    """(node, key, simulate spec, uuids) for every bare-metal demo host whose GPUs we can simulate."""
    admin = get_user_model().objects.filter(is_superuser=True).order_by("pk").first()
    if admin is None:
        return []
    out = []
    for node in Node.objects.filter(cluster__kind="baremetal").select_related("cluster").order_by("name"):
        gpus = list(node.gpus.select_related("pool").order_by("index"))
        models = {SPEC_BY_MODEL.get(g.model_name) for g in gpus}
        if not gpus or None in models or len(models) != 1:
            continue
        # One live token per host: the demo's previous run left one behind.
        HostToken.objects.filter(cluster=node.cluster, host_name=node.name, revoked_at=None).update(
            revoked_at=timezone.now())
        _, key = services.host_token_create(actor=admin, cluster=node.cluster, host_name=node.name)
        spec = f"{len(gpus)}x{models.pop()}"
        dynamic = False
        pools = {g.pool for g in gpus}
        if len(pools) == 1 and (pool := pools.pop()) is not None and pool.sharing_mode == "mig":
            # The simulated cards are carved as the pool's layout, as mig-parted would have done on a host.
            layout = mig_layout_names(pool.sharing_config)
            # A dynamic pool without an idle layout: MIG mode, no instances yet (its agent carves them).
            spec += ":mig=" + ((layout if isinstance(layout, str) else "+".join(layout)) or "all-enabled")
            dynamic = mig_dynamic(pool.sharing_config)
        out.append((node, key, spec, [g.uuid for g in gpus], dynamic))
    return out


def start_demo_agents(base_url: str) -> list:
    """Start one simulated agent thread per demo host; returns the agents (their `stop` events end them)."""
    from agent import lease_channel, telemetry
    from agent.__main__ import Agent
    from agent.leases import LeaseStore
    from agent.portal_client import PortalClient
    from agent.simulated import SimulatedBackend

    agents = []
    for node, key, spec, uuids, dynamic in _tokens():
        backend = SimulatedBackend(spec, node.name, seed=node.pk, uuids=uuids)
        client = PortalClient(base_url, key)
        # simulated: an MPS lease records the daemon it would start, never starts a real one on the demo machine
        leases = LeaseStore(Path(settings.VAR_DIR) / "demo-agents" / node.name, simulated=True)
        # A simulated host of a dynamic MIG pool carves its instances as the leases ask (the opt-in a real host
        # would be started with).
        agent = Agent(client, backend, node.name, heartbeat=10.0, max_backoff=5.0, leases=leases,
                      allow_mig_reconfigure=dynamic)
        threading.Thread(target=agent.run, name=f"demo-agent-{node.name}", daemon=True).start()
        channel = lease_channel.LeaseChannel(base_url, key, agent.take_leases, agent.stop,
                                             ready=lambda agent=agent: agent.registered)
        channel.connected = agent.lease_channel_open
        lease_channel.start(channel)
        telemetry.start(client, backend, agent.stop, lambda agent=agent: agent.registered)
        agents.append(agent)
        log.warning("SIMULATED NVML: demo agent for %s reports %s", node.name, spec)
    return agents
