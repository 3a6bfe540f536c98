"""The Celery app: worker and beat for applying reservations, the sweep, discovery, reconcile, telemetry and alerts."""
import gc
import os

from celery import Celery
from celery.signals import worker_ready

from config.broker import report_a_detached_redis_channel_as_a_connection_error

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
report_a_detached_redis_channel_as_a_connection_error()


# Periodic work beat schedules: (the setting that holds its period in seconds, task, name).
PERIODIC_TASKS = (
    ("RESERVATION_SWEEP_SECONDS", "allocations.tasks.sweep_reservations", "sweep reservations"),
    ("HOST_SILENCE_CHECK_SECONDS", "inventory.tasks.mark_silent_hosts", "mark silent hosts"),
    ("CLUSTER_DISCOVERY_SECONDS", "inventory.tasks.discover_clusters", "discover Kubernetes clusters"),
    ("QUEUE_PASS_SECONDS", "allocations.tasks.run_queues", "run the pools' queues"),
    ("RECONCILE_SECONDS", "allocations.tasks.reconcile_clusters", "reconcile clusters"),
    ("TELEMETRY_ROLLUP_SECONDS", "monitoring.tasks.rollup_telemetry", "roll up and prune telemetry"),
    ("ALERT_EVALUATE_SECONDS", "monitoring.tasks.evaluate_alerts", "evaluate alert rules"),
    ("IDLE_RECLAIM_SWEEP_SECONDS", "monitoring.tasks.reclaim_idle", "warn and release idle reservations"),
    ("TELEMETRY_K8S_TICK_SECONDS", "monitoring.tasks.read_kubernetes_telemetry", "read Kubernetes GPU telemetry"),
    ("NOTIFY_SWEEP_SECONDS", "teams.tasks.deliveries_due", "send due notifications"),
    ("USAGE_CLOSE_SECONDS", "accounting.tasks.close_usage_hours", "close finished hours into the usage ledger"),
    ("AUDIT_RETENTION_CHECK_SECONDS", "audit.tasks.delete_expired_audit_entries", "delete expired audit entries"),
)


@app.on_after_finalize.connect
def _schedule_periodic_tasks(sender: Celery, **_: object) -> None:
    from django.conf import settings

    for setting, task, name in PERIODIC_TASKS:
        sender.add_periodic_task(getattr(settings, setting), sender.signature(task), name=name)


@worker_ready.connect
def freeze_what_is_loaded(**_: object) -> None:
    """Once the worker is up, move everything loaded so far (Django, the task modules, NumPy, the Kubernetes
    client: ~179,000 objects with the task modules imported, which live as long as the process) out of the
    garbage collector's sight, as the web process does (config/wsgi.py). Without it every full collection
    scanned them all: in the queue benchmark about one pass over 1,000 waiting requests in seven took 60-100 ms
    longer (python -m benchmarks.queue, the 7th of 9 passes at 240-327 ms against ~150-180), which runs with the
    freeze beside them did not show."""
    gc.collect()
    gc.freeze()
