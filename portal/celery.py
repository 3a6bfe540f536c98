"""The Celery app: worker and beat for apply/release, the reservation sweep, and later reconcile."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_finalize.connect
def _schedule_periodic_tasks(sender: Celery, **_: object) -> None:
    from django.conf import settings

    sender.add_periodic_task(
        settings.RESERVATION_SWEEP_SECONDS,
        sender.signature("allocations.tasks.sweep_reservations"),
        name="sweep reservations",
    )
    sender.add_periodic_task(
        settings.HOST_SILENCE_CHECK_SECONDS,
        sender.signature("inventory.tasks.mark_silent_hosts"),
        name="mark silent hosts",
    )
    sender.add_periodic_task(
        settings.CLUSTER_DISCOVERY_SECONDS,
        sender.signature("inventory.tasks.discover_clusters"),
        name="discover Kubernetes clusters",
    )
    sender.add_periodic_task(
        settings.RECONCILE_SECONDS,
        sender.signature("allocations.tasks.reconcile_clusters"),
        name="reconcile clusters",
    )
    sender.add_periodic_task(
        settings.TELEMETRY_ROLLUP_SECONDS,
        sender.signature("monitoring.tasks.rollup_telemetry"),
        name="roll up and prune telemetry",
    )
    sender.add_periodic_task(
        settings.ALERT_EVALUATE_SECONDS,
        sender.signature("monitoring.tasks.evaluate_alerts"),
        name="evaluate alert rules",
    )
