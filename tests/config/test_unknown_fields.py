"""Every write of the API refuses a body naming a field it does not have (400, rule `unknown_field`, naming
the field), so a misspelt field is never a successful no-op. Walks the OpenAPI schema, so an endpoint added
later is covered without anyone remembering to list it here."""
from __future__ import annotations

import pytest
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

BOGUS = "bogus_field_xyz"

# The agent's bodies are forward-compatible by design, not an oversight: agents are installed on the hosts
# apart from the portal and upgraded on their own schedule, and a newer agent sends keys an older portal
# does not know yet (registration sends each GpuInfo whole; telemetry is decoded by msgspec, which ignores
# unknown keys, so fields such as a process's `user` could be added without breaking anyone). Refusing them
# would stop every host whose agent is newer than its portal.
FORWARD_COMPATIBLE = {
    ("/api/v1/agent/register/", "post"),
    ("/api/v1/agent/leases/", "post"),
    ("/api/v1/agent/telemetry/", "post"),
}


def _json_writes() -> list[tuple[str, str]]:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return sorted((path, method) for path, operations in schema["paths"].items()
                  for method, operation in operations.items()
                  if method in ("post", "put", "patch")
                  and "application/json" in operation.get("requestBody", {}).get("content", {}))


WRITES = _json_writes()


def test_the_walk_finds_the_writes():
    # Guards the walk itself: were the schema's bodies not found, the test below would check nothing.
    assert len(WRITES) > 20
    assert FORWARD_COMPATIBLE <= set(WRITES)


@pytest.mark.parametrize(("path", "method"), [w for w in WRITES if w not in FORWARD_COMPATIBLE])
def test_every_write_refuses_an_unknown_field(path, method, fleet):
    collection = path.split("/")[3]
    url = path
    for name in ("{id}", "{slug}", "{name}", "{username}"):
        if name in url:  # the fleet's row of that collection (or its team's member)
            url = url.replace(name, str(fleet["username" if name == "{username}" else collection]))
    assert "{" not in url, f"a path parameter this test does not fill: {path}"
    client = APIClient()
    answer = getattr(client, method)(url, {BOGUS: 1}, format="json", HTTP_AUTHORIZATION=fleet["staff"])
    assert answer.status_code == 400, (method, url, answer.status_code, answer.content)
    errors = answer.json()["errors"]
    assert {"field": BOGUS, "rule": "unknown_field"} in [{"field": e["field"], "rule": e["rule"]} for e in errors], \
        (method, url, errors)
