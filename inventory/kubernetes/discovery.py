"""Discovery: list a cluster's nodes and make the inventory match (Node and Gpu rows, pools, health).

The API is read outside any database transaction; the rows are then written in one
(:func:`inventory.services.cluster_apply_discovery`). A failure is recorded on the cluster
(``discovery_error``) and raised as :class:`~inventory.kubernetes.client.ClusterError`.
"""
from __future__ import annotations

import json
import logging
from typing import Any

from kubernetes import client as k8s

from inventory import services
from inventory.kubernetes.client import ClusterError, call, connect
from inventory.kubernetes.nodes import DiscoveredNode, parse_node
from inventory.models import Cluster

log = logging.getLogger(__name__)

PAGE_SIZE = 500


def list_nodes(api: k8s.ApiClient) -> list[dict[str, Any]]:
    """Every Node as the API's JSON (raw: cheaper than the client's model objects), paging through."""
    core = k8s.CoreV1Api(api)
    items: list[dict[str, Any]] = []
    token = None
    while True:
        kwargs: dict[str, Any] = {"limit": PAGE_SIZE, "_preload_content": False}
        if token:
            kwargs["_continue"] = token
        response = call(core.list_node, **kwargs)
        try:
            page = json.loads(response.data)
        except ValueError as exc:
            raise ClusterError("the API server sent a node list that is not JSON", kind="server",
                               retryable=True) from exc
        items.extend(page.get("items") or [])
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items


def fetch_nodes(cluster: Cluster) -> list[DiscoveredNode]:
    with connect(cluster) as api:
        raw = list_nodes(api)
    # The cluster's id (not its slug, which staff may change) seeds the made-up GPU ids.
    return [parse_node(node, cluster_key=f"cluster-{cluster.pk}") for node in raw]


def discover_cluster(cluster: Cluster) -> services.DiscoveryReport:
    """Discover one cluster now. Raises ClusterError (recorded on the cluster) when it cannot be read."""
    try:
        nodes = fetch_nodes(cluster)
    except ClusterError as exc:
        services.cluster_record_discovery_error(cluster=cluster, error=exc.message)
        raise
    return services.cluster_apply_discovery(cluster=cluster, nodes=nodes)
