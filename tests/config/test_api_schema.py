"""The API answers what its OpenAPI schema says: schemathesis generates requests for every operation of
/api/v1/schema/ (served by the app itself, in-process through WSGI) and checks that no answer is a 500
and that every answer's status and body are declared in the schema.

A bounded budget (derandomized, a few examples per operation) so that `make test` stays fast; the
generated cases are the same on every run, so a failure here is reproducible.
"""
from __future__ import annotations

import os

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

pytestmark = pytest.mark.django_db

if os.environ.get("PYTEST_XDIST_WORKER"):
    # In an xdist worker schemathesis runs the first operation and none of the others, and passes: `make test`
    # runs this file in a process of its own after the workers (SERIAL_TESTS).
    pytest.fail("test_api_schema.py must run outside pytest-xdist workers (make test runs it apart)", pytrace=False)

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

