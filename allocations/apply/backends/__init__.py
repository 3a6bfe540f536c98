"""Backends by cluster kind. Each one makes a cluster match a :class:`ClusterDesired`."""
from __future__ import annotations

from allocations.apply.backends.base import ApplyBackend, BackendError, BackendPending, BackendRejected, SyncReport

__all__ = ["ApplyBackend", "BackendError", "BackendPending", "BackendRejected", "SyncReport", "backend_for"]


def backend_for(cluster) -> ApplyBackend:  # cluster: inventory.models.Cluster
    """The backend that applies to `cluster` (imported lazily: the Kubernetes client is heavy)."""
    if cluster.kind == "kubernetes":
        from allocations.apply.backends.kubernetes import KubernetesBackend

        return KubernetesBackend(cluster)
    from allocations.apply.backends.agent import AgentBackend

    return AgentBackend(cluster)
