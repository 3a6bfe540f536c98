"""The lifecycle's reconcile (allocations.apply.jobs) driving the Kubernetes backend on the real API server."""
from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from allocations.apply import jobs
from allocations.apply.backends import backend_for
from allocations.apply.backends.kubernetes import KubernetesBackend
from allocations.models import Allocation, ApplyJob, Reservation
from tests.factories import PoolFactory, QuotaFactory, TeamFactory, add_node
from tests.kubernetes.conftest import unique


def test_reconcile_puts_back_a_deleted_quota_from_the_database_state(kube_cluster, core):
    assert isinstance(backend_for(kube_cluster), KubernetesBackend)
    team = TeamFactory(slug=unique("recon"))
    pool = PoolFactory(slug=unique("recon-pool"))
    node = add_node(pool, unique("node-r"), 4, cluster=kube_cluster)
    QuotaFactory(team=team, pool=pool, max_gpus=4)
    now = timezone.now()
    reservation = Reservation.objects.create(team=team, pool=pool, gpus=2, starts_at=now - timedelta(minutes=1),
                                             ends_at=now + timedelta(hours=1), state=Reservation.State.ACTIVE)
    for gpu in node.gpus.order_by("index")[:2]:
        Allocation.objects.create(reservation=reservation, gpu=gpu, starts_at=reservation.starts_at,
                                  ends_at=reservation.ends_at)
    namespace = f"gpupool-{team.slug}"

    first = jobs.cluster_reconcile(cluster_id=kube_cluster.pk)
    assert f"created ResourceQuota {namespace}/gpupool with requests.nvidia.com/gpu=2" in first["repaired"]
    core.delete_namespaced_resource_quota("gpupool", namespace)
    again = jobs.cluster_reconcile(cluster_id=kube_cluster.pk)
    assert again["repaired"] == [f"created ResourceQuota {namespace}/gpupool with requests.nvidia.com/gpu=2"]
    assert core.read_namespaced_resource_quota("gpupool", namespace).spec.hard == {"requests.nvidia.com/gpu": "2"}
    job = ApplyJob.objects.filter(cluster=kube_cluster, action=ApplyJob.Action.RECONCILE).first()
    assert job.status == ApplyJob.Status.SUCCEEDED and job.changes == again["repaired"]

    quiet = jobs.cluster_reconcile(cluster_id=kube_cluster.pk)
    assert quiet["repaired"] == []
    assert ApplyJob.objects.filter(cluster=kube_cluster, action=ApplyJob.Action.RECONCILE).count() == 2
