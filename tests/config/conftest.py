"""Fixtures of the API-wide tests (the schema's conformance, unknown fields)."""
from __future__ import annotations

from datetime import date, timedelta

import pytest
from django.utils import timezone

from accounting.models import Price
from allocations.models import ApplyJob, PriorityClass, Quota, Reservation
from inventory import services as inventory_services
from inventory.models import HostToken, Node
from monitoring.models import Alert, Silence
from teams.models import GroupMapping
from teams.services import api_token_create, channel_create
from tests.factories import AlertRuleFactory


@pytest.fixture
def fleet(world, api) -> dict[str, object]:
    """The world plus one row of every kind the API serves, so operations on `{id}` and `{slug}` reach
    real rows: collection name → the lookup value of its row; "username" → a member of the team."""
    node = Node.objects.get(name="node-a")
    host_token, host_key = inventory_services.host_token_create(actor=world.staff, cluster=node.cluster,
                                                                host_name=node.name)
    booked = api(world.member).post("/api/v1/reservations/", {
        "pool": "a100", "team": "ml", "gpus": 2, "ends_at": (timezone.now() + timedelta(hours=2)).isoformat()})
    assert booked.status_code == 201, booked.content
    reservation = Reservation.objects.get(pk=booked.json()["id"])
    # Rows whose people are gone (SET_NULL) or were never there (the sweep acts as nobody): their
    # relations answer null.
    Reservation.objects.filter(pk=reservation.pk).update(requested_by=None)
    reservation.events.create(from_state="scheduled", to_state="scheduled", actor=None, reason="By the sweep.")
    HostToken.objects.filter(pk=host_token.pk).update(created_by=None)
    job = ApplyJob.objects.create(reservation=reservation, cluster=node.cluster, action=ApplyJob.Action.APPLY,
                                  backend="agent", target=node.name,
                                  deadline=timezone.now() + timedelta(minutes=10))
    rule = AlertRuleFactory()
    alert = Alert.objects.create(rule=rule, subject=f"node:{node.pk}", subject_label=node.name, node=node,
                                 pool=world.pool, value=90.0, active_since=timezone.now())
    silence = Silence.objects.create(rule=rule, created_by=None, starts_at=timezone.now(),
                                     ends_at=timezone.now() + timedelta(hours=1))
    priority = PriorityClass.objects.create(name="normal", value=50)
    mapping = GroupMapping.objects.create(group="gpu-ml", team=world.team)
    channel = channel_create(actor=world.staff, name="hook", kind="webhook", team=world.team,
                             url="https://example.com/hook", events=["alert.firing"])
    spare_token, _ = api_token_create(user=world.staff, name="one to revoke")
    price = Price.objects.create(gpu_model=node.gpus.first().model_name, price_per_ge_hour=1, currency="USD",
                                 valid_from=date(2099, 1, 1))
    return {
        "prices": price.pk,
        "priority-classes": priority.name, "tokens": spare_token.prefix, "group-mappings": mapping.pk,
        "notification-channels": channel.pk,
        "alert-rules": rule.pk, "alerts": alert.pk, "apply-jobs": job.pk, "clusters": node.cluster_id,
        "gpus": node.gpus.first().pk, "gpu-models": node.gpus.first().model_name, "host-tokens": host_token.pk, "nodes": node.pk, "pools": world.pool.slug,
        "quotas": Quota.objects.filter(team=world.team).first().pk, "reservations": reservation.pk,
        "silences": silence.pk, "teams": world.team.slug, "username": world.member.username,
        # Authorization headers: a staff token for the API (staff see and may do the most), a host's key for
        # the agent endpoints.
        "staff": f"Token {api_token_create(user=world.staff)[1]}", "host": f"Host {host_key}",
    }
