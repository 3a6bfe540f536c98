"""The API answers what its OpenAPI schema says: schemathesis generates requests for every operation of
/api/v1/schema/ (served by the app itself, in-process through WSGI) and checks that no answer is a 500
and that every answer's status and body are declared in the schema.

A bounded budget (derandomized, a few examples per operation) so that `make test` stays fast; the
generated cases are the same on every run, so a failure here is reproducible.
"""
from __future__ import annotations

from datetime import timedelta

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.utils import timezone
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from allocations.models import ApplyJob, Quota, Reservation
from inventory import services as inventory_services
from inventory.models import HostToken, Node
from monitoring.models import Alert, AlertRule, Silence
from teams.services import api_token_create

pytestmark = pytest.mark.django_db

# The budget, measured at ~60 s for the whole API on a shared 2-core machine (6,400 requests before it was
# cut to 3,700): each operation gets schemathesis' coverage phase (boundary and invalid values of every
# parameter and body field, where 500s hide), its examples and 8 fuzzed cases. PUT and PATCH skip the
# coverage phase: they validate their bodies with the same serializers as the collection's POST, which
# has it, and they were 45% of the requests.
CONFIG = SchemathesisConfig.from_dict({
    "seed": 15,
    "operations": [{"include-method": ["PUT", "PATCH"], "phases": {"coverage": {"enabled": False}}}],
})
schema = schemathesis.openapi.from_wsgi("/api/v1/schema/?format=json", get_wsgi_application(), config=CONFIG)

CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]


@pytest.fixture
def connections_stay_open(fleet):
    """As Django's test client does (and undoes after each of its requests: hence after the fleet): the WSGI
    handler closes the database connection at the end of each request, which inside the test's
    transaction would lose the fleet."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


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
    rule = AlertRule.objects.order_by("pk").first()
    alert = Alert.objects.create(rule=rule, subject=f"node:{node.pk}", subject_label=node.name, node=node,
                                 pool=world.pool, value=90.0, active_since=timezone.now())
    silence = Silence.objects.create(rule=rule, created_by=None, starts_at=timezone.now(),
                                     ends_at=timezone.now() + timedelta(hours=1))
    return {
        "alert-rules": rule.pk, "alerts": alert.pk, "apply-jobs": job.pk, "clusters": node.cluster_id,
        "gpus": node.gpus.first().pk, "gpu-models": node.gpus.first().model_name, "host-tokens": host_token.pk, "nodes": node.pk, "pools": world.pool.slug,
        "quotas": Quota.objects.filter(team=world.team).first().pk, "reservations": reservation.pk,
        "silences": silence.pk, "teams": world.team.slug, "username": world.member.username,
        # Authorization headers: a staff token for the API (staff see and may do the most), a host's key for
        # the agent endpoints.
        "staff": f"Token {api_token_create(user=world.staff)[1]}", "host": f"Host {host_key}",
    }


@schema.parametrize()
@settings(max_examples=8, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_every_operation_answers_as_its_schema_says(case, fleet, connections_stay_open):
    collection = case.path.split("/")[3]  # /api/v1/<collection>/...
    # Every {id} and {slug} names the fleet's row, so the operation does its work; made-up ones would only
    # ever meet the 404 of the lookup.
    if case.path_parameters:
        case.path_parameters = {name: fleet["username" if name == "username" else collection]
                                for name in case.path_parameters}
    who = "host" if collection == "agent" else "staff"
    case.call_and_validate(headers={"Authorization": fleet[who]}, checks=CHECKS)

