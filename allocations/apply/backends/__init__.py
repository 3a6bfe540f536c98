"""Backends by cluster kind. Each one makes a cluster match a :class:`ClusterDesired`."""
from __future__ import annotations

from allocations.apply.backends.base import ApplyBackend, BackendError, BackendPending, BackendRejected, SyncReport

__all__ = ["ApplyBackend", "BackendError", "BackendPending", "BackendRejected", "SyncReport", "backend_for",
           "backend_name"]


def backend_name(cluster) -> str:  # cluster: inventory.models.Cluster
    """Which backend applies to `cluster`: "kubernetes", or "agent" for bare-metal hosts."""
    return "kubernetes" if cluster.kind == "kubernetes" else "agent"


def backend_for(cluster) -> ApplyBackend:
    """The backend that applies to `cluster` (imported lazily: the Kubernetes client is heavy)."""
    if backend_name(cluster) == "kubernetes":
        from django.conf import settings

        from allocations.apply.backends.kubernetes import KubernetesBackend

        return KubernetesBackend(cluster, system_namespace=settings.KUBE_SYSTEM_NAMESPACE)
    from allocations.apply.backends.agent import AgentBackend

    return AgentBackend(cluster)
