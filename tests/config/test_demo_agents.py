"""The embedded demo's simulated agents register the demo hosts and stream telemetry for the demo's GPUs."""
from __future__ import annotations

import threading

import pytest

from config.demo import load_demo
from config.demo_agents import start_demo_agents
from inventory.models import Gpu, HostToken, Node
from monitoring.models import Sample
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _stop(agents) -> None:
    """Stop the agents and wait for their threads: none may write while the test database is flushed."""
    for agent in agents:
        agent.stop.set()
    wait_for(lambda: not [t for t in threading.enumerate()
                          if t.name.startswith("demo-agent-") or t.name == "telemetry"],
             timeout=30, message="the demo agents' threads to end")


def test_demo_agents_feed_the_demo_gpus(live_server):
    load_demo(admin_password="demo-admin-password")
    gpus = set(Gpu.objects.values_list("id", flat=True))
    agents = start_demo_agents(live_server.url)
    try:
        assert len(agents) == 5
        wait_for(lambda: set(Sample.objects.values_list("gpu_id", flat=True)) == gpus, timeout=30,
                 message="samples of every demo GPU")
    finally:
        _stop(agents)
    assert Gpu.objects.count() == 28 and Gpu.objects.filter(healthy=True).count() == 28  # no stray GPUs
    # The MIG pool's simulated cards report the instances of its layout (all-balanced: 2g, 1g, 1g, 3g).
    for gpu in Gpu.objects.filter(pool__slug="a100-mig"):
        assert sorted((d["profile"], d["start"]) for d in gpu.mig_devices) == [
            ("1g.10gb", 2), ("1g.10gb", 3), ("2g.20gb", 0), ("3g.40gb", 4)]
    assert all(n.labels.get("gpupool.io/agent-backend") == "simulated" for n in Node.objects.all())
    # Started again (a restart of the demo): one live token per host, the old ones revoked.
    _stop(start_demo_agents(live_server.url))
    assert HostToken.objects.filter(revoked_at=None).count() == 5
