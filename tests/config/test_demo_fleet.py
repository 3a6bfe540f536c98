"""The embedded demo behaves like a fleet: its simulated hosts run jobs on the GPUs people booked and leave
the others idle, so the idle-booking alert does not fire at once and no unbooked GPU looks busy."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model

from agent.simulated import idle_on_purpose
from allocations import services
from allocations.models import Allocation, Reservation
from config.demo import load_demo
from config.demo_agents import start_demo_agents
from inventory.models import Gpu
from monitoring import hot
from monitoring.alerts import alerts_evaluate
from monitoring.models import Alert, AlertRule, Metric
from tests.config.test_demo_agents import _stop
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_booked_demo_gpus_run_jobs_and_no_idle_alert_fires_at_once(live_server, celery_worker_process, settings):
    settings.AGENT_HEARTBEAT_SECONDS = 1  # the agents poll their leases every second
    load_demo(admin_password="demo-admin-password")
    users = get_user_model().objects.in_bulk(["bob", "carol"], field_name="username")
    bookings = [services.reservation_create(actor=users[user], request=services.ReservationRequest(
        team=team, pool="h100", gpus=gpus, duration=timedelta(hours=2))) for user, team, gpus in
        (("bob", "vision", 3), ("carol", "nlp", 4), ("bob", "vision", 2))]
    booked = dict(Allocation.objects.values_list("gpu_id", "reservation_id"))
    h100 = set(Gpu.objects.filter(pool__slug="h100").values_list("id", flat=True))
    agents = start_demo_agents(live_server.url)
    try:
        wait_for(lambda: Reservation.objects.filter(state="active").count() == len(bookings), timeout=120,
                 message="the bookings to go active on the simulated hosts")

        def latest():
            found = hot.latest_get((g.pk, g.node_id) for g in Gpu.objects.filter(pk__in=h100))
            return found if set(found) == h100 else None

        def running(found) -> bool:
            return all(bool(found[gpu].processes) != idle_on_purpose({"reservation": reservation})
                       for gpu, reservation in booked.items())

        found = wait_for(lambda: (f := latest()) and running(f) and f, timeout=60,
                         message="a job on every booked GPU (bar the bookings idle on purpose)")
        # The default "GPU allocated but idle" rule (a data migration; an earlier transactional test may have
        # flushed it), made to fire at once: any booked GPU reading idle now would open an alert.
        rule, _ = AlertRule.objects.update_or_create(
            metric=Metric.GPU_IDLE_ALLOCATED, scope="gpu",
            defaults={"name": "GPU allocated but idle", "comparison": "<=",
                      "threshold": settings.TELEMETRY_IDLE_UTIL_PCT, "for_seconds": 0})
        alerts_evaluate()
        alerts_evaluate()
    finally:
        _stop(agents)
    idle_on_purpose_gpus = {f"gpu:{gpu}" for gpu, reservation in booked.items()
                            if idle_on_purpose({"reservation": reservation})}
    opened = {a.subject.split(":team:")[0] for a in Alert.objects.filter(rule=rule, state__in=Alert.OPEN_STATES)}
    assert opened == idle_on_purpose_gpus
    assert all(found[gpu].util > settings.TELEMETRY_IDLE_UTIL_PCT for gpu, reservation in booked.items()
               if not idle_on_purpose({"reservation": reservation}))
    # Unbooked GPUs sit idle: at most a rare stray process nobody booked.
    busy_unbooked = [gpu for gpu in h100 - set(booked) if found[gpu].util > settings.TELEMETRY_IDLE_UTIL_PCT]
    assert len(busy_unbooked) <= 1
