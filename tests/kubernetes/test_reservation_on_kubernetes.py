"""A reservation's whole life on a real API server: discovered GPUs, apply job, quota, drift repaired,
release, and failover when the node goes NotReady."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from allocations import tasks
from allocations.apply import jobs
from allocations.apply.backends import kubernetes_manifests as m
from allocations.apply.desired import team_namespace
from allocations.models import ApplyJob, Reservation
from allocations.services import ReservationRequest, reservation_create, reservation_release
from inventory.kubernetes.discovery import discover_cluster
from inventory.kubernetes.nodes import parse_quantity
from inventory.models import GpuPool, Node
from tests.factories import MembershipFactory, QuotaFactory, TeamFactory, UserFactory
from tests.kubernetes.conftest import make_gpu_node, set_ready, unique

State = Reservation.State


def run_open_jobs() -> list[str]:
    return [jobs.job_run(job_id=pk) for pk in ApplyJob.objects.filter(status=ApplyJob.Status.QUEUED)
            .order_by("pk").values_list("pk", flat=True)]


def gpu_quota(core, namespace: str) -> int:
    quota = core.read_namespaced_resource_quota(m.QUOTA_NAME, namespace)
    return int(parse_quantity(quota.spec.hard["requests.nvidia.com/gpu"]))


@pytest.fixture
def booked(kube_cluster, core):
    """Two discovered 4-GPU nodes, a team with a quota on their pool, and a running 2-GPU reservation."""
    names = [unique("gpu-node"), unique("gpu-node")]
    for name in names:
        make_gpu_node(core, name, gpus=4)
    discover_cluster(kube_cluster)
    pool = GpuPool.objects.filter(gpus__node__cluster=kube_cluster).distinct().get()
    team = TeamFactory(slug=unique("vision"))
    member = UserFactory(username=unique("member"))
    MembershipFactory(user=member, team=team)
    QuotaFactory(team=team, pool=pool, max_ge=4)
    reservation = reservation_create(actor=member, request=ReservationRequest(
        team=team.slug, pool=pool.slug, gpus=2, ends_at=timezone.now() + timedelta(hours=1)))
    from allocations.services import reservation_activate

    assert reservation_activate(reservation_id=reservation.pk)
    return reservation, member, team_namespace(team.slug), names


def test_a_reservation_is_applied_as_a_quota_and_undone_at_release(booked, core):
    reservation, member, namespace, _ = booked
    assert run_open_jobs() == ["succeeded"]
    reservation.refresh_from_db()
    assert reservation.state == State.ACTIVE
    assert gpu_quota(core, namespace) == 2
    job = reservation.apply_jobs.get()
    assert job.backend == "kubernetes" and any("ResourceQuota" in change for change in job.changes)

    reservation_release(actor=member, reservation_id=reservation.pk)
    assert run_open_jobs() == ["succeeded"]
    assert Reservation.objects.get(pk=reservation.pk).state == State.RELEASED
    assert gpu_quota(core, namespace) == 0  # the namespace stays; the team just holds nothing there


def test_reconcile_puts_back_a_quota_someone_deleted(booked, core, kube_cluster):
    reservation, _, namespace, _ = booked
    run_open_jobs()
    core.delete_namespaced_resource_quota(m.QUOTA_NAME, namespace)
    results = tasks.reconcile_clusters()
    mine = next(r for r in results if r["cluster"] == kube_cluster.slug)
    assert mine["repaired"], mine
    assert gpu_quota(core, namespace) == 2
    assert ApplyJob.objects.filter(cluster=kube_cluster, action="reconcile", status="succeeded").exists()
    # A second reconcile finds nothing to repair and leaves no row.
    again = next(r for r in tasks.reconcile_clusters() if r["cluster"] == kube_cluster.slug)
    assert again["repaired"] == []


def test_a_not_ready_node_moves_the_reservation_to_the_other_node(booked, core, kube_cluster,
                                                                  django_capture_on_commit_callbacks, monkeypatch):
    reservation, _, namespace, names = booked
    run_open_jobs()
    monkeypatch.setattr(tasks.failover_node, "delay", lambda node_id, reason="": tasks.failover_node(node_id, reason))
    first = reservation.allocations.first().gpu.node.name
    set_ready(core, first, False)
    with django_capture_on_commit_callbacks(execute=True):
        discover_cluster(kube_cluster)  # NotReady → unhealthy → signal → failover
    assert not Node.objects.get(cluster=kube_cluster, name=first).healthy
    reservation.refresh_from_db()
    assert reservation.state == State.APPLYING and f"Moved from {first}" in reservation.reason
    now = set(reservation.allocations.filter(ends_at__gt=timezone.now()).values_list("gpu__node__name", flat=True))
    assert now == {n for n in names if n != first}
    assert "succeeded" in run_open_jobs()
    assert Reservation.objects.get(pk=reservation.pk).state == State.ACTIVE
    assert gpu_quota(core, namespace) == 2
