"""Celery tasks: thin wrappers that take ids and call one service. All are safe to run twice."""
from __future__ import annotations

import logging

from celery import shared_task

from allocations import failover, queue, services
from allocations.apply import jobs
from inventory.models import Cluster

log = logging.getLogger(__name__)


@shared_task(name="allocations.tasks.activate_reservation")
def activate_reservation(reservation_id: int) -> bool:
    return services.reservation_activate(reservation_id=reservation_id)


@shared_task(name="allocations.tasks.run_queue")
def run_queue(pool_id: int) -> dict[str, int]:
    return queue.queue_pass(pool_id=pool_id)


@shared_task(name="allocations.tasks.run_queues")
def run_queues() -> dict[int, dict[str, int]]:
    """The backstop (beat, every QUEUE_PASS_SECONDS): a pass over every pool where requests wait or a reclaim
    notice stands."""
    done = {}
    for pool_id in queue.pools_to_pass_ids():
        try:
            done[pool_id] = queue.queue_pass(pool_id=pool_id)
        except Exception:  # one broken pool must not stop the others
            log.exception("queue pass of pool %s failed", pool_id)
    return done


@shared_task(name="allocations.tasks.run_apply_job")
def run_apply_job(job_id: int) -> str:
    return jobs.job_run(job_id=job_id)


@shared_task(name="allocations.tasks.reconcile_clusters")
def reconcile_clusters() -> list[dict]:
    """Compare every cluster with the database and repair drift (beat, every RECONCILE_SECONDS)."""
    results = []
    for cluster_id in Cluster.objects.order_by("pk").values_list("pk", flat=True):
        try:
            results.append(jobs.cluster_reconcile(cluster_id=cluster_id))
        except Exception:  # one broken cluster must not stop the others
            log.exception("reconcile of cluster %s failed", cluster_id)
    return results


@shared_task(name="allocations.tasks.failover_node")
def failover_node(node_id: int, reason: str = "") -> dict:
    return failover.node_failover(node_id=node_id, reason=reason)


@shared_task(name="allocations.tasks.sweep_reservations")
def sweep_reservations() -> dict[str, int]:
    """Move every time-driven state the database says is due, and re-drive apply jobs whose
    message was lost. Tasks are nudges; this is the guarantee."""
    steps = {
        "activate": services.reservation_activate,
        "expire": services.reservation_expire,
        "undo_again": services.reservation_undo_again,
        "warn_expiry": services.reservation_warn_expiry,
        "preempt": services.reservation_preempt,
    }
    done = {name: 0 for name in steps}
    for name, ids in services.due_reservation_ids().items():
        for reservation_id in ids:
            try:
                done[name] += int(steps[name](reservation_id=reservation_id))
            except Exception:  # one broken row must not stop the sweep for the others
                log.exception("sweep: %s of reservation %s failed", name, reservation_id)
    done["apply_jobs"] = 0
    for job_id in jobs.jobs_due_ids():
        try:
            done["apply_jobs"] += int(bool(jobs.job_run(job_id=job_id)))
        except Exception:
            log.exception("sweep: apply job %s failed", job_id)
    done["failover"] = 0
    for node_id in failover.unhealthy_nodes_holding_ids():
        try:
            done["failover"] += int(bool(failover.node_failover(node_id=node_id)["moved"]))
        except Exception:
            log.exception("sweep: failover of node %s failed", node_id)
    return done
