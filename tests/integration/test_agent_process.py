"""A real `python -m agent` process (simulated NVML) against the running portal."""
from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest

from inventory import services
from inventory.models import Node
from tests.conftest import BASE_DIR, wait_for
from tests.factories import ClusterFactory, UserFactory

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_an_agent_registers_heartbeats_stops_on_revocation_and_its_host_goes_silent(live_server, settings, tmp_path):
    settings.AGENT_HEARTBEAT_SECONDS = 0.3
    staff = UserFactory(username="root", is_staff=True)
    token, key = services.host_token_create(actor=staff, cluster=ClusterFactory(slug="lab"), host_name="sim-01")
    log = open(tmp_path / "agent.log", "wb")
    process = subprocess.Popen([sys.executable, "-m", "agent", "--portal", live_server.url, f"--token={key}",
                                "--simulate", "2xH100,2xA100-80GB:mig=all-balanced", "--hostname", "sim-01", "--state-dir", str(tmp_path / "state"),
                                "--no-lease-channel"],
                               cwd=BASE_DIR, stdout=log, stderr=subprocess.STDOUT)
    try:
        node = wait_for(lambda: Node.objects.filter(name="sim-01").first(), message="registration")
        assert node.gpus.count() == 4 and node.healthy
        # The MIG layout came with the registration: the instances, at their start slices.
        assert [[(d["profile"], d["start"]) for d in gpu.mig_devices] for gpu in node.gpus.order_by("index")] == [
            [], [], *[[("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4)]] * 2]
        first_seen = node.last_seen_at
        wait_for(lambda: Node.objects.get(pk=node.pk).last_seen_at > first_seen, message="a heartbeat")

        services.host_token_revoke(actor=staff, token=token)
        assert process.wait(timeout=20) == 2  # refused token: it stops rather than retry forever
    finally:
        if process.poll() is None:
            process.kill()
        log.close()
    output = (tmp_path / "agent.log").read_text()
    assert "SIMULATED NVML" in output and "revoked or wrong" in output
    assert services.nodes_mark_silent(timeout=timedelta(seconds=0)) == [node.pk]
    assert not Node.objects.get(pk=node.pk).healthy
