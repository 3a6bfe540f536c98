"""The lifecycle's reconcile (allocations.apply.jobs) driving the Kubernetes backend on the real API server."""
from __future__ import annotations

from allocations.apply import jobs
from allocations.apply.backends import backend_for
from allocations.apply.backends.kubernetes import KubernetesBackend
from allocations.models import ApplyJob
from tests.kubernetes.conftest import active_reservation


def test_reconcile_puts_back_a_deleted_quota_from_the_database_state(kube_cluster, core):
    assert isinstance(backend_for(kube_cluster), KubernetesBackend)
    team, reservation, namespace = active_reservation(kube_cluster, "recon")

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
