"""Periodic inventory upkeep."""
from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from inventory import services

log = logging.getLogger(__name__)


@shared_task(name="inventory.tasks.mark_silent_hosts")
def mark_silent_hosts() -> list[int]:
    ids = services.nodes_mark_silent(timeout=settings.HOST_SILENCE_TIMEOUT)
    if ids:
        log.warning("hosts %s stopped reporting; marked unhealthy", ids)
    return ids


@shared_task(name="inventory.tasks.discover_clusters")
def discover_clusters() -> dict[str, str]:
    """Discover every Kubernetes cluster that has credentials; one cluster's failure does not stop the rest."""
    from inventory.kubernetes.client import ClusterError
    from inventory.kubernetes.discovery import discover_cluster
    from inventory.models import Cluster

    outcome: dict[str, str] = {}
    clusters = Cluster.objects.filter(kind=Cluster.Kind.KUBERNETES).exclude(kubeconfig_encrypted="", in_cluster=False)
    for cluster in clusters:
        try:
            report = discover_cluster(cluster)
        except ClusterError as exc:
            log.warning("discovery of cluster %s failed: %s", cluster.slug, exc.message)
            outcome[cluster.slug] = f"failed: {exc.message}"
            continue
        for change in report.changes:
            log.info("cluster %s: %s", cluster.slug, change)
        outcome[cluster.slug] = f"{report.nodes} nodes, {report.gpus} GPUs, {len(report.changes)} changes"
    return outcome
