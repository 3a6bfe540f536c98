"""Applying on bare metal for real: two `python -m agent` processes, the portal under uvicorn (their
WebSocket lease channels), and a Celery worker with beat, on PostgreSQL and Redis.

A reservation becomes active only once its host's agent holds the GPU leases; when that
agent dies, beat marks the host silent, failover moves the reservation to the other
host, whose agent takes the leases; a release makes the agent drop them.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from datetime import timedelta

import pytest
from django.utils import timezone

from allocations.models import Reservation
from allocations.services import ReservationRequest, reservation_create
from inventory import services as inventory_services
from inventory.models import GpuPool, Node
from tests.conftest import BASE_DIR, wait_for
from tests.factories import ClusterFactory, MembershipFactory, QuotaFactory, TeamFactory, UserFactory

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def leases_in(state_dir) -> list[str]:
    try:
        return sorted(lease["gpu_uuid"] for lease in json.loads((state_dir / "leases.json").read_text())["leases"])
    except (OSError, ValueError):
        return []


def test_leases_follow_the_reservation_across_a_host_failure(worker_env, tmp_path, request):
    worker_env.update(HOST_SILENCE_TIMEOUT_SECONDS="3", HOST_SILENCE_CHECK_SECONDS="1", AGENT_HEARTBEAT_SECONDS="0.5")
    celery = request.getfixturevalue("celery_worker_process")
    portal = request.getfixturevalue("asgi_server")
    staff = UserFactory(username="root", is_staff=True)
    cluster = ClusterFactory(slug="lab")
    agents, lease_files = {}, {}
    for host in ("sim-01", "sim-02"):
        _, key = inventory_services.host_token_create(actor=staff, cluster=cluster, host_name=host)
        lease_files[host] = tmp_path / f"{host}-state"
        agents[host] = subprocess.Popen(
            [sys.executable, "-m", "agent", "--portal", portal, f"--token={key}", "--simulate", "2xH100",
             "--hostname", host, "--heartbeat", "0.5", "--telemetry-interval", "0",
             "--state-dir", str(lease_files[host])],
            cwd=BASE_DIR, stdout=open(tmp_path / f"{host}.log", "wb"), stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: Node.objects.filter(cluster=cluster).count() == 2, message="both hosts register")
        pool = GpuPool.objects.filter(gpus__node__cluster=cluster).distinct().get()  # one pool per cluster and model
        team = TeamFactory(slug="ml")
        member = UserFactory(username="member")
        MembershipFactory(user=member, team=team)
        QuotaFactory(team=team, pool=pool, max_ge=4)

        reservation = reservation_create(actor=member, request=ReservationRequest(
            team=team.slug, pool=pool.slug, gpus=2, ends_at=timezone.now() + timedelta(hours=1)))
        first = reservation.allocations.get(gpu__index=0).gpu.node.name
        other = "sim-02" if first == "sim-01" else "sim-01"
        uuids = sorted(reservation.allocations.values_list("gpu__uuid", flat=True))
        wait_for(lambda: Reservation.objects.get(pk=reservation.pk).state == "active", timeout=30,
                 message="active once the host's agent confirms its leases")
        assert leases_in(lease_files[first]) == uuids and leases_in(lease_files[other]) == []
        launcher = subprocess.run([sys.executable, "-m", "agent.leases", "--team", "ml", "--state-dir",
                                   str(lease_files[first])], cwd=BASE_DIR, capture_output=True, text=True)
        assert launcher.stdout.strip() == f"CUDA_VISIBLE_DEVICES={','.join(uuids)}"
        env_file = (lease_files[first] / f"reservation-{reservation.pk}.env").read_text()
        assert f"CUDA_VISIBLE_DEVICES={','.join(uuids)}\n" in env_file and "GPUPOOL_USER=member\n" in env_file

        agents[first].send_signal(signal.SIGKILL)  # the host dies without a word
        agents[first].wait(timeout=10)
        wait_for(lambda: not Node.objects.get(name=first).healthy, timeout=30, message="the host is marked silent")
        wait_for(lambda: set(Reservation.objects.get(pk=reservation.pk).allocations
                             .filter(ends_at__gt=timezone.now()).values_list("gpu__node__name", flat=True))
                 == {other}, timeout=30, message="failover moves the reservation to the other host")
        wait_for(lambda: Reservation.objects.get(pk=reservation.pk).state == "active", timeout=30,
                 message="active again once the other agent holds the leases")
        moved = sorted(Reservation.objects.get(pk=reservation.pk).allocations.filter(ends_at__gt=timezone.now())
                       .values_list("gpu__uuid", flat=True))
        assert leases_in(lease_files[other]) == moved
        reasons = list(Reservation.objects.get(pk=reservation.pk).events.values_list("reason", flat=True))
        # The reason names the cause when the signal got there first, else the sweep says the node is unhealthy.
        assert any(f"Moved from {first} to {other}: " in r for r in reasons), reasons

        from allocations.services import reservation_release

        reservation_release(actor=member, reservation_id=reservation.pk)
        wait_for(lambda: Reservation.objects.get(pk=reservation.pk).state == "released", timeout=30,
                 message="released once the agent dropped the leases")
        assert leases_in(lease_files[other]) == []
        assert not list(lease_files[other].glob("reservation-*.env"))
    finally:
        for process in agents.values():
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=10)
    assert "Traceback" not in celery.log_path.read_text()
    for host in agents:  # the leases came over the WebSocket lease channel, not the HTTP fallback
        assert "lease channel open" in (tmp_path / f"{host}.log").read_text()
