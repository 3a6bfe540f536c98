"""Periodic telemetry work: rollups and pruning, alert evaluation, and reading Kubernetes clusters' GPU
telemetry (beat schedules them)."""
from __future__ import annotations

from celery import shared_task

from monitoring.alerts import alerts_evaluate
from monitoring.rollup import telemetry_rollup


@shared_task(name="monitoring.tasks.rollup_telemetry")
def rollup_telemetry() -> dict:
    return telemetry_rollup()


@shared_task(name="monitoring.tasks.evaluate_alerts")
def evaluate_alerts() -> dict:
    return alerts_evaluate()


@shared_task(name="monitoring.tasks.read_kubernetes_telemetry", ignore_result=True)
def read_kubernetes_telemetry() -> list[int]:
    """Claim the clusters due a read and read each in its own task (a slow cluster delays no other)."""
    from monitoring.kubernetes import clusters_due

    due = clusters_due()
    for cluster_id in due:
        read_cluster_telemetry.delay(cluster_id)
    return due


@shared_task(name="monitoring.tasks.read_cluster_telemetry", ignore_result=True)
def read_cluster_telemetry(cluster_id: int) -> None:
    from inventory.models import Cluster
    from monitoring.kubernetes import cluster_telemetry_read

    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is not None:
        cluster_telemetry_read(cluster=cluster)


@shared_task(name="monitoring.tasks.reclaim_idle")
def reclaim_idle() -> dict:
    """Warn, then release, idle reservations in the pools that opted in (monitoring.idle)."""
    from monitoring.idle import idle_reclaim_sweep

    return idle_reclaim_sweep()
